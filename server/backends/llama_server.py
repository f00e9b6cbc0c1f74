"""A llama.cpp server as a child process: started, shared and stopped for the `local` provider (local.py).

`start_server()` runs llama.cpp's own server (the prebuilt `xllamacpp` wheel, in a small `python -c` boot
script) on a free 127.0.0.1 port, drains the child's output into a bounded log and waits until
`/v1/models` answers; a failed or cancelled start leaves no child. `LocalServers` shares one server among
all agents that use the same model file, counting references, and stops what is left when it closes.
The child gets a filtered environment (no provider keys) and a random API key (through its environment,
not its command line, which other local users can read), so other local users cannot borrow it, and it
dies with us even if we are killed (PR_SET_PDEATHSIG on Linux).
"""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import secrets
import socket
import subprocess
import sys
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc

from conclave.backends import bundled, llama_scoring
from conclave.errors import ConfigError, ProviderError

N_CTX = 8192  # SmolLM2's training context; a bigger model_path model is cut to this
STARTUP_S, GRACE_S, LOG_LINES = 120.0, 5.0, 300
REPEAT_PENALTY = 1.05  # over the last 64 tokens (llama.cpp's default), chosen on dev: docs/evaluation.md
CACHE_MIB = 512  # llama.cpp's RAM prompt cache, where a slot's prompts wait for their agent's next turn
ENGINE = "xllamacpp"
INSTALL = (
    "the local provider needs llama.cpp's prebuilt server, the xllamacpp package (no compiler needed): "
    "pip install 'conclave-mcp[local]' (or pip install 'xllamacpp>=2026.10')"
)
CHILD_MARK = "conclave-llama-server"  # in the child's command line: what it is, for ps and /proc
KEY_VARIABLE = "CONCLAVE_LLAMA_KEY"  # the child's API key, read and dropped by the boot script
# What the child may see of our environment: no provider keys.
_ENV_KEEP = (
    "PATH",
    "HOME",
    "LANG",
    "TMPDIR",
    "TMP",
    "TEMP",
    "PYTHONPATH",
    "PYTHONHOME",
    "VIRTUAL_ENV",
    "LD_LIBRARY_PATH",
    "DYLD_LIBRARY_PATH",
    "SYSTEMROOT",
    "CUDA_VISIBLE_DEVICES",
)
_ENV_PREFIXES = ("LC_", "GGML_", "OMP_")
# Runs in the child: die with the parent (Linux), then serve until killed. argv: mark, parent pid, the
# server's settings as JSON (ServerOptions.settings).
_BOOT = """\
import ctypes, json, os, signal, sys, threading
parent, settings = int(sys.argv[2]), json.loads(sys.argv[3])
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != parent:
    sys.exit("conclave: the parent process is gone")
import xllamacpp
params = xllamacpp.CommonParams()
params.api_keys = [os.environ.pop("CONCLAVE_LLAMA_KEY")]
for name, value in settings.items():  # "cpuparams.n_threads": params.cpuparams.n_threads
    *path, last = name.split(".")
    target = params
    for part in path:
        target = getattr(target, part)
    setattr(target, last, value)
server = xllamacpp.Server(params)  # loads the model, then listens
print("conclave: listening on", server.listening_address, flush=True)
threading.Event().wait()  # until SIGTERM or SIGKILL ends the process (TerminateProcess on Windows)
"""


def check_installed() -> None:
    """Raise ConfigError saying what to install when llama.cpp's prebuilt server is missing."""
    if importlib.util.find_spec(ENGINE) is None:
        raise ConfigError(f"{INSTALL} (missing: {ENGINE})")


def default_threads() -> int:
    """All CPUs but one, which stays for Conclave itself.

    Measured on 2 cores (bench/bench_local.py --threads 1 2): idle, 2 threads beat 1 (62 vs 39 tokens/s),
    but under load 2 threads fell to 4 tokens/s against 12 for 1, as llama.cpp's threads spin-wait for
    each other; the robust choice wins.
    """
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cpus - 1)


@dataclass(frozen=True)
class ServerOptions:
    """One llama.cpp server; agents with equal options share it."""

    model: Path
    chat_format: str | None = None  # None: the GGUF's own template (bundled.py names the exceptions)
    n_ctx: int = N_CTX
    n_threads: int = field(default_factory=default_threads)
    startup_s: float = STARTUP_S
    python: str = sys.executable

    def settings(self, port: int) -> dict[str, object]:
        """The xllamacpp.CommonParams the boot script sets (the API key comes apart, by environment)."""
        settings: dict[str, object] = {
            "model.path": str(self.model),
            "hostnames": ["127.0.0.1"],
            "port": port,
            "n_ctx": self.n_ctx,
            "cpuparams.n_threads": self.n_threads,
            "cpuparams_batch.n_threads": self.n_threads,
            # Without a penalty SmolLM2 loops ("189 - 43 = 189 - 43 = ..."); llama-cpp-python's 1.1 costs
            # more here, as llama.cpp's window also holds the prompt's tokens: 1.05 was best on dev.
            "sampling.penalty_repeat": REPEAT_PENALTY,
            # One slot: agents' calls take turns, as on one small CPU they would anyway (three slots
            # decoded no faster on two cores), and each slot would get a third of the context.
            "n_parallel": 1,
            # Each agent's stable system prompt is evaluated once, not on every turn: a slot keeps its
            # last prompt and the RAM cache the others', restored when their agent comes back.
            "cache_prompt": True,
            "cache_ram_mib": CACHE_MIB,
            "ui": False,  # no web page on the port: only the API
            "endpoint_slots": False,
        }
        if self.chat_format:
            settings |= {"chat_template": bundled.chat_template(self.chat_format), "use_jinja": True}
        return settings


class LocalServer:
    """A running llama.cpp server child; made by `start_server()`, ended by `stop()`."""

    def __init__(self, options: ServerOptions, process: anyio.abc.Process, port: int, key: str) -> None:
        self.options, self.process, self.port, self.api_key = options, process, port, key
        self.log: collections.deque[str] = collections.deque(maxlen=LOG_LINES)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 12) -> str:
        return "\n".join(list(self.log)[-lines:]) or "(no output)"

    def exited(self) -> str | None:
        """Why the server is gone (exit code and log tail), or None while it runs."""
        code = self.process.returncode
        if code is None:
            return None
        return f"the llama.cpp server exited with code {code}; its log ends:\n{self.log_tail()}"

    async def _drain(self) -> None:
        """Read the child's output into the bounded log, so its pipe never fills."""
        assert self.process.stdout is not None
        pending = b""
        async for chunk in self.process.stdout:
            *lines, pending = (pending + chunk).replace(b"\r", b"\n").split(b"\n")
            self.log.extend(line.decode(errors="replace") for line in lines if line.strip())
            pending = pending[-4096:]

    async def _wait_ready(self) -> None:
        with anyio.move_on_after(self.options.startup_s):
            while True:
                if (why := self.exited()) is not None:
                    raise ProviderError("local", why)
                if await self._answers():
                    return
                await anyio.sleep(0.1)
        limit, tail = self.options.startup_s, self.log_tail()
        raise ProviderError(
            "local", f"the llama.cpp server did not answer within {limit:g} s; log ends:\n{tail}"
        )

    async def _answers(self) -> bool:
        auth = f"Authorization: Bearer {self.api_key}"
        request = f"GET /v1/models HTTP/1.0\r\nHost: 127.0.0.1\r\n{auth}\r\n\r\n"
        try:
            with anyio.fail_after(2):
                async with await anyio.connect_tcp("127.0.0.1", self.port) as stream:
                    await stream.send(request.encode())
                    head = await stream.receive(32)
        except (OSError, TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError):
            return False
        return head.split(b" ", 2)[1:2] == [b"200"]

    async def stop(self) -> None:
        """Terminate, wait up to GRACE_S, then kill; returns with the process reaped, even if cancelled."""
        with anyio.CancelScope(shield=True):
            await self._stop()

    async def _stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            with anyio.move_on_after(GRACE_S):
                await self.process.wait()
        if self.process.returncode is None:
            self.process.kill()
        await self.process.aclose()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _child_env(key: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in _ENV_KEEP or k.startswith(_ENV_PREFIXES)}
    return {**env, KEY_VARIABLE: key, "PYTHONUNBUFFERED": "1"}


async def start_server(options: ServerOptions, tg: anyio.abc.TaskGroup) -> LocalServer:
    """Start a llama.cpp server and wait until it answers; its output is drained by a task in `tg`.

    On any failure or cancellation the child is stopped before this returns; the caller must `stop()`
    a server it got.
    """
    check_installed()
    port, key = _free_port(), secrets.token_urlsafe(24)
    settings = json.dumps(options.settings(port))
    command = [options.python, "-c", _BOOT, CHILD_MARK, str(os.getpid()), settings]
    process = await anyio.open_process(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=_child_env(key),
    )
    server = LocalServer(options, process, port, key)
    try:
        tg.start_soon(server._drain)  # ends by itself at EOF, when the child is gone
        await server._wait_ready()
    except BaseException:
        await server.stop()
        raise
    return server


class LocalServers:
    """The servers of a process, one per model file: started on first acquire, stopped at last release.

    An async context manager: its task group drains the children's output, and closing it stops every
    server still running.
    """

    def __init__(self) -> None:
        self._entries: dict[ServerOptions, tuple[LocalServer, int]] = {}
        self._scorers: dict[Path, llama_scoring.ModelScores] = {}
        self._lock = anyio.Lock()
        self._stack: AsyncExitStack | None = None
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> LocalServers:  # the class is not subclassed
        async with AsyncExitStack() as stack:
            self._tg = await stack.enter_async_context(anyio.create_task_group())
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._stack is not None and self._tg is not None
        with anyio.CancelScope(shield=True):
            async with self._lock:
                self._tg.cancel_scope.cancel()
                self._tg = None
                servers = [server for server, _ in self._entries.values()]
                self._entries.clear()
            for server in servers:
                await server.stop()
        # No exception info: the body's own exception propagates as it is, not in an ExceptionGroup.
        await self._stack.__aexit__(None, None, None)

    def running(self) -> list[LocalServer]:
        return [server for server, _ in self._entries.values()]

    def scorer(self, model: Path) -> llama_scoring.ModelScores:
        """The process's one scorer for `model`: the scores its agents' votes asked for, kept."""
        return self._scorers.setdefault(model, llama_scoring.ModelScores())

    async def acquire(self, options: ServerOptions) -> LocalServer:
        """The running server for `options`, started if this is the first reference."""
        async with self._lock:
            if self._tg is None:
                raise RuntimeError("LocalServers is not open: use `async with LocalServers() as pool`")
            server, refs = self._entries.get(options) or (None, 0)
            if server is None:
                server = await start_server(options, self._tg)
            self._entries[options] = (server, refs + 1)
            return server

    async def release(self, server: LocalServer) -> None:
        """Drop one reference; the last one stops the server and returns once it is gone."""
        with anyio.CancelScope(shield=True):
            async with self._lock:
                current, refs = self._entries.get(server.options) or (None, 0)
                if current is not server:
                    return  # already stopped by the pool's close
                if refs > 1:
                    self._entries[server.options] = (server, refs - 1)
                    return
                del self._entries[server.options]
            await server.stop()
