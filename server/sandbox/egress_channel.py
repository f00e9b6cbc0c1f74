"""A CLI member's way to its egress proxy through the engine's API: no host socket, no network.

    channel = EgressChannel(client.api, container_id, keeper_user(uid), label="cj-1/A")
    proxy.attach(channel.serve)        # sandbox/egress.py: each connection in becomes `proxy.handle(stream)`
    ...
    channel.close()                    # the container is going: `serve` returns

Why not a socket or a network: an engine in a VM (Docker Desktop, OrbStack, colima, Podman machine) or on
another machine shares no unix socket with this host, and a network that reaches the host reaches every
port on it (an `--internal` network's gateway is a host address). The engine's API, which every engine
serves wherever it runs, carries an exec's stdin and stdout. So the member keeps Docker's `none` network
(a loopback and nothing else), and its container's keeper (uid nobody, which the agent's commands cannot
signal) runs `RELAY` in one long-lived exec: it listens on 127.0.0.1:3128, where `HTTPS_PROXY` points, and
carries every connection to it over that exec's stdin and stdout, framed, to this host, where each
becomes one client connection of the member's proxy (sandbox/egress.py), as a unix socket's did before.
Nothing else can open a connection into the channel: its only end outside the container is this
process's exec stream, so there is no listener on the host to authenticate.

The frames: a byte kind, a 4-byte connection id, a 4-byte length, then that many bytes. OPEN (a client
connected inside), DATA, EOF (that side is done sending), CLOSE (that connection is over), ACK (the
receiver delivered n bytes), and LISTENING (the relay's first frame, once 127.0.0.1:3128 listens and the
host's hello, an empty LISTENING frame, came in: Podman 4.3 sometimes drops what an exec writes before its
attach is joined, about one start in 30 here, and what the relay writes after reading its stdin goes
over a joined attach; a relay that has not said it listens within READY_S is started again). Each
side sends at most `WINDOW` bytes of a connection ahead of the other's ACKs (a receiver acknowledges once
`ACK_AT` bytes are delivered, not every chunk: a model call's request and reply then need no ACK at all,
and a large transfer one per quarter window), so one client that stops reading holds back only its own
connection, never the others, and the memory either side holds per connection stays bounded.

When the exec ends (the container restarted: its keeper was killed, a command overran, the disk cap),
`serve` starts the relay again until `close`; sandbox/member.py waits for it to listen as before.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread

from conclave.errors import SandboxError
from conclave.sandbox.provider_key import BRIDGE_PORT

__all__ = ["RELAY", "EgressChannel"]

logger = logging.getLogger(__name__)

OPEN, DATA, EOF, CLOSE, ACK, LISTENING = 1, 2, 3, 4, 5, 6
HEAD = struct.Struct(">BII")
WINDOW = 256 * 1024  # bytes of one connection in flight, per direction, ahead of the receiver's ACKs
ACK_AT = WINDOW // 4  # delivered bytes a receiver acknowledges at once (at most WINDOW: see above)
CHUNK = 64 * 1024
RETRY_S = 0.2  # between two starts of the relay while its container comes back
READY_S = 5.0  # for a new relay's LISTENING (python3's start: about 0.1 s), then it is started again

# Run by the keeper, `python3 -I -c RELAY`. Threads: one accepts, one reads stdin; per connection one
# reads the client (within its window), one writes to it (what stdin brought, then ACKs).
_RELAY = r"""
import contextlib, ctypes, os, queue, socket, struct, sys, threading
OPEN, DATA, EOF, CLOSE, ACK, LISTENING = 1, 2, 3, 4, 5, 6
ctypes.CDLL(None).prctl(15, b"conclave-egress", 0, 0, 0)  # PR_SET_NAME: what ps and /proc show
out, lock, conns = sys.stdout.buffer, threading.Lock(), {}
def send(kind, cid, data=b""):
    with lock:
        out.write(struct.pack(">BII", kind, cid, len(data)) + data)
        out.flush()
class Conn:
    def __init__(self, cid, sock):
        self.cid, self.sock, self.credit = cid, sock, WINDOW
        self.more, self.inbox = threading.Condition(), queue.Queue()
    def pump_out(self):  # the client's bytes to the host, within the window
        try:
            while True:
                with self.more:
                    while self.credit <= 0:
                        self.more.wait()
                    room = min(self.credit, CHUNK)
                data = self.sock.recv(room)
                if not data:
                    send(EOF, self.cid)
                    return
                with self.more:
                    self.credit -= len(data)
                send(DATA, self.cid, data)
        except OSError:
            send(CLOSE, self.cid)
    def pump_in(self):  # the host's bytes to the client, acknowledged once ACK_AT are written
        unacked = 0
        try:
            while True:
                data = self.inbox.get()
                if data is None:
                    self.sock.shutdown(socket.SHUT_WR)
                    continue
                if data is False:
                    break
                self.sock.sendall(data)
                unacked += len(data)
                if unacked >= ACK_AT:
                    send(ACK, self.cid, struct.pack(">I", unacked))
                    unacked = 0
        except OSError:
            send(CLOSE, self.cid)
        finally:
            conns.pop(self.cid, None)
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)  # wakes pump_out's recv
            self.sock.close()
def accept(server):
    cid = 0
    while True:
        sock, _ = server.accept()
        cid += 1
        conn = conns[cid] = Conn(cid, sock)
        send(OPEN, cid)
        threading.Thread(target=conn.pump_out, daemon=True).start()
        threading.Thread(target=conn.pump_in, daemon=True).start()
def exactly(n):
    data = b""
    while len(data) < n:
        chunk = sys.stdin.buffer.read(n - len(data))
        if not chunk:
            os._exit(0)  # the host went away: so does the door
        data += chunk
    return data
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", PORT))
server.listen(64)
exactly(9)  # the host's hello: it is attached (see the module docstring)
send(LISTENING, 0)
threading.Thread(target=accept, args=(server,), daemon=True).start()
while True:
    kind, cid, size = struct.unpack(">BII", exactly(9))
    data = exactly(size)
    conn = conns.get(cid)
    if conn is None:
        continue
    if kind == DATA:
        conn.inbox.put(data)
    elif kind == EOF:
        conn.inbox.put(None)
    elif kind == CLOSE:
        conn.inbox.put(False)  # after what came before it is written
    elif kind == ACK:
        with conn.more:
            conn.credit += struct.unpack(">I", data)[0]
            conn.more.notify()
"""
RELAY = f"PORT, WINDOW, CHUNK, ACK_AT = {BRIDGE_PORT}, {WINDOW}, {CHUNK}, {ACK_AT}{_RELAY}"

Handler = Callable[[anyio.abc.ByteStream], Awaitable[None]]


class _Tunnel(anyio.abc.ByteStream):
    """One connection from inside the container, as the proxy's client stream."""

    def __init__(self, channel: EgressChannel, cid: int) -> None:
        self._channel, self.cid = channel, cid
        self._inbox_send, self._inbox = anyio.create_memory_object_stream[bytes | None](float("inf"))
        self._credit = WINDOW
        self._unacked = 0  # delivered to the proxy, not yet acknowledged (up to ACK_AT)
        self._more = anyio.Event()
        self.closed = False

    def arrived(self, data: bytes | None) -> None:
        """DATA (or None: EOF) from inside; never more than WINDOW ahead of our ACKs, so never blocks."""
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._inbox_send.send_nowait(data)

    def acknowledged(self, size: int) -> None:
        self._credit += size
        self._more.set()

    def ended(self) -> None:
        """CLOSE from inside, or the channel is gone: the proxy's reads end, its writes fail."""
        self.closed = True
        self._inbox_send.close()
        self._more.set()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        try:
            data = await self._inbox.receive()
        except anyio.EndOfStream:
            raise anyio.EndOfStream from None
        except anyio.ClosedResourceError:
            raise anyio.EndOfStream from None
        if data is None:
            raise anyio.EndOfStream
        self._unacked += len(data)
        if self._unacked >= ACK_AT:
            await self._channel.send(ACK, self.cid, struct.pack(">I", self._unacked))
            self._unacked = 0
        return data

    async def send(self, item: bytes) -> None:
        view = memoryview(item)
        while view:
            while self._credit <= 0 and not self.closed:
                self._more = anyio.Event()
                await self._more.wait()
            if self.closed:
                raise anyio.BrokenResourceError
            size = min(self._credit, CHUNK, len(view))
            self._credit -= size
            await self._channel.send(DATA, self.cid, bytes(view[:size]))
            view = view[size:]

    async def send_eof(self) -> None:
        if not self.closed:
            await self._channel.send(EOF, self.cid)

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                await self._channel.send(CLOSE, self.cid)
        self._channel.forget(self.cid)
        self._inbox.close()


class EgressChannel:
    """The host's end of one member container's relay: `serve(handle)` until `close()`."""

    def __init__(self, api: Any, container_id: str, user: str, *, label: str = "") -> None:
        self._api, self._container_id, self._user, self.label = api, container_id, user, label
        self._stream: anyio.abc.SocketStream | None = None
        self._write = anyio.Lock()
        self._tunnels: dict[int, _Tunnel] = {}
        self._closed = False
        self._listening = anyio.Event()  # the current relay listens on 127.0.0.1:3128

    async def listening(self, timeout_s: float) -> bool:
        """Whether the relay said it listens within `timeout_s` (its first start: a restart's is awaited
        inside the container, sandbox/member.py)."""
        with anyio.move_on_after(timeout_s):
            await self._listening.wait()
        return self._listening.is_set()

    def close(self) -> None:
        """The container is going: `serve` returns once its current exec ends (it ends with it)."""
        self._closed = True

    async def serve(self, handle: Handler) -> None:
        """Start the relay and hand each connection it carries to `handle`; again after its container
        restarted, until `close`."""
        async with anyio.create_task_group() as group:
            while not self._closed:
                try:
                    own = await anyio.to_thread.run_sync(self._start)
                    stream = await anyio.abc.SocketStream.from_socket(own)
                except SandboxError as exc:  # an engine this channel cannot use: the bridge never listens
                    logger.warning("egress %s: %s", self.label or "-", exc)
                    break
                except Exception as exc:  # the container is (re)starting, or already gone
                    if self._closed:
                        break
                    logger.debug("egress %s: relay not started (%s)", self.label or "-", exc)
                    await anyio.sleep(RETRY_S)
                    continue
                async with stream, anyio.create_task_group() as watch:
                    self._stream = stream
                    watch.start_soon(self._unless_listening, stream)
                    await self._pump(stream, group, handle)
                    watch.cancel_scope.cancel()
                self._stream = None
                for tunnel in list(self._tunnels.values()):
                    tunnel.ended()
                self._tunnels.clear()
                if not self._closed:  # its container restarts (or the relay could not run): try again
                    await anyio.sleep(RETRY_S)
            group.cancel_scope.cancel()

    async def _unless_listening(self, stream: anyio.abc.SocketStream) -> None:
        """End a first relay that has not said it listens within READY_S: `serve` starts another."""
        with anyio.move_on_after(READY_S):
            await self._listening.wait()
            return
        logger.info("egress %s: the relay did not say it listens; starting it again", self.label or "-")
        await stream.aclose()

    async def send(self, kind: int, cid: int, data: bytes = b"") -> None:
        """One frame to the relay; the connection is broken when the channel is."""
        stream = self._stream
        if stream is None:
            raise anyio.BrokenResourceError
        async with self._write:
            await stream.send(HEAD.pack(kind, cid, len(data)) + data)

    def forget(self, cid: int) -> None:
        self._tunnels.pop(cid, None)

    def _start(self) -> socket.socket:
        """The relay's exec: its stdin and stdout as one socket of ours (blocking: a worker thread)."""
        exec_id = self._api.exec_create(
            self._container_id, ["python3", "-I", "-c", RELAY], stdin=True, user=self._user, workdir="/"
        )
        raw = self._api.exec_start(exec_id["Id"], socket=True)
        sock = getattr(raw, "_sock", raw)
        if not isinstance(sock, socket.socket) or isinstance(sock, ssl.SSLSocket):
            with suppress(OSError):
                raw.close()
            raise SandboxError(
                "a CLI member's egress needs the Docker engine's API on a unix socket or plain TCP "
                f"(DOCKER_HOST is {os.environ.get('DOCKER_HOST', 'unset')}): reach a TLS or SSH engine "
                "through a local socket (an SSH tunnel, `docker context` with a socket)"
            )
        own = socket.socket(fileno=os.dup(sock.fileno()))
        with suppress(OSError):
            raw.close()
            sock.close()
        if own.family in (socket.AF_INET, socket.AF_INET6):  # an engine over TCP: frames go out at once
            own.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        own.sendall(HEAD.pack(LISTENING, 0, 0))  # the hello the relay waits for (the module docstring)
        return own

    async def _pump(
        self, stream: anyio.abc.SocketStream, group: anyio.abc.TaskGroup, handle: Handler
    ) -> None:
        """Read the engine's stream (8-byte headers: stdout 1, stderr 2) and the relay's frames in it."""
        buffer = bytearray()
        engine = bytearray()
        try:
            async for chunk in stream:
                engine += chunk
                while len(engine) >= 8:
                    kind, size = engine[0], struct.unpack(">I", engine[4:8])[0]
                    if len(engine) < 8 + size:
                        break
                    payload = bytes(engine[8 : 8 + size])
                    del engine[: 8 + size]
                    if kind == 1:
                        buffer += payload
                    elif payload:
                        logger.info(
                            "egress %s: relay says %s",
                            self.label or "-",
                            payload[-300:].decode("utf-8", "replace"),
                        )
                while len(buffer) >= HEAD.size:
                    kind, cid, size = HEAD.unpack_from(buffer)
                    if len(buffer) < HEAD.size + size:
                        break
                    data = bytes(buffer[HEAD.size : HEAD.size + size])
                    del buffer[: HEAD.size + size]
                    self._frame(kind, cid, data, group, handle)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass  # the exec ended with its container

    def _frame(self, kind: int, cid: int, data: bytes, group: anyio.abc.TaskGroup, handle: Handler) -> None:
        if kind == LISTENING:
            self._listening.set()
            return
        if kind == OPEN:
            tunnel = self._tunnels[cid] = _Tunnel(self, cid)
            group.start_soon(_handled, handle, tunnel)
            return
        tunnel_or_none = self._tunnels.get(cid)
        if tunnel_or_none is None:
            return
        if kind == DATA:
            tunnel_or_none.arrived(data)
        elif kind == EOF:
            tunnel_or_none.arrived(None)
        elif kind == ACK and len(data) == 4:
            tunnel_or_none.acknowledged(struct.unpack(">I", data)[0])
        elif kind == CLOSE:
            tunnel_or_none.ended()


async def _handled(handle: Handler, tunnel: _Tunnel) -> None:
    """`handle` owns the stream (closes it); a tunnel it never closed is closed here."""
    try:
        await handle(tunnel)
    finally:
        with anyio.CancelScope(shield=True):
            await tunnel.aclose()
