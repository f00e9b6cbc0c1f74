"""A CLI member that logs in with a key never holds it: a prompt-injected member that dumps its whole
environment and every readable /proc/*/environ into its workspace finds only a placeholder, so the key is
in no workspace file, snapshot, diff, state file, transcript or event, and never reaches another
member's provider through /peers; yet its own provider gets the real key on every request (its egress
proxy adds it on the host: sandbox/provider_key.py).

The real Claude Code and Codex (the CLI image), each with its own key, driven by scripted models
(tests/fakes/cli_worker.py). Claude's model dumps its secrets first; Codex's model, once Claude's answer
is published, dumps its own and reads everything under /peers into its reply to its provider.
Needs the Docker engine and the CLI image; skips, saying how to get them, without.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import threading
from pathlib import Path

import pytest

from conclave.backends.retry import RetryPolicy
from conclave.clis.cli_adapter import PLACEHOLDER_KEY
from conclave.clis.member import CliMember
from conclave.config.loading import parse_team
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.clis.conftest import hosts, project
from tests.fakes.calc_task import TASK
from tests.fakes.cli_worker import CliWorker
from tests.fakes.environment import environment_of
from tests.fakes.leaks import holding
from tests.fakes.login_hosts import LoginHosts
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.waits import cli_job, until_cli_done_opening

__all__ = ["hosts", "project"]  # the fixtures this module uses, from tests/clis/conftest.py

pytestmark = pytest.mark.anyio
CLAUDE_KEY = "sk-ant-api03-claude-key-0123456789abcdef"
CODEX_KEY = "sk-proj-codex-key-0123456789abcdef"
ENV = {"CLAUDE_MEMBER_KEY": CLAUDE_KEY, "CODEX_MEMBER_KEY": CODEX_KEY}
# the user lets these go to the fakes: the team file lies in the test's folder, not the user's
TO_FAKES = tuple(f"{variable}=127.0.0.1:*" for variable in ENV)
FAST = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.05)
# What a prompt-injected member runs: its environment, every /proc/*/environ it can read, its HOME, into
# world-readable files (the runner's umask is 077; peers run as another user of the snapshots).
DUMP = (
    "umask 022; env > leak_env.txt; "
    'for f in /proc/[0-9]*/environ; do cat "$f" 2>/dev/null; echo; done > leak_proc.txt; '
    'grep -rsa . "$HOME" > leak_home.txt; '
    "sed -i 's/return a - b/return a + b/' calc.py; wc -c leak_*.txt"
)
# ... and, in Codex's case, everything its peers left under /peers, sent back to its model
READ_PEERS = "; cat /peers/*/leak_env.txt /peers/*/leak_proc.txt /peers/*/leak_home.txt | tr '\\0' '\\n'"


async def test_a_key_login_never_enters_the_container_yet_reaches_its_own_provider(
    clis_image: str, tmp_path: Path, fakes: FakeProviders, project: Path
) -> None:
    claude = CliWorker("anthropic", DUMP, "Fixed add(); dumped what I could read.")
    codex = CliWorker("responses", DUMP + READ_PEERS, "Fixed add() too; read my peers.")
    claude_answered = threading.Event()

    def codex_after_claude(request: RecordedRequest) -> Reply:
        reply = codex(request)
        # its shell runs only once Claude's answer (and its dumps) are published under /peers
        return dataclasses.replace(reply, gate=claude_answered) if reply.tool_calls else reply

    fakes.script.set_default("claude", claude).set_default("codex", codex_after_claude)
    team = tmp_path / "team.yaml"
    team.write_text(f"""\
agents:
  - model: cli/claude-code
    base_url: {fakes.base_url("anthropic", "claude")}
    api_key_env: CLAUDE_MEMBER_KEY
  - model: cli/codex:gpt-5.5
    base_url: {fakes.base_url("responses", "codex")}
    api_key_env: CODEX_MEMBER_KEY
coordination: {{max_answers_per_agent: 1, final: reuse, timeout_s: 900}}
sandbox: {{memory: 2g, cpus: 1}}
""")
    state = tmp_path / "state"
    settings = Settings(home=state, key_destinations=TO_FAKES)
    async with JobService.serve(environment_of(settings, ENV, FAST)) as service:
        view = await service.submit(
            JobRequest(task=TASK, team=str(team), context_paths=[{"path": str(project)}])
        )
        gates = {claude_answered: lambda agent: agent.model == "cli/claude-code" and bool(agent.answers)}
        view = await until_cli_done_opening(service, view, gates)
        patch = (await service.lookup.read(view.job_id, "@diff", None, 0, 100_000)).content
        transcript = (await service.lookup.read(view.job_id, "transcript", None, 0, 100_000)).content
        events = [event.model_dump_json() for event in service.store.sync.events(view.job_id)]
    print(view.text())
    keys = [CLAUDE_KEY, CODEX_KEY]
    assert view.state == "completed", view.text()
    # the attack ran: both members dumped what they could read, and Codex read Claude's dumps under /peers
    # back to its model
    dumps = sorted(state.rglob("leak_env.txt"))
    assert len(dumps) >= 2, dumps  # both snapshots (and final/)
    assert any("leak_env.txt" in result for result in claude.tool_results), claude.tool_results
    assert any("ANTHROPIC_API_KEY=" in result for result in codex.tool_results), "Codex never read /peers"
    # no key anywhere the job keeps or hands back
    assert holding(state, keys) == [] and holding(project, keys) == []
    assert not any(key in text for key in keys for text in (patch, transcript, *events))
    # no key reached the other member's provider
    claude_requests, codex_requests = fakes.script.requests_of("claude"), fakes.script.requests_of("codex")
    assert claude_requests and codex_requests
    assert not any(CLAUDE_KEY in _seen(request) for request in codex_requests), "Claude's key reached Codex's"
    assert not any(CODEX_KEY in _seen(request) for request in claude_requests), "Codex's key reached Claude's"
    # what the members held was the placeholder
    assert all(PLACEHOLDER_KEY.encode() in path.read_bytes() for path in dumps), dumps
    # yet each member's provider got its real key on every request, and never the placeholder
    assert all(request.headers.get("x-api-key") == CLAUDE_KEY for request in claude_requests)
    assert all(request.headers.get("authorization") == f"Bearer {CODEX_KEY}" for request in codex_requests)
    assert not any(PLACEHOLDER_KEY in json.dumps(r.headers) for r in claude_requests + codex_requests)


async def test_a_key_for_the_official_api_goes_there_over_tls_from_the_host(
    clis_image: str, tmp_path: Path, project: Path, hosts: LoginHosts
) -> None:
    """Claude Code on ANTHROPIC_API_KEY and Codex on OPENAI_API_KEY, no base_url: the proxy opens TLS to
    api.anthropic.com and api.openai.com on the host (the tests' redirect sends those names to fakes
    with a test CA's certificate, tests/fakes/redirect.py), each request with the real key, which the
    containers never held."""
    (tmp_path / "user").mkdir()
    environ = {"HOME": str(tmp_path / "user"), "ANTHROPIC_API_KEY": CLAUDE_KEY, "OPENAI_API_KEY": CODEX_KEY}
    claude = CliWorker("anthropic", "env > leak_env.txt", "Looked at it (Claude).")
    codex = CliWorker("responses", "env > leak_env.txt", "Looked at it (Codex).")
    hosts.script.set_default("claude", claude).set_default("codex", codex)
    team = tmp_path / "team.yaml"
    team.write_text(
        "agents:\n  - model: cli/claude-code\n  - model: cli/codex:gpt-5.5\n"
        "coordination: {max_answers_per_agent: 1, final: reuse, timeout_s: 900}\nsandbox: {memory: 2g}\n"
    )
    state = tmp_path / "state"
    async with JobService.serve(
        dataclasses.replace(environment_of(Settings(home=state), environ, FAST), route=hosts.redirect())
    ) as service:
        view = await cli_job(service, team, project)
    print(view.text())
    assert view.state == "completed" and {a.answers for a in view.agents} == {1}, view.text()
    messages = [call for call in hosts.seen if call.host == "api.anthropic.com"]
    responses = [call for call in hosts.seen if call.host == "api.openai.com"]
    assert messages and {call.headers.get("x-api-key") for call in messages} == {CLAUDE_KEY}
    assert responses and {call.authorization for call in responses} == {f"Bearer {CODEX_KEY}"}
    # each key went to its own API only (Codex also fetches chatgpt.com's curated plugin list, keyless)
    assert not any(CLAUDE_KEY in json.dumps(c.headers) for c in hosts.seen if c.host != "api.anthropic.com")
    assert not any(CODEX_KEY in json.dumps(c.headers) for c in hosts.seen if c.host != "api.openai.com")
    dumps = sorted(state.rglob("leak_env.txt"))
    assert dumps and all(PLACEHOLDER_KEY.encode() in path.read_bytes() for path in dumps)
    assert holding(state, [CLAUDE_KEY, CODEX_KEY]) == []


def _seen(request: RecordedRequest) -> str:
    """All a provider received in one request: its path, headers and body."""
    return request.path + json.dumps(request.headers) + request.text()


@pytest.mark.parametrize(
    ("agent", "environ", "url_variable", "bridge"),
    [
        (
            {"model": "cli/claude-code"},
            {"ANTHROPIC_API_KEY": CLAUDE_KEY},
            "ANTHROPIC_BASE_URL",
            "http://127.0.0.1:3128",
        ),
        (
            {"model": "cli/claude-code"},
            {"ANTHROPIC_AUTH_TOKEN": CLAUDE_KEY},
            "ANTHROPIC_BASE_URL",
            "http://127.0.0.1:3128",
        ),
        ({"model": "cli/codex"}, {"OPENAI_API_KEY": CODEX_KEY}, None, "http://127.0.0.1:3128/v1"),
        (
            {"model": "cli/gemini"},
            {"GEMINI_API_KEY": CODEX_KEY},
            "GOOGLE_GEMINI_BASE_URL",
            "http://127.0.0.1:3128",
        ),
        (
            {"model": "cli/copilot", "base_url": "https://llm.internal/anthropic", "api_key_env": "GW"},
            {"GW": CODEX_KEY},
            "COPILOT_PROVIDER_BASE_URL",
            "http://127.0.0.1:3128/anthropic",
        ),
    ],
)
def test_no_key_login_puts_its_key_into_the_exec(
    agent: dict[str, str], environ: dict[str, str], url_variable: str | None, bridge: str
) -> None:
    """Every CLI's key login: the exec's command, variables and HOME files hold the placeholder and the
    bridge, never the key (the files travel base64-encoded in the variables: decoded here)."""
    spec = parse_team({"agents": [agent]}, "t.yaml").agents[0]
    member = CliMember.for_spec(spec, {**environ, "HOME": "/nonexistent"})
    command, variables = member.script("Fix it.", None)
    files = [
        base64.b64decode(value).decode()
        for name, value in variables.items()
        if name.startswith("CONCLAVE_HOME")
    ]
    held = [command, *variables.values(), *files]
    assert not any(key in text for key in (CLAUDE_KEY, CODEX_KEY) for text in held)
    assert PLACEHOLDER_KEY in variables.values()
    if url_variable is not None:
        assert variables[url_variable] == bridge
    else:  # Codex reads its endpoint from its config.toml
        assert any(f'base_url = "{bridge}"' in text for text in files), files


def test_a_plan_login_is_not_held_by_the_proxy() -> None:
    """Claude's OAuth token and Copilot's GitHub token are plan logins (their own path, not this one)."""
    for model, variable in (
        ("cli/claude-code", "CLAUDE_CODE_OAUTH_TOKEN"),
        ("cli/copilot", "COPILOT_GITHUB_TOKEN"),
    ):
        spec = parse_team({"agents": [{"model": model}]}, "t.yaml").agents[0]
        member = CliMember.for_spec(spec, {variable: "tok-0123456789abcdef", "HOME": "/nonexistent"})
        assert (
            member.inside is member.login and member.script("x", None)[1][variable] == "tok-0123456789abcdef"
        )
