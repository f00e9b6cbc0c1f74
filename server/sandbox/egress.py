"""The egress proxy of a coding-agent CLI member: its container's only way out, to its allowlist only.

Interface (the CLI members of issue 16 use it through sandbox/member.py):

    extra = [*team.sandbox.allow_hosts, *settings.egress_allow]
    allow = allowlist_for("claude-code", base_url=agent.base_url, extra=extra)
    async with egress_proxy(allow, route=route, label=f"{job}/{letter}") as proxy:
        sandbox = MemberSandbox(client, owner, proxy)
        await sandbox.start(workspace, peers, job_id, letter, limits)   # network none, the relay attached
        proxy.serve_key(ProviderKey(url, key, "anthropic"))  # a key login: the key stays here
        proxy.meter_to(charge, stopped)  # its calls' usage to the member's charge; none once `stopped`
        result = await sandbox.exec("claude -p ...", timeout_s=600, environment={...})
    proxy.denied  # the (method, host, port) it refused, for the transcript; never a path, header or body
    proxy.spent   # the usage its provider's responses reported for the keyed calls it forwarded

The container has no network (`network_mode=none`). The proxy has no listener of its own: each connection
comes in through a feed given to `attach`, the member's relay (sandbox/egress_channel.py), which listens
on 127.0.0.1:3128 inside the container, where `HTTPS_PROXY`/`HTTP_PROXY` point, and carries every
connection over the engine's API to here. So no host socket, port or network is shared with the engine,
and nothing but the member's own relay can open a connection to its proxy.
The design follows Anthropic's sandbox-runtime (an allowlisting proxy outside the sandbox).

What it speaks: `CONNECT host:port` (HTTPS and anything TLS: the tunnel is opaque bytes), and plain-HTTP
requests in absolute form (`GET http://127.0.0.1:8080/v1/... HTTP/1.1`, as clients send them to a proxy),
forwarded with `Connection: close` so one client connection can never be reused towards another host.
For a member that logs in with a key, the proxy holds the key (`serve_key`) and serves its provider in
reverse: a request to the bridge itself (origin form, or absolute form naming 127.0.0.1:3128) goes to the
member's endpoint with the real key in place of the placeholder the container holds (sandbox/provider_key.py).
A member's key is its owner's plan, so while the proxy holds it:
- only the calls a CLI makes for a turn reach the provider (sandbox/provider_wire.py `ENDPOINTS`, by
  method and path; no batches, files or admin APIs), the rest get a 403 and are logged;
- the proxy meters what it forwards: the usage each response reports, read as it passes, goes to the
  member's charge (`meter_to`) before the response's last bytes reach the container, so its count is the
  member's spend, whatever the CLI says; once `stopped` says the member's budget or the job's is
  reached, no further request goes out (a 403 whose JSON error every CLI shows);
- no tunnel or plain request reaches the provider's own host: the member needs none (its requests go to
  the bridge), and a tunnel there could carry the workspace out under a key of the member's own.
Anything else, and any host:port off the allowlist, gets a 403 (or a 400 for what is not HTTP) and the
connection closes. Denials are logged with the method, host and port only: a URL can carry a key (Gemini's
`?key=`), so queries, headers and bodies are never logged (a keyed call refused for its endpoint logs its
path without the query).

Why in Conclave's process, on its event loop: the proxy lives exactly as long as the member (an async context
manager in the job's task group), so cancelling a job closes every feed and tunnel with it; there is no
child process to start, watch or leak, and the bytes it copies are I/O waits, not CPU work.

The host names are resolved here, on the host; the container itself has no DNS. A name on the allowlist is
trusted wherever it resolves (as in sandbox-runtime): the allowlist names public provider hosts.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from conclave.config.hosts import normal_host
from conclave.errors import SandboxError
from conclave.sandbox.allowlist import Allowlist
from conclave.sandbox.provider_key import (
    HOP_HEADERS,
    KeyScrubber,
    ProviderKey,
    is_bridge,
    provider_head,
    tls_context,
)
from conclave.sandbox.provider_wire import Billed, ResponseMeter, Wire, endpoint_refusal
from conclave.sandbox.route import EgressRoute

__all__ = ["Denial", "EgressProxy", "Feed", "egress_proxy"]

logger = logging.getLogger(__name__)

MAX_HEAD = 32 * 1024  # a request line and headers; a client sending more is not a proxy client
HEAD_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 30.0
MAX_TUNNELS = 64  # connections open at once per member; more wait their turn
CHUNK = 65536
# A source of client connections: it hands each to the proxy's `handle` (sandbox/egress_channel.py).
Feed = Callable[[Callable[[anyio.abc.ByteStream], Awaitable[None]]], Awaitable[None]]
# a keyed call's usage, or the part of it just read; True with a call's first part (it opens a call)
Spend = Callable[[Billed, bool], Awaitable[None]]
Stopped = Callable[[], str | None]  # why the member may send no more calls (its budget, the job's), or None


@dataclass(frozen=True)
class Denial:
    """One refused request: what it asked for, without path, query, headers or body."""

    method: str
    host: str
    port: int


class _Refused(Exception):
    def __init__(self, status: int, reason: str, message: str, *, api: bool = False) -> None:
        """`api`: the body is a provider-style JSON error, which a CLI shows as its provider's."""
        super().__init__(message)
        self.status, self.reason, self.api = status, reason, api


@dataclass(frozen=True)
class _Request:
    method: str
    host: str
    port: int
    forward: bytes | None  # the rewritten head for plain HTTP; None for CONNECT
    tls: bool = False  # the proxy opens TLS to the host (a key-mode member's https provider)
    # a request to the bridge itself: its path and headers, for the member's provider (`serve_key`)
    to_bridge: tuple[str, list[bytes]] | None = None
    scrubbed: str | None = field(default=None, repr=False)  # a key to mask in the response (`KeyScrubber`)
    metered: Wire | None = None  # a call with the member's key: its response's usage is the member's spend


class EgressProxy:
    """Serves one member's connections: admits the allowlist, refuses and records the rest."""

    def __init__(self, allowlist: Allowlist, *, route: EgressRoute, label: str = "") -> None:
        """`route`: how an admitted host is reached, and the extra CA trusted there (sandbox/route.py)."""
        self.allowlist, self.label, self.route = allowlist, label, route
        self.denied: list[Denial] = []
        self.admitted = 0
        self.spent = Billed()  # what the responses to the member's keyed calls reported, all together
        self._spend: Spend | None = None
        self._stopped: Stopped | None = None
        self._limiter = anyio.CapacityLimiter(MAX_TUNNELS)
        self._provider: ProviderKey | None = None
        self._tls: ssl.SSLContext | None = None
        self._feeds: anyio.abc.TaskGroup | None = None  # set while `egress_proxy` serves

    def attach(self, feed: Feed) -> None:
        """Serve the connections `feed` brings (it calls `handle` for each) while the proxy lives; a feed
        that fails ends alone, never the proxy."""
        if self._feeds is None:
            raise SandboxError("the egress proxy is not serving: attach a feed inside `egress_proxy`")
        self._feeds.start_soon(self._fed, feed)

    async def _fed(self, feed: Feed) -> None:
        try:
            await feed(self.handle)
        except Exception as exc:  # one member's relay failing must not stop the job's other proxies
            logger.warning("egress %s: a feed failed (%s: %s)", self.label or "-", type(exc).__name__, exc)

    @property
    def open_connections(self) -> int:
        """Client connections being served now: 0 once every exchange is over, so a caller may close the
        proxy without cancelling one mid-read."""
        return int(self._limiter.borrowed_tokens)

    def serve_key(self, provider: ProviderKey) -> None:
        """Hold a key-mode member's key: from now on a request to the bridge itself goes to
        `provider.url` with that key (sandbox/provider_key.py). The provider's host must be on the
        allowlist like any other (its CLI's official host, or its base_url's)."""
        self._provider = provider

    def meter_to(self, spend: Spend, stopped: Stopped) -> None:
        """Charge each keyed call's usage to `spend` as its response passes, and send no call once
        `stopped` gives a reason (the member's budget, or the job's, is reached)."""
        self._spend, self._stopped = spend, stopped

    async def handle(self, client: anyio.abc.ByteStream) -> None:
        """One client connection; whatever goes wrong with it ends it alone, never the listener."""
        try:
            await self._handle(client)
        except Exception as exc:  # one connection's failure must not stop the member's proxy
            logger.info("egress %s: a connection failed (%s)", self.label or "-", type(exc).__name__)

    async def _handle(self, client: anyio.abc.ByteStream) -> None:
        """Read the request head, then tunnel, forward or refuse."""
        async with client, self._limiter:
            reader = BufferedByteReceiveStream(client)
            try:
                with anyio.fail_after(HEAD_TIMEOUT_S):
                    head = await reader.receive_until(b"\r\n\r\n", MAX_HEAD)
                request = parse_request(head)
                if request.method == "CONNECT" and self._provider and is_bridge(request.host, request.port):
                    request = await self._tunnelled(client, reader)
                request = self._routed(request)
                if not self.allowlist.admits(request.host, request.port):
                    raise self._deny(request)
                if request.metered is None and self._keyed_host(request):
                    raise self._deny(
                        request, "its key is added by this proxy: the member needs no tunnel there"
                    )
                upstream = await self._connect(request)
            except _Refused as refused:
                await _reply(client, refused.status, refused.reason, str(refused), api=refused.api)
                return
            except (
                TimeoutError,
                anyio.IncompleteRead,
                anyio.DelimiterNotFound,
                anyio.EndOfStream,
                anyio.BrokenResourceError,
                anyio.ClosedResourceError,
            ):
                return  # a client that went away or never finished its head: nothing to answer
            self.admitted += 1
            async with upstream:  # the provider's response streams back as it comes, through `_splice`
                if request.forward is None:
                    await client.send(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                else:
                    await upstream.send(request.forward)
                # the reader hands out first what the client sent right after its head (a body, a TLS hello)
                scrubber = KeyScrubber(request.scrubbed) if request.scrubbed else None
                meter = None if request.metered is None else _Metered(ResponseMeter(request.metered), self)
                await _splice(reader, client, upstream, scrubber, meter)

    async def _tunnelled(self, client: anyio.abc.ByteStream, reader: BufferedByteReceiveStream) -> _Request:
        """A CONNECT to the bridge itself (Node's fetch tunnels even plain http through its proxy): the
        request inside the tunnel is one to the bridge, so to the member's provider."""
        await client.send(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        with anyio.fail_after(HEAD_TIMEOUT_S):
            head = await reader.receive_until(b"\r\n\r\n", MAX_HEAD)
        request = parse_request(head)
        if request.to_bridge is None:
            raise _Refused(
                400, "Bad Request", "conclave egress: a tunnel to the bridge carries plain HTTP to it"
            )
        return request

    def _routed(self, request: _Request) -> _Request:
        """A request to the bridge itself, as the request to the member's provider (with its key)."""
        if request.to_bridge is None:
            return request
        if self._provider is None:
            raise _Refused(
                400, "Bad Request", "conclave egress: send https through CONNECT, http as an absolute URL"
            )
        path, headers = request.to_bridge
        provider = self._provider
        denial = Denial(request.method, provider.host, provider.port)
        if self._stopped is not None and (why := self._stopped()) is not None:
            self.denied.append(denial)
            logger.warning("egress %s: refused %s (%s)", self.label or "-", request.method, why)
            raise _Refused(
                403, "Forbidden", f"conclave egress: no more calls to the provider: {why}", api=True
            )
        refusal = endpoint_refusal(provider.wire, provider.prefix, request.method, path)
        if refusal is not None:
            self.denied.append(denial)
            logger.warning(  # the path without its query: a query can hold a key (Gemini's `?key=`)
                "egress %s: refused %s %s on %s:%d (not a call a CLI turn makes)",
                self.label or "-",
                request.method,
                path.partition("?")[0][:200],
                provider.host,
                provider.port,
            )
            raise _Refused(403, "Forbidden", refusal, api=True)
        head = provider_head(request.method, path, headers, provider)
        return _Request(
            request.method,
            provider.host,
            provider.port,
            head,
            tls=provider.tls,
            scrubbed=provider.key,
            metered=provider.wire,
        )

    def _keyed_host(self, request: _Request) -> bool:
        """Whether a request that is not to the bridge names the host:port this proxy sends the key to."""
        provider = self._provider
        return provider is not None and (request.host, request.port) == (provider.host, provider.port)

    def _deny(self, request: _Request, why: str = "") -> _Refused:
        """Record and log the denial; the 403 to send back."""
        denial = Denial(request.method, request.host, request.port)
        self.denied.append(denial)
        logger.warning(
            "egress %s: refused %s %s:%d (%s)",
            self.label or "-",
            denial.method,
            denial.host,
            denial.port,
            why or "not on its allowlist",
        )
        message = (
            f"conclave egress: {request.host}:{request.port} is not on this member's allowlist "
            "(docs/subscriptions.md says how to add a host)"
        )
        if why:
            message = f"conclave egress: {request.host}:{request.port} is refused: {why}"
        return _Refused(403, "Forbidden", message)

    async def _charge(self, usage: Billed, first: bool) -> None:
        """Count one keyed call's usage (or its newly read part) and hand it to the member's charge."""
        self.spent = self.spent + usage
        if self._spend is None:
            return
        try:
            await self._spend(usage, first)
        except Exception:  # the charge's failure must not cut the member's response
            logger.warning("egress %s: charging a call's usage failed", self.label or "-", exc_info=True)

    async def _connect(self, request: _Request) -> anyio.abc.ByteStream:
        host, port = self.route.target(request.host, request.port)  # admitted already: never widens it
        try:
            with anyio.fail_after(CONNECT_TIMEOUT_S):
                if not request.tls:
                    return await anyio.connect_tcp(host, port)
                if self._tls is None:  # reading the system's roots blocks: once, in a worker
                    ca = self.route.extra_ca
                    self._tls = await anyio.to_thread.run_sync(tls_context, None if ca is None else str(ca))
                # a provider that closes without TLS's close_notify has still sent its whole response
                return await anyio.connect_tcp(
                    host,
                    port,
                    tls=True,
                    ssl_context=self._tls,
                    tls_hostname=request.host,
                    tls_standard_compatible=False,
                )
        except (OSError, TimeoutError, anyio.BrokenResourceError) as exc:  # TLS failures included
            logger.info(
                "egress %s: %s:%d unreachable (%s)",
                self.label or "-",
                request.host,
                request.port,
                type(exc).__name__,
            )
            raise _Refused(
                502, "Bad Gateway", f"conclave egress: {request.host}:{request.port} did not answer"
            ) from exc


def parse_request(head: bytes) -> _Request:
    """The target of a proxy request head (without its final blank line); `_Refused` when it is not one.

    A request to the bridge itself (origin form, or absolute form naming 127.0.0.1:3128) carries its path
    and headers in `to_bridge`: the member's provider, when its proxy holds its key (`serve_key`)."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise _Refused(400, "Bad Request", "conclave egress: not an HTTP/1.x proxy request")
    method, target = parts[0].decode("ascii", "replace"), parts[1].decode("ascii", "replace")
    if method == "CONNECT":
        host, port = _authority(target)
        return _Request(method, host, port, None)
    if target.startswith("/"):
        return _Request(method, "", 0, None, to_bridge=(target, lines[1:]))
    url = urlsplit(target)
    if url.scheme != "http" or not url.hostname:
        raise _Refused(
            400, "Bad Request", "conclave egress: send https through CONNECT, http as an absolute URL"
        )
    try:
        port = url.port or 80
    except ValueError as exc:
        raise _Refused(400, "Bad Request", "conclave egress: a port outside 1-65535") from exc
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    if is_bridge(url.hostname, port):
        return _Request(method, normal_host(url.hostname), port, None, to_bridge=(path, lines[1:]))
    headers = [
        line for line in lines[1:] if line and line.split(b":", 1)[0].strip().lower() not in HOP_HEADERS
    ]
    if not any(line.split(b":", 1)[0].strip().lower() == b"host" for line in headers):
        headers.insert(0, b"Host: " + url.netloc.encode("ascii", "replace"))
    forward = b"\r\n".join([f"{method} {path} HTTP/1.1".encode(), *headers, b"Connection: close", b"", b""])
    return _Request(method, normal_host(url.hostname), port, forward)


def _authority(target: str) -> tuple[str, int]:
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host or not 0 < int(port) < 65536:
        raise _Refused(400, "Bad Request", "conclave egress: CONNECT needs host:port")
    return normal_host(host), int(port)


async def _reply(
    client: anyio.abc.ByteStream, status: int, reason: str, message: str, *, api: bool = False
) -> None:
    """The refusal; with `api`, a JSON error in the shape every provider SDK reads its message from
    (Anthropic's `type`/`error.type`, OpenAI's and Gemini's `error.message`, Gemini's `error.status`)."""
    body, kind = (message + "\n").encode(), "text/plain"
    if api:
        error = {
            "type": "permission_error",
            "code": status,
            "status": "PERMISSION_DENIED",
            "message": message,
        }
        body, kind = json.dumps({"type": "error", "error": error}).encode(), "application/json"
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
    with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        await client.send(head.encode() + b"Connection: close\r\n\r\n" + body)


@dataclass
class _Metered:
    """One keyed call's response as it passes: each part of its usage is charged when it is read,
    before the bytes that carry it go on to the container (whose next call then finds it counted)."""

    meter: ResponseMeter
    proxy: EgressProxy
    charged: Billed = field(default_factory=Billed)

    async def read(self, chunk: bytes | None) -> None:
        """`chunk` of the response (None: it ended); charge what it says beyond what was charged."""
        usage = self.meter.feed(chunk) if chunk is not None else self.meter.finish()
        if usage != self.charged:
            new = usage - self.charged
            first, self.charged = self.charged == Billed(), usage
            await self.proxy._charge(new, first)


async def _splice(
    reader: BufferedByteReceiveStream,
    client: anyio.abc.ByteStream,
    upstream: anyio.abc.ByteStream,
    scrubber: KeyScrubber | None = None,
    meter: _Metered | None = None,
) -> None:
    """Copy both ways until both sides are done; half-closes pass through (not into TLS, which has
    none: the provider closes after its response, `Connection: close`), an error ends both. `scrubber`
    masks a key in what comes back; `meter` reads its usage first."""

    async def copy(
        source: anyio.abc.ByteReceiveStream,
        sink: anyio.abc.ByteStream,
        scrub: KeyScrubber | None = None,
        metered: _Metered | None = None,
    ) -> None:
        try:
            try:
                async for chunk in source:
                    if metered is not None:
                        await metered.read(chunk)
                    out = scrub.feed(chunk) if scrub is not None else chunk
                    if out:
                        await sink.send(out)
            finally:
                if metered is not None:  # a cut response still counts what it said it billed
                    with anyio.CancelScope(shield=True):
                        await metered.read(None)
            if scrub is not None and (rest := scrub.flush()):
                await sink.send(rest)
            await sink.send_eof()
        except NotImplementedError:
            pass  # a TLS stream cannot half-close
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            group.cancel_scope.cancel()

    async with anyio.create_task_group() as group:
        group.start_soon(copy, reader, upstream)
        group.start_soon(copy, upstream, client, scrubber, meter)


@asynccontextmanager
async def egress_proxy(
    allowlist: Allowlist, *, route: EgressRoute, label: str = ""
) -> AsyncIterator[EgressProxy]:
    """Serve `allowlist` to the feeds attached (`EgressProxy.attach`) until exit, which ends them all."""
    proxy = EgressProxy(allowlist, label=label, route=route)
    async with anyio.create_task_group() as group:
        proxy._feeds = group
        try:
            yield proxy
        finally:
            proxy._feeds = None
            group.cancel_scope.cancel()
