"""`conclave serve`'s stdio front: it answers the handshake before FastMCP is imported, exactly as the app
would, then hands every message to the app (conclave.app.stdio_front).

No test here times anything: the front is shown to answer while the app's import of FastMCP is held
at a gate, and the gate opens only after the answers arrived.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import conclave
from conclave.app import manifest, manifest_key
from conclave.app.manifest_key import MANIFEST, load_manifest, source_hash
from conclave.app.stdio_front import STARTUP_FAILED, Front

HELLO = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}
# Runs `conclave serve` with FastMCP's import held until the file named by GATE exists.
GATED_SERVE = """
import importlib.abc, os, sys, time
class Gate(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        while name == "fastmcp" and not os.path.exists(os.environ["GATE"]):
            time.sleep(0.02)
        return None
sys.meta_path.insert(0, Gate())
from conclave.cli.main import main
sys.exit(main(["serve"]))
"""
LIGHT = {"pydantic", "rich", "fastmcp", "mcp", "anyio", "yaml", "openai", "anthropic", "google", "docker"}


def message(key: int | None, method: str, params: dict[str, Any] | None = None) -> bytes:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if key is not None:
        body["id"] = key
    if params is not None:
        body["params"] = params
    return json.dumps(body).encode() + b"\n"


@pytest.fixture(scope="module")
def shipped() -> dict[str, Any]:
    found = load_manifest()
    assert found is not None, (
        f"{MANIFEST} is missing or recorded for other versions: run python -m conclave.app.manifest --write"
    )
    return found


# The manifest --------------------------------------------------------------------------------------------
def test_the_shipped_manifest_is_what_the_server_answers() -> None:
    fresh = manifest.record()
    shipped = json.loads(MANIFEST.read_text(encoding="utf-8"))
    assert fresh == shipped, (
        "run `python -m conclave.app.manifest --write` and commit server/app/manifest.json"
    )
    assert {tool["name"] for tool in fresh["results"]["tools/list"]["tools"]} == {
        "ask_team",
        "get_status",
        "read_workspace",
        "cancel_job",
        "list_teams",
        "steer_job",
    }


def test_a_manifest_for_other_versions_is_not_used(
    tmp_path: Path, shipped: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    stale = tmp_path / "manifest.json"
    stale.write_text(json.dumps({**shipped, "versions": {**shipped["versions"], "fastmcp": "0.0.1"}}))
    monkeypatch.setattr(manifest_key, "MANIFEST", stale)
    assert load_manifest() is None
    monkeypatch.setattr(manifest_key, "MANIFEST", tmp_path / "absent.json")
    assert load_manifest() is None
    monkeypatch.setattr(manifest_key, "MANIFEST", MANIFEST)
    monkeypatch.setattr(conclave, "__version__", "9.9.9")
    assert load_manifest() is None


# What the front decides ------------------------------------------------------------------------------
class Recorder:
    def __init__(self, shipped: dict[str, Any] | None, opened: bool = True) -> None:
        self.replies: list[dict[str, Any]] = []
        self.forwarded: list[bytes] = []
        self.front = Front(shipped, self.replies.append, self.forwarded.append)
        if opened:
            self.front.opened()


def test_front_answers_initialize_ping_and_lists_and_passes_the_rest_on(shipped: dict[str, Any]) -> None:
    seen = Recorder(shipped)
    front = seen.front
    front.take(message(0, "initialize", HELLO))
    front.take(message(None, "notifications/initialized"))
    front.take(message(1, "tools/list"))
    front.take(message(2, "ping"))
    front.take(message(3, "tools/call", {"name": "list_teams", "arguments": {}}))
    front.take(message(4, "tools/list", {"cursor": "next"}))
    assert [reply["id"] for reply in seen.replies] == [0, 1, 2]
    assert seen.replies[0]["result"] == {"protocolVersion": "2025-06-18", **shipped["initialize"]}
    assert seen.replies[1]["result"] == shipped["results"]["tools/list"] and seen.replies[2]["result"] == {}
    # the app sees the initialize (so its session knows the client) and everything not answered
    assert [json.loads(line).get("id") for line in seen.forwarded] == [0, None, 3, 4]
    app_answer = json.dumps({"jsonrpc": "2.0", "id": 0, "result": {}}).encode()
    assert front.drop(app_answer) and not front.drop(app_answer)  # the app's second answer, once
    assert not front.drop(json.dumps({"jsonrpc": "2.0", "id": 3, "result": {}}).encode())
    front.stop_answering()
    front.take(message(5, "tools/list"))
    assert len(seen.replies) == 3 and json.loads(seen.forwarded[-1])["id"] == 5


def test_front_leaves_to_the_app_what_it_cannot_answer_exactly(shipped: dict[str, Any]) -> None:
    unknown = Recorder(shipped)  # a version the server does not speak: the app's latest, as mcp picks
    unknown.front.take(message(0, "initialize", {**HELLO, "protocolVersion": "1999-01-01"}))
    assert unknown.replies[0]["result"]["protocolVersion"] == shipped["latest"]
    for first, front_stops in (
        (message(0, "initialize", {"protocolVersion": "2025-06-18"}), True),  # malformed: the app says why
        (
            message(0, "tools/list", {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}),
            True,
        ),
        (message(0, "tools/list"), False),  # before initialize: the app's to refuse
        (b"not json\n", False),
    ):
        seen = Recorder(shipped)
        seen.front.take(first)
        seen.front.take(message(9, "ping"))
        assert seen.replies == ([] if front_stops else [{"jsonrpc": "2.0", "id": 9, "result": {}}]), first
        assert seen.forwarded[0] == first
    twice = Recorder(shipped)
    twice.front.take(message(0, "initialize", HELLO))
    twice.front.take(message(1, "initialize", HELLO))
    assert [reply["id"] for reply in twice.replies] == [0] and len(twice.forwarded) == 2


# The real process ----------------------------------------------------------------------------------------
def test_stdlib_alone_until_the_app_loads() -> None:
    code = (
        "import sys; import conclave.cli.main, conclave.app.stdio_front; "
        "print(sorted({m.split('.')[0] for m in sys.modules}))"
    )
    loaded = set(
        json.loads(
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True
            ).stdout.replace("'", '"')
        )
    )
    assert not loaded & LIGHT, loaded & LIGHT


class Lines:
    """A child's stdout read line by line in a thread, so a test can wait for the next message."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._lines: list[bytes] = []
        self._ready = threading.Condition()
        threading.Thread(target=self._read, args=(process,), daemon=True).start()

    def _read(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            with self._ready:
                self._lines.append(line)
                self._ready.notify_all()

    def next(self, timeout: float = 120) -> dict[str, Any]:
        with self._ready:
            assert self._ready.wait_for(lambda: self._lines, timeout), "the server sent nothing"
            return json.loads(self._lines.pop(0))  # type: ignore[no-any-return]

    def pending(self) -> int:
        with self._ready:
            return len(self._lines)


@contextmanager
def gated_serve(tmp_path: Path, script: str = GATED_SERVE) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """`conclave serve` with one import held until the gate file exists: (the process, the gate)."""
    gate = tmp_path / "gate"
    env = {
        **os.environ,
        "GATE": str(gate),
        "CONCLAVE_HOME": str(tmp_path / "home"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "FASTMCP_LOG_LEVEL": "WARNING",
    }
    process = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    )
    try:
        yield process, gate
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    with gated_serve(tmp_path) as running:
        yield running


def test_the_handshake_is_answered_while_fastmcp_is_not_yet_imported(
    gated: tuple[subprocess.Popen[bytes], Path], shipped: dict[str, Any]
) -> None:
    process, gate = gated
    assert process.stdin is not None
    lines = Lines(process)
    process.stdin.write(
        message(0, "initialize", HELLO)
        + message(None, "notifications/initialized")
        + message(1, "tools/list")
        + message(2, "tools/call", {"name": "list_teams", "arguments": {}})
    )
    process.stdin.flush()
    initialize, tools = lines.next(), lines.next()
    assert not gate.exists()  # both answers came while FastMCP's import was held
    assert initialize == {
        "jsonrpc": "2.0",
        "id": 0,
        "result": {"protocolVersion": "2025-06-18", **shipped["initialize"]},
    }
    assert tools["id"] == 1 and tools["result"] == shipped["results"]["tools/list"]
    gate.touch()
    called = lines.next()
    assert called["id"] == 2 and not called["result"].get("isError"), called
    assert "frontier" in called["result"]["content"][0]["text"]
    process.stdin.write(message(3, "ping"))
    process.stdin.flush()
    assert lines.next() == {"jsonrpc": "2.0", "id": 3, "result": {}}  # now from the app
    process.stdin.close()
    assert process.wait(timeout=60) == 0
    assert lines.pending() == 0  # the app's own answer to initialize never reached the client


# Readiness, failures, batches --------------------------------------------------------------------------
def test_initialize_is_answered_only_once_the_app_has_opened_its_settings_and_store(
    shipped: dict[str, Any],
) -> None:
    seen = Recorder(shipped, opened=False)
    seen.front.take(message(0, "initialize", HELLO))
    seen.front.take(message(1, "ping"))  # liveness is not readiness: answered at once
    seen.front.take(message(2, "tools/list"))  # answered after initialize, in order
    assert [reply["id"] for reply in seen.replies] == [1]  # not ready yet: initialize waits
    seen.front.opened()
    assert [reply["id"] for reply in seen.replies] == [1, 0, 2]
    assert seen.replies[1]["result"]["protocolVersion"] == "2025-06-18"


@pytest.mark.parametrize("manifest_present", [True, False])
def test_a_failed_start_answers_initialize_and_later_requests_with_the_reason(
    shipped: dict[str, Any], manifest_present: bool
) -> None:
    seen = Recorder(shipped if manifest_present else None, opened=False)
    seen.front.take(message(0, "initialize", HELLO))
    seen.front.failed("ValidationError: max_jobs: Input should be greater than or equal to 1")
    seen.front.take(message(None, "notifications/initialized"))
    seen.front.take(message(1, "tools/list"))
    assert [reply["id"] for reply in seen.replies] == [0, 1]
    for reply in seen.replies:
        assert "result" not in reply and reply["error"]["code"] == STARTUP_FAILED
        assert "could not start" in reply["error"]["message"] and "max_jobs" in reply["error"]["message"]
    assert [json.loads(line).get("id") for line in seen.forwarded] == [0]  # nothing after the failure


def test_an_error_the_app_sends_for_initialize_reaches_the_client(shipped: dict[str, Any]) -> None:
    seen = Recorder(shipped)
    seen.front.take(message(0, "initialize", HELLO))
    refused = json.dumps({"jsonrpc": "2.0", "id": 0, "error": {"code": -32602, "message": "bad"}}).encode()
    assert not seen.front.drop(refused)


def test_the_manifest_is_keyed_on_the_sources(
    tmp_path: Path, shipped: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "conclave"
    (package / "tools").mkdir(parents=True)
    (package / "tools" / "get_status.py").write_text('def get_status(job_id: str) -> None:\n    """Old."""\n')
    with monkeypatch.context() as patched:
        patched.setattr(manifest_key, "PACKAGE", package)
        before = source_hash()
        (package / "tools" / "get_status.py").write_text(
            'def get_status(job_id: str, wait: int) -> None:\n    """New."""\n'
        )
        assert source_hash() != before  # an edited tool (an editable install): another key
    stale = tmp_path / "manifest.json"
    stale.write_text(json.dumps({**shipped, "versions": {**shipped["versions"], "sources": before}}))
    monkeypatch.setattr(manifest_key, "MANIFEST", stale)
    assert load_manifest() is None


# A stand-in app behind the real front: it echoes each request's method, or answers with a batch.
FAKE_APP = """
import json, os, sys
from conclave.app import stdio_front
if os.environ.get("BREAK_FRONT"):
    def broken(self, line):
        raise RuntimeError("a bug in the front")
    stdio_front.Front.take = broken
def app(startup):
    startup.opened()
    startup.loaded()
    with os.fdopen(0, "rb") as stdin:
        for line in stdin:
            request = json.loads(line)
            answer = {"jsonrpc": "2.0", "id": request.get("id"), "result": {"echo": request.get("method")}}
            os.write(1, json.dumps([answer] if os.environ.get("BATCH") else answer).encode() + b"\\n")
sys.exit(stdio_front.serve(app))
"""


def run_front(tmp_path: Path, lines: bytes, **env: str) -> subprocess.CompletedProcess[bytes]:
    environ = {**os.environ, "CONCLAVE_HOME": str(tmp_path / "home"), "FASTMCP_LOG_LEVEL": "WARNING", **env}
    return subprocess.run(
        [sys.executable, "-c", FAKE_APP],
        input=lines,
        capture_output=True,
        env=environ,
        cwd=tmp_path,
        timeout=120,
    )


def test_a_batch_from_the_app_reaches_the_client(tmp_path: Path) -> None:
    done = run_front(tmp_path, message(7, "tools/call", {"name": "x"}), BATCH="1")
    assert json.loads(done.stdout) == [{"jsonrpc": "2.0", "id": 7, "result": {"echo": "tools/call"}}], (
        done.stderr
    )
    assert done.returncode == 0


def test_a_bug_in_the_front_is_reported_and_the_app_still_answers(tmp_path: Path) -> None:
    done = run_front(tmp_path, message(3, "tools/call", {"name": "x"}) + message(4, "ping"), BREAK_FRONT="1")
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(a["id"], a["result"]["echo"]) for a in answers] == [(3, "tools/call"), (4, "ping")]
    assert b"stdio front failed" in done.stderr and b"a bug in the front" in done.stderr


def test_a_server_that_cannot_start_says_why_to_initialize_and_exits_1(tmp_path: Path) -> None:
    """Bad settings: the real `conclave serve`, with its front, refuses the handshake with the reason."""
    bad = {"CONCLAVE_HOME": str(tmp_path / "home"), "CONCLAVE_MAX_JOBS": "0"}
    answer, code = initialize_serve(tmp_path, bad)
    assert answer["id"] == 0 and "result" not in answer, answer
    assert "could not start" in answer["error"]["message"] and "max_jobs" in answer["error"]["message"]
    assert code == 1


def test_an_unusable_state_folder_fails_the_handshake(tmp_path: Path) -> None:
    (tmp_path / "home").write_text("a file where the state folder should be")
    answer, code = initialize_serve(tmp_path, {"CONCLAVE_HOME": str(tmp_path / "home" / "state")})
    assert answer["error"]["code"] == STARTUP_FAILED and code == 1, answer


def initialize_serve(tmp_path: Path, environ: dict[str, str]) -> tuple[dict[str, Any], int]:
    """The real `conclave serve`, with `environ` over ours, sent `initialize` alone: its reply, its exit."""
    done = subprocess.run(
        [sys.executable, "-m", "conclave", "serve"],
        input=message(0, "initialize", HELLO),
        capture_output=True,
        env={**os.environ, **environ},
        cwd=tmp_path,
        timeout=120,
    )
    return json.loads(done.stdout), done.returncode


GATED_STORE = GATED_SERVE.replace('name == "fastmcp"', 'name == "conclave.jobs.store.sql"')


def test_readiness_waits_for_the_store(tmp_path: Path, shipped: dict[str, Any]) -> None:
    """With the store's import held, ping is answered and initialize is not; the gate opens, it is."""
    with gated_serve(tmp_path, GATED_STORE) as (process, gate):
        assert process.stdin is not None
        lines = Lines(process)
        process.stdin.write(message(0, "initialize", HELLO) + message(1, "ping"))
        process.stdin.flush()
        assert lines.next()["id"] == 1  # the front answered ping; initialize waits for the store
        gate.touch()
        ready = lines.next()
        assert ready["id"] == 0 and ready["result"]["protocolVersion"] == "2025-06-18"
        process.stdin.close()
        assert process.wait(timeout=60) == 0
