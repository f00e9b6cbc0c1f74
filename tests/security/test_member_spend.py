"""What a CLI member can spend of its owner's plan: what its egress proxy forwarded, and no more.

A member that logs in with a key holds only a placeholder; its proxy adds the key (sandbox/egress.py).
A process in its container (the CLI, or a shell command a prompt-injected model runs) reaches the
proxy through the bridge, exactly as the requests below do (origin form to 127.0.0.1:3128, carried by
the member's relay as one connection each: tests/test_egress.py `ask`). Against the fake providers
(tests/fakes/), each with its own `bill`:
- only the calls a CLI turn makes pass with the key: batches, files, fine-tuning, caches and admin APIs
  are refused (403) and logged, and never reach the provider;
- the proxy counts what it forwarded from the provider's own responses (streamed or not, on every wire
  the four CLIs speak with a key), equal to the fake's bill;
- a loop of requests stops within one request of the member's budget;
- with the key held, no tunnel (or plain request) reaches the provider's own host.
The same, with the real CLIs in their containers, is test_real_clis_are_counted_as_billed below.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from conclave.backends.base import Usage
from conclave.backends.retry import RetryPolicy
from conclave.clis.cli_adapter import PLACEHOLDER_KEY
from conclave.coordination.budget import MemberLimit
from conclave.jobs.read.views import JobView
from conclave.jobs.service import JobService
from conclave.sandbox.allowlist import CliName, allowlist_for
from conclave.sandbox.egress import EgressProxy, egress_proxy
from conclave.sandbox.provider_key import ProviderKey
from conclave.sandbox.provider_wire import Billed, Wire
from conclave.sandbox.route import DirectRoute
from conclave.settings import Settings
from tests.clis.conftest import project
from tests.fakes.cli_worker import CliWorker
from tests.fakes.environment import environment_of
from tests.fakes.redirect import ProviderRedirect
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV
from tests.fakes.waits import cli_job
from tests.test_egress import connected
from tests.test_egress_provider_key import Provider, quiet

__all__ = ["project"]  # the fixture the real CLIs' tests use, from tests/clis/conftest.py

pytestmark = pytest.mark.anyio
KEY = "sk-owner-plan-0123456789-abcdefghij"
FAST = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.05)
CREDENTIALS = (
    f"x-api-key: {PLACEHOLDER_KEY}\r\nAuthorization: Bearer {PLACEHOLDER_KEY}\r\n"
    f"x-goog-api-key: {PLACEHOLDER_KEY}\r\nanthropic-version: 2023-06-01\r\n"
)


def request(method: str, target: str, body: dict[str, Any] | None = None) -> bytes:
    """A request to the bridge as a client in the container sends it (origin form, the placeholder)."""
    data = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:3128\r\n{CREDENTIALS}"
    head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    return head.encode() + data


async def ask(proxy: EgressProxy, data: bytes) -> bytes:
    """One connection to the proxy, as a CLI's HTTP client makes it: the request, then its reply read to
    the close (no half-close after the request, which a server may take for the client leaving)."""

    def exchange(client: socket.socket) -> bytes:
        client.sendall(data)
        reply = b""
        while chunk := client.recv(65536):
            reply += chunk
        return reply

    async with connected(proxy) as client:
        return await anyio.to_thread.run_sync(exchange, client)


class Charges:
    """The member's side: what the proxy charged it, call by call, and its own token limit."""

    def __init__(self, max_tokens: int | None = None) -> None:
        self.usage = Billed()
        self.calls = 0
        self.limit = MemberLimit(max_tokens)

    async def spend(self, billed: Billed, first: bool) -> None:
        self.usage = self.usage + billed
        self.calls += int(first)

    def stopped(self) -> str | None:
        return self.limit.over(Usage(self.usage.input_tokens, self.usage.output_tokens))


@pytest.fixture
async def provider() -> AsyncIterator[Provider]:
    """A provider on 127.0.0.1 that records every request it gets, whatever its path."""
    found = Provider()
    async with anyio.create_task_group() as group:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        found.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        group.start_soon(listener.serve, found.handle)
        yield found
        group.cancel_scope.cancel()


# (CLI, wire, the endpoint's path, calls that must not pass with the key, one a turn makes)
REFUSED: list[tuple[CliName, Wire, str, list[tuple[str, str]], tuple[str, str]]] = [
    (
        "claude-code",
        "anthropic",
        "",
        [
            ("POST", "/v1/messages/batches"),
            ("GET", "/v1/messages/batches/msgbatch_01/results"),
            ("GET", "/v1/files"),
            ("POST", "/v1/files"),
            ("DELETE", "/v1/files/file_01"),
            ("GET", "/v1/organizations/usage_report/messages"),
            ("GET", "/v1/messages"),  # a turn's path with another method
            ("POST", "/v1/messages/../files"),
        ],
        ("POST", "/v1/messages?beta=true"),
    ),
    (
        "codex",
        "openai",
        "/v1",
        [
            ("POST", "/v1/batches"),
            ("GET", "/v1/files"),
            ("POST", "/v1/uploads"),
            ("POST", "/v1/fine_tuning/jobs"),
            ("GET", "/v1/organization/costs"),
            ("POST", "/v1/responses/../batches"),
            ("POST", "/responses"),  # outside the endpoint's path
        ],
        ("POST", "/v1/responses"),
    ),
    (
        "gemini",
        "gemini",
        "",
        [
            ("POST", "/v1beta/models/gemini-2.5-pro:batchGenerateContent"),
            ("GET", "/v1beta/files"),
            ("POST", "/upload/v1beta/files"),
            ("POST", "/v1beta/cachedContents"),
            ("GET", "/v1beta/batches"),
            ("POST", "/v1beta/tunedModels"),
        ],
        ("POST", "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"),
    ),
]


@pytest.mark.parametrize(("cli", "wire", "path", "refused", "allowed"), REFUSED, ids=[r[0] for r in REFUSED])
async def test_batches_files_and_admin_apis_are_refused_and_logged(
    provider: Provider,
    caplog: pytest.LogCaptureFixture,
    cli: CliName,
    wire: Wire,
    path: str,
    refused: list[tuple[str, str]],
    allowed: tuple[str, str],
) -> None:
    """Before: every one of these reached the provider with the member's real key."""
    caplog.set_level(logging.INFO, logger="conclave.sandbox.egress")
    url = f"http://127.0.0.1:{provider.port}{path}"
    async with egress_proxy(
        allowlist_for(cli, base_url=url), route=DirectRoute(), label="cj-spend/A"
    ) as proxy:
        proxy.serve_key(ProviderKey(url, KEY, wire))
        replies = [await ask(proxy, request(method, target, {})) for method, target in refused]
        passed = await ask(proxy, request(*allowed, {}))
        await quiet(proxy)
    for (method, target), reply in zip(refused, replies, strict=True):
        assert reply.startswith(b"HTTP/1.1 403 Forbidden"), (method, target, reply[:200])
        error = json.loads(reply.partition(b"\r\n\r\n")[2])["error"]
        assert "not a call a CLI turn makes" in error["message"], error  # what the CLI shows
    assert passed.startswith(b"HTTP/1.1 200") and passed.endswith(b"from provider"), passed
    assert len(provider.heads) == 1, [head.split(b"\r\n")[0] for head in provider.heads]
    assert provider.heads[0].startswith(f"{allowed[0]} {path}".encode())
    assert len(proxy.denied) == len(refused) and proxy.admitted == 1
    assert caplog.text.count("not a call a CLI turn makes") == len(refused)
    assert KEY not in caplog.text and "beta=true" not in caplog.text


def _calls(fakes: FakeProviders, stream: bool) -> list[tuple[CliName, Wire, str, str, dict[str, Any]]]:
    """(CLI, wire, the member's endpoint, the call's path, its body) for every wire a key login speaks:
    Claude Code and Copilot's Anthropic endpoint, Codex's Responses API, Copilot's OpenAI endpoint,
    Gemini CLI's generateContent."""
    messages = [{"role": "user", "content": "count me"}]
    gemini = {"contents": [{"role": "user", "parts": [{"text": "count me"}]}]}
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    anthropic, chat = fakes.base_url("anthropic", "A"), fakes.base_url("openai", "A")
    responses, google = fakes.base_url("responses", "A"), fakes.base_url("gemini", "A")
    return [
        (
            "claude-code",
            "anthropic",
            anthropic,
            "/v1/messages",
            {"model": "claude-x", "max_tokens": 64, "messages": messages, "stream": stream},
        ),
        (
            "codex",
            "openai",
            responses,
            "/responses",
            {"model": "gpt-x", "input": "count me", "stream": stream},
        ),
        (
            "copilot",
            "openai",
            chat,
            "/chat/completions",
            {
                "model": "gpt-x",
                "messages": messages,
                "stream": stream,
                **({"stream_options": {"include_usage": True}} if stream else {}),
            },
        ),
        ("gemini", "gemini", google, f"/v1beta/models/gemini-x:{method}", gemini),
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_the_proxys_count_equals_the_providers_bill(stream: bool) -> None:
    """Before: the proxy counted nothing; only the CLI's own output was read."""
    with FakeProviders() as fakes:
        for index, (cli, wire, url, path, body) in enumerate(_calls(fakes, stream)):
            agent = "A"
            fakes.script.enqueue(agent, Reply(text="counted " * 20, usage=(1_234 + index, 56, 200)))
            fakes.script.enqueue(agent, Reply(text="and again"))  # the usage the fake derives itself
            charges = Charges()
            async with egress_proxy(allowlist_for(cli, base_url=url), route=DirectRoute()) as proxy:
                proxy.serve_key(ProviderKey(url, KEY, wire))
                proxy.meter_to(charges.spend, charges.stopped)
                before = fakes.script.bill.get(agent, (0, 0, 0))
                target = url.removeprefix(f"http://127.0.0.1:{fakes.port}") + path
                replies = [await ask(proxy, request("POST", target, body)) for _ in range(2)]
                await quiet(proxy)
            assert all(reply.startswith(b"HTTP/1.1 200") for reply in replies), replies
            billed = tuple(now - then for now, then in zip(fakes.script.bill[agent], before, strict=True))
            counted = (
                charges.usage.input_tokens,
                charges.usage.output_tokens,
                charges.usage.cached_input_tokens,
            )
            assert billed[0] > 1_234 and counted == billed, (cli, path, counted, billed)
            assert charges.usage == proxy.spent and charges.calls == 2, (cli, charges.calls)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_loop_of_requests_stops_within_one_request_of_the_members_budget(stream: bool) -> None:
    """One shell command's loop of twelve calls, each billed 1,000 tokens, against a budget of 3,500:
    the fourth crosses it, so the fifth and every later one is refused. Before: all twelve went out."""
    charges = Charges(max_tokens=3_500)
    with FakeProviders() as fakes:
        url = fakes.base_url("anthropic", "A")
        fakes.script.set_default("A", Reply(text="spend", usage=(900, 100, 0)))
        body = {"model": "claude-x", "max_tokens": 64, "messages": [{"role": "user", "content": "x"}]}
        async with egress_proxy(allowlist_for("claude-code", base_url=url), route=DirectRoute()) as proxy:
            proxy.serve_key(ProviderKey(url, KEY, "anthropic"))
            proxy.meter_to(charges.spend, charges.stopped)
            target = url.removeprefix(f"http://127.0.0.1:{fakes.port}") + "/v1/messages"
            replies = [
                await ask(proxy, request("POST", target, {**body, "stream": stream})) for _ in range(12)
            ]
            await quiet(proxy)
        billed = fakes.script.bill["A"]
    assert [reply[:12] for reply in replies] == [b"HTTP/1.1 200"] * 4 + [b"HTTP/1.1 403"] * 8
    error = json.loads(replies[4].partition(b"\r\n\r\n")[2])["error"]
    assert "its own token limit reached: 4,000 tokens used of its budget.max_tokens 3,500" in error["message"]
    assert billed == (3_600, 400, 0) and charges.usage.tokens == 4_000 == sum(billed[:2])
    assert len(proxy.denied) == 8


async def test_no_tunnel_to_the_providers_host_while_the_proxy_holds_its_key(tmp_path: Path) -> None:
    """CONNECT api.anthropic.com:443 (where the attacker's own key would carry the workspace out) is
    refused for a member whose proxy holds its key; a plan login's member, which needs the tunnel,
    still gets it. Before: the key-mode member's tunnel was opened."""
    seen: list[bytes] = []

    async def host(stream: anyio.abc.ByteStream) -> None:  # stands in for api.anthropic.com:443
        async with stream:
            seen.append(await stream.receive())

    async with anyio.create_task_group() as group:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        group.start_soon(listener.serve, host)
        redirect = ProviderRedirect({"api.anthropic.com": port}, tmp_path / "unused-ca.pem")
        tunnel = b"CONNECT api.anthropic.com:443 HTTP/1.1\r\nHost: api.anthropic.com:443\r\n\r\nthe workspace"
        async with egress_proxy(allowlist_for("claude-code"), route=redirect, label="cj-spend/A") as keyed:
            keyed.serve_key(ProviderKey("https://api.anthropic.com", KEY, "anthropic"))
            refused = await ask(keyed, tunnel)
            await quiet(keyed)
        async with egress_proxy(allowlist_for("claude-code"), route=redirect) as plan:
            opened = await ask(plan, tunnel)
            await quiet(plan)
        group.cancel_scope.cancel()
    assert refused.startswith(b"HTTP/1.1 403 Forbidden") and b"needs no tunnel" in refused, refused
    assert [(d.method, d.host, d.port) for d in keyed.denied] == [("CONNECT", "api.anthropic.com", 443)]
    assert keyed.admitted == 0
    assert opened.startswith(b"HTTP/1.1 200 Connection Established") and seen == [b"the workspace"]


async def test_no_plain_request_to_the_providers_host_while_the_proxy_holds_its_key() -> None:
    """A custom http endpoint: an absolute-form request straight to it, with a key of the member's own,
    goes uncounted. Refused; the same call through the bridge passes, counted."""
    charges = Charges()
    with FakeProviders() as fakes:
        url = fakes.base_url("anthropic", "A")
        fakes.script.set_default("A", Reply(text="hello"))
        body = {"model": "claude-x", "max_tokens": 64, "messages": [{"role": "user", "content": "x"}]}
        async with egress_proxy(allowlist_for("claude-code", base_url=url), route=DirectRoute()) as proxy:
            proxy.serve_key(ProviderKey(url, KEY, "anthropic"))
            proxy.meter_to(charges.spend, charges.stopped)
            direct = await ask(
                proxy,
                request("POST", url + "/v1/messages", body).replace(PLACEHOLDER_KEY.encode(), b"sk-own"),
            )
            target = url.removeprefix(f"http://127.0.0.1:{fakes.port}") + "/v1/messages"
            bridged = await ask(proxy, request("POST", target, body))
            await quiet(proxy)
        requests = fakes.script.requests_of("A")
    assert direct.startswith(b"HTTP/1.1 403") and bridged.startswith(b"HTTP/1.1 200"), (direct, bridged)
    assert len(requests) == 1 and requests[0].headers["x-api-key"] == KEY
    assert charges.calls == 1 and charges.usage == proxy.spent and charges.usage.tokens > 0


# The real CLIs, each in its container (the CLI image), on a key login against its fake; the scripted
# model has the CLI's shell run LOOP, which sends a batch and then twelve calls of its own to the
# member's provider through the bridge, as a prompt-injected member would.
LOOP = r"""
import json, sys, urllib.error, urllib.request
base, wire = sys.argv[1], sys.argv[2]
path, body, batch = {
    "anthropic": ("/v1/messages", {"model": "m", "max_tokens": 16,
                  "messages": [{"role": "user", "content": "more"}]}, "/v1/messages/batches"),
    "responses": ("/responses", {"model": "m", "input": "more"}, "/batches"),
    "gemini": ("/v1beta/models/m:generateContent",
               {"contents": [{"role": "user", "parts": [{"text": "more"}]}]}, "/v1beta/batches"),
}[wire]
def call(target, data):
    headers = {"content-type": "application/json", "x-loop": "1", "x-api-key": "own",
               "authorization": "Bearer own", "x-goog-api-key": "own", "anthropic-version": "2023-06-01"}
    request = urllib.request.Request(base + target, data=json.dumps(data).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
print("LOOP", [call(batch, {})] + [call(path, body) for _ in range(12)])
"""
LOOP_BILL = (9_000, 1_000, 0)  # what each of the loop's calls bills
# (team entry, the fake's wire and agent) for each CLI on a key login
REAL_CLIS = [
    ("cli/claude-code", "anthropic", "claude"),
    ("cli/codex:gpt-5.5", "responses", "codex"),
    ("cli/gemini:gemini-2.5-pro", "gemini", "gemini"),
    ("cli/copilot:claude-sonnet-4.5", "anthropic", "copilot"),  # its own-key provider, Anthropic's wire
]


def _looping(fakes: FakeProviders, wire: str, agent: str, project: Path) -> CliWorker:
    """The member's scripted model: its work run's shell runs LOOP (from the project's copy) against its
    own endpoint through the bridge; the loop's calls (marked `x-loop`) each bill LOOP_BILL."""
    (project / "loop.py").write_text(LOOP)
    endpoint = "http://127.0.0.1:3128" + fakes.base_url(wire, agent).split(str(fakes.port), 1)[1]
    worker = CliWorker(wire, f"python3 loop.py {endpoint} {wire}", "Looped.")

    def respond(request: RecordedRequest) -> Reply:
        if request.headers.get("x-loop") == "1":
            return Reply(text="spent", usage=LOOP_BILL)
        return worker(request)

    fakes.script.set_default(agent, respond)
    return worker


async def _job(tmp_path: Path, project: Path, entry: str) -> JobView:
    """The calc task for a team of the one member `entry` (its key in KEY_ENV), to its end."""
    team = tmp_path / "team.yaml"
    team.write_text(
        f"agents:\n{entry}    api_key_env: {KEY_ENV}\n"
        "coordination: {final: reuse, timeout_s: 900}\nsandbox: {memory: 2g, cpus: 1}\n"
    )
    async with JobService.serve(
        environment_of(Settings(home=tmp_path / "state"), {KEY_ENV: KEY}, FAST)
    ) as service:
        return await cli_job(service, team, project)


@pytest.mark.lane_keeps("claude")
@pytest.mark.parametrize(("model", "wire", "agent"), REAL_CLIS, ids=[m[2] for m in REAL_CLIS])
async def test_real_clis_are_counted_as_billed(
    clis_image: str,
    tmp_path: Path,
    fakes: FakeProviders,
    project: Path,
    caplog: pytest.LogCaptureFixture,
    model: str,
    wire: str,
    agent: str,
) -> None:
    """The member's usage is its fake's bill, the CLI's own calls and its shell's twelve together; the
    shell's batch never reaches the fake. Before: the shell's calls went uncounted."""
    caplog.set_level(logging.INFO, logger="conclave.sandbox.egress")
    worker = _looping(fakes, wire, agent, project)
    view = await _job(tmp_path, project, f"  - model: {model}\n    base_url: {fakes.base_url(wire, agent)}\n")
    print(view.text())
    looped = [r for r in fakes.script.requests_of(agent) if r.headers.get("x-loop") == "1"]
    billed = fakes.script.bill[agent]
    usage = view.agents[0].usage
    assert view.state == "completed" and any("LOOP" in result for result in worker.tool_results), view.text()
    assert len(looped) == 12 and all(r.headers.get("x-api-key", KEY) == KEY for r in looped)
    assert (usage.input_tokens, usage.output_tokens, usage.cached_input_tokens) == billed, (usage, billed)
    assert "not a call a CLI turn makes" in caplog.text  # the batch, refused


@pytest.mark.lane_keeps("claude")
@pytest.mark.parametrize(("model", "wire", "agent"), REAL_CLIS, ids=[m[2] for m in REAL_CLIS])
async def test_real_clis_stop_within_one_call_of_their_budget(
    clis_image: str,
    tmp_path: Path,
    fakes: FakeProviders,
    project: Path,
    model: str,
    wire: str,
    agent: str,
) -> None:
    """The issue's run: a member with a budget of 30,000 tokens whose shell loops twelve calls of 10,000
    each. The call that crosses the budget is the last to reach the provider, and the member's usage is
    what the provider billed. Before: all twelve went out, and the member was charged the CLI's report."""
    _looping(fakes, wire, agent, project)
    url = fakes.base_url(wire, agent)
    entry = f"  - model: {model}\n    base_url: {url}\n    budget: {{max_tokens: 30000}}\n"
    view = await _job(tmp_path, project, entry)
    print(view.text())
    looped = [r for r in fakes.script.requests_of(agent) if r.headers.get("x-loop") == "1"]
    billed = fakes.script.bill[agent]
    usage = view.agents[0].usage
    assert 0 < len(looped) < 12, len(looped)
    assert billed[0] + billed[1] >= 30_000 > billed[0] + billed[1] - sum(LOOP_BILL[:2]), billed
    assert (usage.input_tokens, usage.output_tokens) == billed[:2], (usage, billed)
    assert "its own token limit reached" in view.text()
