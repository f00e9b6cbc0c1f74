"""The stdio front of `conclave serve`: it answers the MCP handshake while the server is still loading.

Importing FastMCP, the job machinery and their dependencies takes about a second on a small machine,
and Codex builds a step's tool list after waiting 1 s for an optional MCP server
(`mcp_optional_startup_grace_ms`). So `conclave serve` starts here, on the standard library alone:

    client stdin  -> front (answers from manifest.json, or passes on) -> pipe -> fd 0 of the app
    client stdout <- front (its own answers, then all the app writes)  <- pipe <- fd 1 of the app

Until the app is loaded, the front answers `initialize`, `ping` and the list methods from
`manifest.json`, a recording of the real app's answers (`python -m conclave.app.manifest` writes it
again whenever the app's answers change). Everything else waits in
the pipe, in order. The client's `initialize` goes on to the app too, so the app's session knows the
client and its protocol version; the app's own answer to it is the one line the front drops. Once the
app is loaded, every message goes to it. The app itself runs unchanged on FastMCP's stdio transport.

The front never claims more than is true. Its answer to `initialize` waits until the app has opened
its settings and the store (`Startup.opened`); if that fails, `initialize` (and every request after
it) is answered with an error that gives the reason, and the process exits 1 once the client has
read it (`Startup.failed`). An error the app itself sends for that `initialize` reaches the client.
The manifest is keyed on the versions of Conclave and its libraries and a hash of Conclave's own
source files (app/manifest_key.py), so an editable install whose tools changed is never answered from a
stale recording. A JSON-RPC batch (a line starting `[`) is relayed like any message. A bug in the
front is reported on stderr and the front steps aside; the client's messages still reach the app.

A client that opens in the stateless 2026 era (a request whose `_meta` carries the protocol version),
a manifest written for another version of Conclave or its libraries, or `--no-front` skip the quick
answers; the pipes then carry everything to the app.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from conclave.app.manifest_key import load_manifest

ENVELOPE_KEY = "io.modelcontextprotocol/protocolVersion"  # only 2026-era requests carry it in _meta
READ_SIZE = 65536
FAIL_LINGER_S = 30.0  # after a failed start, how long the front waits for the client to read why
STARTUP_FAILED = -32002  # JSON-RPC server error: the server could not start


class Front:
    """Decides, message by message, what the front answers itself; pure apart from its callbacks.

    `reply(obj)` writes a message to the client; `forward(line)` passes a raw line on to the app.
    Without a manifest it answers nothing itself, but still answers a failed start (`failed`).
    """

    def __init__(
        self,
        manifest: dict[str, Any] | None,
        reply: Callable[[dict[str, Any]], None],
        forward: Callable[[bytes], None],
    ) -> None:
        self._manifest, self._reply, self._forward = manifest, reply, forward
        self._lock = threading.Lock()
        self._answering = manifest is not None
        self._session: dict[str, Any] | None = None  # the recorded answers for the agreed version
        self._dropped_id: object = None  # the id of the initialize both the front and the app answer
        self._drop_pending = False
        self._opened = False  # the app has its settings and the store: the front may say it is ready
        self._held: list[dict[str, Any]] = []  # the initialize answer, and those after it, until `opened`
        self._waiting: list[object] = []  # ids of requests passed on before the app serves
        self._serving = False
        self.failure: str | None = None

    def opened(self) -> None:
        """The app's settings and store are open: answer the initialize held until now."""
        with self._lock:
            self._opened = True
            held, self._held = self._held, []
        for answer in held:
            self._reply(answer)

    def failed(self, reason: str) -> None:
        """The app could not start: every request still waiting, and every later one, gets `reason`."""
        with self._lock:
            self.failure, self._answering, self._held = reason, False, []
            waiting, self._waiting = self._waiting, []
        for key in waiting:
            self._reply(_failure(key, reason))

    def stop_answering(self) -> None:
        """From now on every message goes to the app (it is loaded)."""
        self.opened()
        with self._lock:
            self._answering, self._serving, self._waiting = False, True, []

    def take(self, line: bytes) -> None:
        """Handle one line from the client."""
        with self._lock:
            if self.failure is not None:
                key = _request_id(line)
                refused = None if key is None else _failure(key, self.failure)
                answer: tuple[dict[str, Any] | None, bool] | None = (refused, False)
            else:
                answer = self._answer(line) if self._answering else None
                if (
                    (answer is None or answer[1])
                    and not self._serving
                    and (key := _request_id(line)) is not None
                ):
                    self._waiting.append(key)  # the app answers it, unless it fails to start
        if answer is None or answer[1]:
            self._forward(line)
        if answer is not None and answer[0] is not None:
            self._reply(answer[0])

    def drop(self, line: bytes) -> bool:
        """Whether a line from the app is its answer to the initialize the front already answered
        (a result; an error from the app reaches the client)."""
        if not self._drop_pending:
            return False
        message = _parse(line)
        if message is None or "method" in message or message.get("id") != self._dropped_id:
            return False
        self._drop_pending = False
        return "error" not in message

    def _answer(self, line: bytes) -> tuple[dict[str, Any] | None, bool] | None:
        """(the reply now, or None when it waits; whether the app must see the message too), or None to
        leave the message to the app."""
        message = _parse(line)
        if message is None or "id" not in message or not isinstance(message.get("method"), str):
            return None  # notifications, responses, batches and anything odd go to the app
        method, params, key = message["method"], message.get("params"), message["id"]
        if params is not None and not isinstance(params, dict):
            return None
        meta = (params or {}).get("_meta")
        if isinstance(meta, dict) and ENVELOPE_KEY in meta:
            self._answering = False  # a 2026-era client: the app serves it from the first message
            return None
        if method == "ping":
            return _result(key, {}), False
        if method == "initialize":
            session = None if self._session is not None else self._agreed(params or {})
            if session is None:
                self._answering = False  # a second initialize, or a malformed one: the app answers
                return None
            self._session, self._dropped_id, self._drop_pending = session, key, True
            answer = _result(key, {"protocolVersion": session["version"], **session["initialize"]})
            if self._opened:
                return answer, True
            self._held = [answer]  # ready only once the app's settings and store are open
            return None, True
        recorded = self._session["results"].get(method) if self._session is not None else None
        if recorded is not None and not (params or {}).get("cursor"):
            if self._held:  # after the initialize answer, in order
                self._held.append(_result(key, recorded))
                return None, False
            return _result(key, recorded), False
        return None

    def _agreed(self, params: dict[str, Any]) -> dict[str, Any] | None:
        """The recorded session for a well-formed initialize: the client's version if the app speaks it,
        else the app's latest (the rule of mcp's server runner)."""
        info = params.get("clientInfo")
        if not (
            isinstance(params.get("protocolVersion"), str)
            and isinstance(params.get("capabilities"), dict)
            and isinstance(info, dict)
            and isinstance(info.get("name"), str)
            and isinstance(info.get("version"), str)
        ):
            return None  # the app answers with the precise error
        manifest = self._manifest
        assert manifest is not None  # answering implies a manifest
        version = (
            params["protocolVersion"]
            if params["protocolVersion"] in manifest["protocols"]
            else manifest["latest"]
        )
        return {"version": version, **manifest["differs"].get(version, manifest)}


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) and message.get("jsonrpc") == "2.0" else None


def _request_id(line: bytes) -> object:
    """The id of a request the client waits on an answer to, else None."""
    message = _parse(line)
    if message is None or not isinstance(message.get("method"), str):
        return None
    return message.get("id")


def _result(key: object, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": key, "result": result}


def _failure(key: object, reason: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": key,
        "error": {"code": STARTUP_FAILED, "message": f"conclave could not start: {reason}"},
    }


class StdioPipes:
    """Moves the app onto pipes in place of fds 0 and 1, and relays between them and the real ones.

    `start()` before the app is imported; then the app reports through `front` (opened, failed,
    stop_answering once loaded); `close()` after it returns.
    """

    def __init__(self, manifest: dict[str, Any] | None) -> None:
        self._client_in = os.dup(0)
        self._client_out = os.dup(1)
        app_in, self._to_app = os.pipe()
        self._from_app, app_out = os.pipe()
        os.dup2(app_in, 0)
        os.dup2(app_out, 1)
        os.close(app_in)
        os.close(app_out)
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self.front = Front(manifest, self._reply, self._forward)
        self._threads = [
            threading.Thread(target=self._read_client, name="conclave-front-in", daemon=True),
            threading.Thread(target=self._relay_app, name="conclave-front-out", daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def linger(self, timeout: float) -> None:
        """After a failed start: wait (bounded) for the client to read the error and close stdin."""
        self._threads[0].join(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """After the app returned: relay what it still wrote, then stop."""
        self._stop.set()
        self._threads[1].join(timeout)

    # The two threads ------------------------------------------------------------------------------
    def _read_client(self) -> None:
        """Client lines to the front (or straight on to the app); EOF closes the app's stdin."""
        front: Front | None = self.front
        try:
            with os.fdopen(self._client_in, "rb", buffering=READ_SIZE) as client:
                for line in client:
                    if front is None:
                        self._forward(line)
                        continue
                    try:
                        front.take(line)
                    except OSError:
                        raise
                    except Exception:  # a bug in the front: say so, step aside, keep the app served
                        _report("the stdio front failed on a message and steps aside; the app answers all")
                        front = None
                        self._forward(line)
        except OSError:
            pass  # the app's end closed: it has stopped reading
        except Exception:
            _report("the stdio front stopped reading the client")
        finally:
            with contextlib.suppress(OSError):
                os.close(self._to_app)

    def _relay_app(self) -> None:
        """The app's output to the client, line by line, leaving out its second initialize answer."""
        pending = b""
        while True:
            ready, _, _ = select.select([self._from_app], [], [], 0.1)
            chunk = os.read(self._from_app, READ_SIZE) if ready else b""
            if not chunk and self._stop.is_set():
                break  # the app returned and nothing is left to relay
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if not self._relay(line):
                    return
        if pending.strip():
            self._relay(pending)

    def _relay(self, line: bytes) -> bool:
        if not line.lstrip().startswith((b"{", b"[")):  # stray output of an import, not a message (or batch)
            _write_all(2, line + b"\n")
            return True
        if self.front.drop(line):
            return True
        return self._write(line + b"\n")

    # Plumbing ---------------------------------------------------------------------------------------
    def _forward(self, line: bytes) -> None:
        _write_all(self._to_app, line if line.endswith(b"\n") else line + b"\n")

    def _reply(self, message: dict[str, Any]) -> None:
        self._write(json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")

    def _write(self, data: bytes) -> bool:
        """Write whole messages to the client; False once it has gone."""
        with self._write_lock:
            try:
                _write_all(self._client_out, data)
            except OSError:
                return False
        return True


def _report(what: str) -> None:
    """A failure of the front itself, on stderr (which MCP clients log), with its traceback."""
    _write_all(2, f"conclave: {what}:\n{traceback.format_exc()}".encode(errors="replace"))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Startup:
    """What the app tells the front as it starts: `opened` (its settings and the store are open, so the
    front may answer `initialize`), `loaded` (it serves every message itself), or `failed(reason)`."""

    def __init__(self, front: Front | None = None) -> None:
        self._front = front
        self.failure: str | None = None

    def opened(self) -> None:
        if self._front is not None:
            self._front.opened()

    def loaded(self) -> None:
        if self._front is not None:
            self._front.stop_answering()

    def failed(self, reason: str) -> None:
        self.failure = reason
        sys.stderr.write(f"conclave: could not start: {reason}\n")
        if self._front is not None:
            self._front.failed(reason)


def serve(run_app: Callable[[Startup], None], *, quick: bool = True) -> int:
    """Run `run_app(startup)` behind the front; 1 when the app reported a failed start, else 0.

    Without `quick` (or on Windows, where `select` takes no pipes) the app has the real stdio to itself.
    """
    try:
        pipes = None if not quick or os.name == "nt" else StdioPipes(load_manifest())
    except OSError:  # no stdin or stdout to take over (closed descriptors): serve them as they are
        pipes = None
    if pipes is None:
        startup = Startup()
        run_app(startup)
        return 0 if startup.failure is None else 1
    startup = Startup(pipes.front)
    pipes.start()
    try:
        run_app(startup)
        if startup.failure is not None:
            pipes.linger(FAIL_LINGER_S)
    finally:
        pipes.close()
    return 0 if startup.failure is None else 1
