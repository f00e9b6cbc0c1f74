"""A command runner that lives in the container: one engine exec per container, not one per command.

An engine exec costs about 50-90 ms on a loaded 2-core host (the engine, containerd and runc set up
each process: bench/results/checks.json), more than most commands take. So sandbox/container.py
starts `RUNNER` once per container, as the command user, with one `docker exec -i` whose stdin and
stdout stay open, and hands it one command after another:
- the host writes one JSON line per command (`argv`, `env`); the runner starts it in /workspace with
  the container's environment plus `env`, stdin empty, says so (`S`: a stream that ends before it
  means the container stopped, and the command is tried once more on a new runner), streams its
  stdout and stderr back in frames (a tag byte `O`, `E`, then a 4-byte length and the bytes), then `X`
  with the exit code and whether the reaping below succeeded. The argv is the same as an exec's
  (`timeout -s KILL N sh -c ...`, the `ulimit -f` prefix), so timeouts and file caps behave as before.
- after every command the runner itself reaps: `kill(-1, SIGKILL)` reaches every process of the
  command user but the runner (as leftovers.REAP does from an exec), then /proc is read until none is
  left but zombies; a reap that fails is reported and the host restarts the container.
- the runner makes itself non-dumpable (`PR_SET_DUMPABLE` 0) before it says it is ready: a process of
  the same uid then can neither ptrace it nor open its /proc files (fd, mem, environ), so a command
  cannot write frames into its output or read its requests. It starts with `python3 -I` from /, so
  nothing in /workspace can shadow a module it imports. A command can still kill it (it runs as the
  same user): the host sees the stream end, reaps by an exec as before, and starts a new one; one that
  stops it is an exec that overran (container.py restarts the container).
- an image without python3, or where prctl fails, has no runner: every command is an exec as before.
- the host speaks first: it writes an empty line, and the runner says it is ready (`R`) only once it has
  read it. Podman 4.3 through its Docker API sometimes drops what an exec writes before its attach is
  joined (about one start in 30 here: the host then waited for `R` for ever); what the runner writes
  after reading its stdin goes over a joined attach. And the host waits at most READY_S for `R`, then
  starts the runner once more, then gives up on it (commands become execs).
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

from conclave.errors import SandboxStopped
from conclave.sandbox.output import _Capped

READY_S = 15.0  # for the runner's `R`, which takes about 0.1 s (python3's start) on a busy host

RUNNER = r"""
import ctypes, json, os, selectors, signal, struct, subprocess, sys, time
if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, 0
    sys.exit("prctl failed")
out, me, uid = sys.stdout.buffer, os.getpid(), os.getuid()
def send(tag, data=b""):
    out.write(tag + struct.pack(">I", len(data)) + data)
    out.flush()
def left():
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if os.stat("/proc/" + name).st_uid != uid:
                continue
            with open("/proc/" + name + "/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            return True
    return False
def reap():  # SIGKILL lands at once but a task takes a moment to go: up to about 2 s
    for _ in range(200):
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        if not left():
            return True
        time.sleep(0.01)
    return False
sys.stdin.buffer.readline()  # the host's empty line: it is attached (see the module docstring)
send(b"R")
for line in sys.stdin.buffer:
    request = json.loads(line)
    send(b"S")
    env = dict(os.environ)
    env.update(request["env"])
    try:
        child = subprocess.Popen(request["argv"], cwd="/workspace", env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        send(b"E", str(exc).encode())
        send(b"X", struct.pack(">i?", 127, reap()))
        continue
    streams = selectors.DefaultSelector()
    streams.register(child.stdout, selectors.EVENT_READ, b"O")
    streams.register(child.stderr, selectors.EVENT_READ, b"E")
    reaped = None
    while streams.get_map():
        ready = streams.select(0.05)
        for key, _ in ready:
            data = os.read(key.fd, 65536)
            if data:
                send(key.data, data)
            else:
                streams.unregister(key.fileobj)
                key.fileobj.close()
        if not ready and reaped is None and child.poll() is not None:
            reaped = reap()  # the command ended but something it started holds its output open
    code = child.wait()
    ok = reap() and reaped is not False
    send(b"X", struct.pack(">i?", 128 - code if code < 0 else code, ok))
"""


class RunnerGone(Exception):
    """The runner's stream ended: the command killed it, or the container stopped (`started`: after the
    command had started)."""

    def __init__(self, reason: str, started: bool = False) -> None:
        super().__init__(reason)
        self.started = started


class Runner:
    """The host's end of one container's runner: `run` one command at a time (blocking)."""

    def __init__(self, stream: Any) -> None:
        self._socket, self._buffer = stream, bytearray()

    @classmethod
    def start(cls, api: Any, container_id: str, user: str) -> Runner | None:
        """Start the runner in the container; None when it cannot run there (no python3, no prctl), or
        when it never said it was ready, twice. The engine's errors (the container is not running) are
        the caller's."""
        for _ in range(2):
            exec_id = api.exec_create(
                container_id, ["python3", "-I", "-c", RUNNER], stdin=True, user=user, workdir="/"
            )
            runner = cls(api.exec_start(exec_id["Id"], socket=True))
            try:
                runner._socket._sock.sendall(b"\n")  # the runner speaks once spoken to (docstring)
                if not runner._readable(READY_S):
                    runner.close()  # its stdin ends, and so does it
                    continue
                if runner._frame()[0] == b"R":
                    return runner
            except (RunnerGone, OSError):
                pass
            runner.close()
            return None
        return None

    def _readable(self, timeout_s: float) -> bool:
        """Whether the runner's stream has something to read within `timeout_s` (docker-py's own reads
        wait for ever). poll, not select: a busy server's descriptors pass 1024, which select() refuses."""
        poller = select.poll()
        poller.register(self._socket._sock, select.POLLIN)
        return bool(poller.poll(timeout_s * 1000))

    def run(self, argv: list[str], env: dict[str, str], out: _Capped, err: _Capped) -> tuple[int, bool]:
        """Run one command; its exit code (128 + signal when killed) and whether the reaping succeeded.
        Raises RunnerGone when the stream ends first."""
        try:
            self._socket._sock.sendall(json.dumps({"argv": argv, "env": env}).encode() + b"\n")
            if self._frame()[0] != b"S":
                raise RunnerGone("the runner did not start the command")
        except OSError as exc:
            raise RunnerGone(str(exc)) from exc
        while True:
            try:
                tag, data = self._frame()
            except RunnerGone as exc:
                raise RunnerGone(str(exc), started=True) from exc
            if tag == b"O":
                out.add(data)
            elif tag == b"E":
                err.add(data)
            elif tag == b"X":
                code, reaped = struct.unpack(">i?", data)
                return code, reaped
            else:
                raise RunnerGone(f"the runner sent {tag!r}")

    def close(self) -> None:
        # docker-py hands back a SocketIO, whose close leaves the socket under it open. The shutdown is
        # what wakes a thread still reading (a cancelled command's): a close alone does not, and the
        # engine keeps the stream open after the container is removed, so that thread waited for ever.
        under = getattr(self._socket, "_sock", None)
        with contextlib.suppress(OSError):
            if under is not None:
                under.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._socket.close()
            if under is not None:
                under.close()

    def _frame(self) -> tuple[bytes, bytes]:
        head = self._read(5)
        return head[:1], self._read(struct.unpack(">I", head[1:])[0])

    def _read(self, size: int) -> bytes:
        """`size` bytes of the runner's stdout, out of the engine's stream frames (its stderr skipped)."""
        from docker.utils.socket import STDOUT, SocketError, next_frame_header, read_exactly

        while len(self._buffer) < size:
            try:
                stream, length = next_frame_header(self._socket)
                chunk = read_exactly(self._socket, length) if length >= 0 else b""
            except (OSError, SocketError, ValueError) as exc:
                raise RunnerGone(str(exc)) from exc
            if length < 0:
                raise RunnerGone("the runner's stream ended")
            if stream == STDOUT:
                self._buffer += chunk
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data


class RunnerSlot:
    """A container's runner: started when first needed, again after it died; none where it cannot run.

    A command's thread may be starting the runner while the sandbox stops: `end` closes the slot for good
    under a lock, so a runner that comes up after it is closed at once rather than kept, unclosed, by a
    command that would then read its stream for ever."""

    def __init__(self, enabled: bool = True) -> None:
        self.runner: Runner | None = None
        self.failed = not enabled  # the image cannot run one (or it is not wanted): commands are execs
        self._ended = False
        self._lock = threading.Lock()

    def get(self, api: Any, container_id: str, user: str, restart: Callable[[], None]) -> Runner | None:
        """The runner, started if needed (blocking); `restart` brings back a container that stopped.
        Raises SandboxStopped once the slot has ended."""
        import docker

        if self._ended:
            raise SandboxStopped()
        if self.runner is None and not self.failed:
            try:
                runner = Runner.start(api, container_id, user)
            except docker.errors.APIError as exc:
                if "is not running" not in str(exc):
                    raise
                restart()  # e.g. its keeper was killed: come back once, workspace intact
                runner = Runner.start(api, container_id, user)
            with self._lock:
                if self._ended:
                    if runner is not None:
                        runner.close()
                    raise SandboxStopped()
                self.runner, self.failed = runner, runner is None
        return self.runner

    def ahead(self, api: Any, container_id: str, user: str, restart: Callable[[], None]) -> None:
        """Start it before the first command; an engine error leaves that to the first command."""
        import docker

        with contextlib.suppress(docker.errors.DockerException):
            self.get(api, container_id, user, restart)

    def drop(self, runner: Runner) -> None:
        """Forget a runner whose stream ended; the next `get` starts another."""
        with self._lock:
            if self.runner is runner:
                self.runner = None
        runner.close()

    def close(self) -> None:
        """Forget the runner (the container restarts)."""
        with self._lock:
            runner, self.runner = self.runner, None
        if runner is not None:
            runner.close()

    def end(self) -> None:
        """Close the runner, and any that comes up later (the container goes)."""
        with self._lock:
            self._ended = True
        self.close()
