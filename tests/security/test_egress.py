"""A coding-agent CLI member's container reaches its allowlist through the egress proxy, and nothing else.

Each probe runs inside a container started exactly as CLI members are (sandbox/member.py: network none,
the relay on 127.0.0.1:3128 carrying connections over the engine's API to the proxy, the proxy variables
set), in the CLI image.
The host runs a listener on all its addresses that no probe may reach; the control test shows the same
probe does reach it from a container with a network, so the probes can tell an escape from a failure.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from conclave.config.models import SandboxSpec
from conclave.errors import SandboxError
from conclave.sandbox import egress_channel
from conclave.sandbox.allowlist import allowlist_for
from conclave.sandbox.clis_image import build_clis_image
from conclave.sandbox.container import Sandbox
from conclave.sandbox.egress import EgressProxy, egress_proxy
from conclave.sandbox.engine import Owner, connect, engine_status
from conclave.sandbox.member import PROXY_URL, MemberSandbox
from conclave.sandbox.route import DirectRoute
from tests.fakes.counting_docker import CountingApi
from tests.fakes.script import Reply
from tests.fakes.server import FakeProviders

pytestmark = pytest.mark.anyio
SPEC = SandboxSpec(memory="256m", cpus=1, pids=128)

# Inside the container: one probe per run, printing one JSON line (python3 is in every sandbox image).
PROBE = r"""
import json, os, socket, sys, urllib.request
kind, arg = sys.argv[1], sys.argv[2]
out = {}
try:
    if kind == "http":  # through the proxy: urllib reads HTTP(S)_PROXY like the CLIs do
        body = sys.argv[3].encode() if len(sys.argv) > 3 else None
        headers = {"content-type": "application/json", "x-api-key": "k", "anthropic-version": "2023-06-01"}
        request = urllib.request.Request(arg, data=body, headers=headers)
        with urllib.request.urlopen(request, timeout=10) as reply:
            out = {"status": reply.status, "body": reply.read().decode()}
    elif kind == "tcp":  # straight to an address, no proxy
        host, port = arg.rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=5).close()
        out = {"connected": True}
    elif kind == "dns":
        out = {"resolved": socket.getaddrinfo(arg, 443)[0][4][0]}
except urllib.error.HTTPError as exc:
    out = {"status": exc.code, "body": exc.read().decode()}
except Exception as exc:
    out = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(out))
"""


@pytest.fixture(scope="session")
def clis_image() -> str:
    """The CLI image (`clis_tag()`, which a member's sandbox runs), built once (a few minutes on a new
    machine; a no-op when its tag exists)."""
    status = engine_status()
    if not status.available:
        pytest.skip(f"needs the Docker engine ({status.error}); .ci/run provides it")
    report = anyio.run(build_clis_image)
    print(
        f"\nCLI image {report.tag}: {report.size_bytes / 1e6:.0f} MB, built={report.built}, "
        f"{report.seconds:.0f} s"
    )
    return report.tag


class HostListener:
    """A TCP listener on every host address: whoever connects is recorded. Nothing inside may reach it."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("0.0.0.0", 0))
        self.port = self.sock.getsockname()[1]
        self.peers: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            self.peers.append(peer[0])
            conn.close()


@pytest.fixture
def listener() -> Iterator[HostListener]:
    found = HostListener()
    yield found
    found.sock.close()


def bridge_gateway() -> str:
    """The host's address on Docker's default bridge (what a container with a network would route to)."""
    (config, *_) = connect().networks.get("bridge").attrs["IPAM"]["Config"]
    return config.get("Gateway") or str(ipaddress.ip_network(config["Subnet"])[1])


def host_address() -> str:
    """The host's address on its default route (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe_socket:
        try:
            probe_socket.connect(("192.0.2.200", 9))
            return str(probe_socket.getsockname()[0])
        except OSError:
            return "127.0.0.1"


@pytest.fixture
async def member(
    clis_image: str, tmp_path: Path, fakes: FakeProviders
) -> AsyncIterator[tuple[MemberSandbox, EgressProxy]]:
    """A Claude Code member's container whose base_url is the fake Anthropic server on the host."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    job = tmp_path / "job"
    job.mkdir(mode=0o700)
    allow = allowlist_for("claude-code", base_url=fakes.base_url("anthropic", "A"))
    async with egress_proxy(allow, route=DirectRoute(), label="cj-egress/A") as proxy:
        box = MemberSandbox(connect(), Owner("security-" + os.urandom(4).hex()), proxy)
        try:
            await box.start(workspace, {}, "cj-egress", "A", SPEC)
            (workspace / "probe.py").write_text(PROBE)
            yield box, proxy
        finally:
            with anyio.CancelScope(shield=True):
                await box.stop()


async def probe(box: Sandbox, *args: str) -> dict[str, Any]:
    quoted = " ".join("'" + arg.replace("'", "'\\''") + "'" for arg in args)
    result = await box.exec(f"python3 probe.py {quoted}", timeout_s=30)
    assert result.exit_code == 0, result.as_text()
    return json.loads(result.stdout.strip().splitlines()[-1])


async def test_the_allowlisted_fake_provider_is_reached_through_the_proxy(
    member: tuple[MemberSandbox, EgressProxy], fakes: FakeProviders
) -> None:
    box, proxy = member
    fakes.script.enqueue("A", Reply(text="hello through the bridge"))
    body = json.dumps(
        {"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    )
    seen = await probe(box, "http", fakes.base_url("anthropic", "A") + "/v1/messages", body)
    assert seen.get("status") == 200, seen
    assert "hello through the bridge" in seen["body"]
    assert len(fakes.script.requests_of("A")) == 1 and proxy.admitted == 1 and proxy.denied == []


async def test_hosts_off_the_allowlist_are_refused_by_the_proxy(
    member: tuple[MemberSandbox, EgressProxy], fakes: FakeProviders, listener: HostListener
) -> None:
    box, proxy = member
    for url in (
        "https://evil.example/steal",  # CONNECT to a name not listed
        "http://api.openai.com/v1/models",  # another provider: not this CLI's
        f"http://127.0.0.1:{listener.port}/",  # a host port that is not the fake's
        f"http://{bridge_gateway()}:{fakes.port}/anthropic/A/v1/messages",  # the fake, under another name
    ):
        seen = await probe(box, "http", url)
        assert seen.get("status") == 403 or "403" in seen.get("error", ""), (url, seen)
    assert [(d.host, d.port) for d in proxy.denied][:2] == [("evil.example", 443), ("api.openai.com", 80)]
    assert len(proxy.denied) == 4 and listener.peers == [] and fakes.script.requests_of("A") == []


async def test_no_direct_route_to_any_host_port(
    member: tuple[MemberSandbox, EgressProxy], fakes: FakeProviders, listener: HostListener
) -> None:
    box, _ = member
    gateway = bridge_gateway()
    for target in (
        f"{gateway}:{listener.port}",
        f"{gateway}:{fakes.port}",
        f"127.0.0.1:{fakes.port}",
        f"{host_address()}:{listener.port}",
        f"172.17.0.1:{listener.port}",
        "1.1.1.1:443",
        f"::1:{fakes.port}",
    ):
        seen = await probe(box, "tcp", target)
        assert "connected" not in seen, (target, seen)
    assert listener.peers == []


async def test_no_dns(member: tuple[MemberSandbox, EgressProxy]) -> None:
    box, _ = member
    for name in ("api.anthropic.com", "example.com", "host.docker.internal"):
        seen = await probe(box, "dns", name)
        assert "resolved" not in seen, (name, seen)


async def test_the_agent_cannot_stop_or_replace_the_bridge(member: tuple[MemberSandbox, EgressProxy]) -> None:
    box, _ = member
    relays = (
        'for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = conclave-egress ] && echo ${p#/proc/}; '
        "done"
    )
    # the pause: where a command runs as an exec (its runner did not start, on a loaded host), Podman
    # drops what it writes before its attach is joined (sandbox/command_runner.py), kill's refusal too
    result = await box.exec(f"sleep 0.2; kill -9 $({relays}); sleep 0.3; {relays}", timeout_s=30)
    assert result.stdout.strip(), "the relay (the keeper's) survives the agent's kill"
    assert "Operation not permitted" in result.stderr
    result = await box.exec(
        f"cat /proc/$({relays} | head -1)/environ /proc/$({relays} | head -1)/fd/0", timeout_s=30
    )
    assert result.exit_code != 0 and "Permission denied" in result.stderr, "nor read its streams"
    result = await box.exec(
        "python3 -c \"import socket; socket.create_server(('127.0.0.1', 3128))\"", timeout_s=30
    )
    assert result.exit_code != 0 and "Address already in use" in result.stderr


async def test_control_the_same_probe_escapes_from_a_container_with_a_network(
    clis_image: str, tmp_path: Path, listener: HostListener
) -> None:
    """Not a member: a plain sandbox on `bridge`, to show the TCP probe sees an escape when there is one."""
    box = Sandbox(connect(), Owner("security-" + os.urandom(4).hex()))
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    try:
        await box.start(workspace, {}, "cj-control", "A", SandboxSpec(image=clis_image, network="bridge"))
        (workspace / "probe.py").write_text(PROBE)
        seen = await probe(box, "tcp", f"{bridge_gateway()}:{listener.port}")
    finally:
        with anyio.CancelScope(shield=True):
            await box.stop()
    assert seen == {"connected": True} and listener.peers


async def test_proxy_variables_point_at_the_bridge(member: tuple[MemberSandbox, EgressProxy]) -> None:
    box, _ = member
    result = await box.exec("env | sort; ls -ld $HOME; cat /proc/net/route | wc -l", timeout_s=30)
    env = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert env["HTTPS_PROXY"] == env["http_proxy"] == PROXY_URL and "NO_PROXY" not in env
    assert env["HOME"] == "/home/sandbox" and "drwx------" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "1", "no route at all (the header line only)"


async def test_login_files_go_to_the_private_home_only(
    member: tuple[MemberSandbox, EgressProxy], tmp_path: Path
) -> None:
    box, _ = member
    secret = b'{"token": "sk-test-\x00\xff-secret"}'
    await box.write_home_file(".claude/.credentials.json", secret)
    result = await box.exec("stat -c '%a %u' $HOME/.claude $HOME/.claude/.credentials.json", timeout_s=30)
    assert result.stdout.split("\n")[:2] == [f"700 {box.uid}", f"600 {box.uid}"]
    copied = await box.exec("base64 -w0 $HOME/.claude/.credentials.json", timeout_s=30)
    assert copied.stdout.strip() == base64.b64encode(secret).decode()
    assert b"sk-test" not in b"".join(
        p.read_bytes() for p in (tmp_path / "workspace").rglob("*") if p.is_file()
    )
    for bad in ("../escape", "/etc/passwd", ""):
        with pytest.raises(SandboxError):
            await box.write_home_file(bad, b"x")


async def test_a_real_cli_reaches_its_fake_provider_through_the_bridge(
    member: tuple[MemberSandbox, EgressProxy], fakes: FakeProviders
) -> None:
    """Claude Code (its native binary, Bun's fetch) follows the proxy variables to the allowlisted fake."""
    box, proxy = member
    fakes.script.set_default("A", Reply(text="hello from the fake"))
    result = await box.exec(
        "claude -p 'say hello' --output-format json --model claude-sonnet-4-5 </dev/null",
        timeout_s=120,
        environment={
            "ANTHROPIC_API_KEY": "sk-ant-fake",
            "ANTHROPIC_BASE_URL": fakes.base_url("anthropic", "A"),
            "IS_SANDBOX": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        },
    )
    assert result.exit_code == 0, result.as_text()
    assert json.loads(result.stdout)["result"] == "hello from the fake"
    assert proxy.admitted >= 1 and len(fakes.script.requests_of("A")) >= 1


# Inside: a first connection asks for a big reply and never reads it; a second one must still get its
# reply. The relay (sandbox/egress_channel.py) keeps each connection within its own window, so the
# first one's unread bytes hold back that connection alone.
STALLED = r"""
import json, socket, sys, urllib.request
url, body = sys.argv[1], sys.argv[2].encode()
stalled = socket.create_connection(("127.0.0.1", 3128))
head = f"POST {url} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\nx-api-key: k\r\n"
head += f"anthropic-version: 2023-06-01\r\nContent-Length: {len(body)}\r\n\r\n"
stalled.sendall(head.encode() + body)  # and never read
request = urllib.request.Request(url, data=body, headers={"content-type": "application/json",
    "x-api-key": "k", "anthropic-version": "2023-06-01"})
with urllib.request.urlopen(request, timeout=20) as reply:
    print(json.dumps({"status": reply.status, "bytes": len(reply.read())}))
"""


async def test_a_client_that_stops_reading_holds_back_only_its_own_connection(
    member: tuple[MemberSandbox, EgressProxy], fakes: FakeProviders, tmp_path: Path
) -> None:
    box, proxy = member
    for _ in range(2):  # whichever reply the stalled connection gets: far past its window and buffers
        fakes.script.enqueue("A", Reply(text="x" * 48_000_000))
    (tmp_path / "workspace" / "stalled.py").write_text(STALLED)
    body = json.dumps(
        {"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    )
    url = fakes.base_url("anthropic", "A") + "/v1/messages"
    result = await box.exec(f"python3 stalled.py {url} '{body}'", timeout_s=60)
    assert result.exit_code == 0, result.as_text()
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["status"] == 200 and seen["bytes"] > 48_000_000 and proxy.admitted == 2


# Inside: a request whose body is many windows long (the relay's frames carry it to the host, which
# acknowledges as it delivers: sandbox/egress_channel.py), read from a file (an argument cannot be 4 MB).
UPLOAD = r"""
import json, sys, urllib.request
url, body = sys.argv[1], open(sys.argv[2], "rb").read()
request = urllib.request.Request(url, data=body, headers={"content-type": "application/json",
    "x-api-key": "k", "anthropic-version": "2023-06-01"})
with urllib.request.urlopen(request, timeout=60) as reply:
    print(json.dumps({"status": reply.status, "bytes": len(reply.read())}))
"""


async def test_a_request_many_windows_long_reaches_the_provider_whole(
    member: tuple[MemberSandbox, EgressProxy], fakes: FakeProviders, tmp_path: Path
) -> None:
    box, proxy = member
    fakes.script.enqueue("A", Reply(text="read it all"))
    text = "x" * (4 * egress_channel.WINDOW * 4)  # 4 MB: sixteen windows
    body = {"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": text}]}
    (tmp_path / "workspace" / "upload.py").write_text(UPLOAD)
    (tmp_path / "workspace" / "body.json").write_text(json.dumps(body))
    url = fakes.base_url("anthropic", "A") + "/v1/messages"
    result = await box.exec(f"python3 upload.py {url} body.json", timeout_s=60)
    assert result.exit_code == 0, result.as_text()
    assert json.loads(result.stdout.strip().splitlines()[-1])["status"] == 200
    (seen,) = fakes.script.requests_of("A")
    assert seen.body["messages"][0]["content"] == text and proxy.admitted == 1


async def test_the_way_out_comes_back_after_the_container_restarts(
    member: tuple[MemberSandbox, EgressProxy], fakes: FakeProviders
) -> None:
    """A restart (a command that overran, the disk cap, a killed keeper) ends the relay's exec with the
    container; its channel starts another, and the member's next request goes out as before."""
    box, proxy = member
    await anyio.to_thread.run_sync(box._restart)
    fakes.script.enqueue("A", Reply(text="after the restart"))
    body = json.dumps(
        {"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    )
    seen = await probe(box, "http", fakes.base_url("anthropic", "A") + "/v1/messages", body)
    assert seen.get("status") == 200 and "after the restart" in seen["body"], seen
    assert proxy.admitted == 1


class SilentFirstRelay(CountingApi):
    """The real API, but the member's first relay is a process that never answers: what the host saw when
    Podman 4.3 dropped what an exec wrote before its attach was joined (sandbox/egress_channel.py)."""

    def exec_create(self, container: str, cmd: Any, **options: Any) -> Any:
        if cmd[:2] == ["python3", "-I"] and cmd[-1] == egress_channel.RELAY and not self.commands:
            cmd = ["sleep", "120"]
        return super().exec_create(container, cmd, **options)


async def test_a_relay_that_never_says_it_listens_is_started_again(
    clis_image: str, tmp_path: Path, fakes: FakeProviders, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the member's start waited for its relay's LISTENING and failed after 10 s."""
    monkeypatch.setattr(egress_channel, "READY_S", 1.0)  # 5 s, made short to watch it pass
    client = connect()
    api = client.api = SilentFirstRelay(client.api)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    allow = allowlist_for("claude-code", base_url=fakes.base_url("anthropic", "A"))
    async with egress_proxy(allow, route=DirectRoute(), label="cj-egress/A") as proxy:
        box = MemberSandbox(client, Owner("security-" + os.urandom(4).hex()), proxy)
        try:
            await box.start(workspace, {}, "cj-egress", "A", SPEC)
            (workspace / "probe.py").write_text(PROBE)
            fakes.script.enqueue("A", Reply(text="through the second relay"))
            body = json.dumps(
                {"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
            )
            seen = await probe(box, "http", fakes.base_url("anthropic", "A") + "/v1/messages", body)
            assert seen.get("status") == 200 and "through the second relay" in seen["body"], seen
            relays = [cmd for cmd in api.commands if cmd[-1] == egress_channel.RELAY]
            assert api.commands[0] == ["sleep", "120"] and len(relays) == 1 and proxy.admitted == 1
        finally:
            with anyio.CancelScope(shield=True):
                await box.stop()
