"""CLI members end to end: the real Claude Code and Codex from npm, inside their containers (the CLI
image, `conclave sandbox build --clis`), reaching fake models of ours only through their egress proxies,
in one team with an API agent, fixing a failing test with `verify`.

Claude Code's model (Anthropic Messages) fixes add(); Codex's (OpenAI Responses) breaks it another way;
the API agent (Chat Completions) answers without a change. Each CLI decides with its own constrained
output (Claude's --json-schema, Codex's --output-schema) and votes for the answer whose check passed.
Needs the Docker engine and the CLI image; skips, saying how to get them, without.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import anyio
import pytest

from conclave.backends.retry import RetryPolicy
from conclave.coordination.cli_turns import DECISION_SYSTEM
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.calc_task import TASK
from tests.fakes.cli_worker import DECISION_MARK, CliWorker, _first_user_text, _tool_names, answer_held
from tests.fakes.container_processes import container_processes
from tests.fakes.environment import environment_of
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import decide, vote_labels
from tests.fakes.waits import cli_job, until_cli_done_opening

pytestmark = pytest.mark.anyio
KEY = "CONCLAVE_FAKE_KEY"
ENV = {KEY: "fake-key-0123456789"}
FAST = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.05)
_PASSED = re.compile(r"## Answer ([A-P][0-9]+)[^\n]*verify passed")


def api_agent(request: RecordedRequest) -> Reply:
    """Answers once without touching the code, then votes for an answer whose check passed."""
    labels = vote_labels(request)
    if "(your own answer)" not in request.text():
        return decide("new_answer", {"content": "calc.py looks right to me; I changed nothing."}, request)
    passing = _PASSED.findall(request.text())
    return decide("vote", {"answer": (passing or labels)[0], "reason": "its check passed"}, request)


def write_team(path: Path, fakes: FakeProviders) -> str:
    path.write_text(f"""\
name: cli-trio
agents:
  - model: cli/claude-code
    base_url: {fakes.base_url("anthropic", "claude")}
    api_key_env: {KEY}
  - model: cli/codex:gpt-5.5
    base_url: {fakes.base_url("responses", "codex")}
    api_key_env: {KEY}
  - model: openai/gpt-fake
    base_url: {fakes.base_url("openai", "api")}
    api_key_env: {KEY}
coordination: {{max_answers_per_agent: 1, final: reuse, timeout_s: 900}}
sandbox: {{memory: 2g, cpus: 1}}
""")
    return str(path)


async def test_claude_code_and_codex_fix_a_failing_test_with_an_api_agent(
    clis_image: str, tmp_path: Path, fakes: FakeProviders, project: Path
) -> None:
    claude = CliWorker(
        "anthropic",
        "sed -i 's/return a - b/return a + b/' calc.py && python3 -m pytest -q",
        "Fixed add() in calc.py: it subtracted; the test passes now.",
    )
    codex = CliWorker("responses", "sed -i 's/return a - b/return a * b/' calc.py", "add() now multiplies.")
    # The answers land in a fixed order: the API agent's, Codex's, then Claude's once Codex has voted.
    # So no CLI decision is in flight when a new answer lands, and none is killed as stale: a run killed
    # after its request reached the fake is charged only an estimate (Codex reports tokens at its end),
    # which tests/clis/test_cli_killed_runs_each.py covers; here every run's usage is its CLI's own.
    api_in, codex_voted = threading.Event(), threading.Event()
    # the fakes cache a repeated prefix as their provider does (tests/fakes/prompt_cache.py): each CLI's
    # JSON then says cached input, and the member's usage counts it apart
    fakes.script.cache.enabled = True
    fakes.script.set_default("claude", answer_held(claude, codex_voted))
    fakes.script.set_default("codex", answer_held(codex, api_in)).set_default("api", api_agent)
    team = write_team(tmp_path / "team.yaml", fakes)
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        view = await service.submit(
            JobRequest(task=TASK, team=team, context_paths=[{"path": str(project)}], verify="pytest -q")
        )
        gates = {
            api_in: lambda agent: agent.model == "openai/gpt-fake" and bool(agent.answers),
            codex_voted: lambda agent: agent.model == "cli/codex:gpt-5.5" and agent.vote is not None,
        }
        view = await until_cli_done_opening(service, view, gates, 300)
        letters = {agent.model: agent.letter for agent in view.agents}
        patch = (await service.lookup.read(view.job_id, "@diff", None, 0, 100_000)).content
        transcript = (await service.lookup.read(view.job_id, "transcript", None, 0, 100_000)).content
        events = list(service.store.sync.events(view.job_id))

    print(view.text())
    mine, theirs, api = letters["cli/claude-code"], letters["cli/codex:gpt-5.5"], letters["openai/gpt-fake"]
    assert view.state == "completed" and view.result.winner == f"{mine}1", view.text()
    assert view.answer == "Fixed add() in calc.py: it subtracted; the test passes now."
    assert view.checks()[f"{mine}1"].startswith("passed") and view.checks()[f"{theirs}1"].startswith("failed")
    # the diff is the winning CLI's change, made by its own shell tool inside its container
    assert "-    return a - b\n+    return a + b\n" in patch and "a * b" not in patch
    assert any("1 passed" in result for result in claude.tool_results), claude.tool_results
    # the voters saw each other's answers, in their own order, with the checks
    assert claude.decisions and {f"{theirs}1", f"{api}1"} <= set(claude.decisions[-1])
    assert codex.decisions and {f"{mine}1", f"{api}1"} <= set(codex.decisions[-1])
    assert view.result.tally.get(f"{mine}1", 0) >= 2, view.result.tally
    # usage is what the fakes billed, per CLI member, every run of theirs having finished (no CLI turn
    # was cancelled; an API agent's stale call, cancelled after the fake billed it, may be missing: that
    # is the API agents' own accounting, tests/test_budgets.py)
    cancelled = {event.letter for event in events if event.kind == "turn_cancelled"}
    assert not cancelled & {mine, theirs}, cancelled
    usage = {agent.letter: agent.usage for agent in view.agents}
    for letter, fake in ((mine, "claude"), (theirs, "codex")):
        billed = fakes.script.bill[fake]
        assert (usage[letter].input_tokens, usage[letter].output_tokens) == billed[:2], (
            fake,
            usage[letter],
            billed,
        )
        # the cached input its CLI's JSON reported (Claude Code: cache_read_input_tokens beside
        # input_tokens; Codex: turn.completed's cached_input_tokens among them), as the fake billed it
        assert usage[letter].cached_input_tokens == billed[2] > 0, (fake, usage[letter], billed)
    shares = {agent.letter: agent.token_share for agent in view.agents}
    assert sum(share or 0 for share in shares.values()) == pytest.approx(1, abs=2e-3)
    assert shares[mine] == pytest.approx(usage[mine].tokens / view.usage.tokens, abs=1e-4)
    assert usage[mine].cost_usd is not None and usage[mine].cost_usd > 0  # Claude Code reports its cost
    # ... at the end of each run (its work run, its decision runs): the member's cost is every run's,
    # whole (each run ended), though each run's mid-run charges came without a cost (issue 28: its
    # cost was its last run's alone)
    charges = [e.charge for e in events if e.kind == "usage" and e.letter == mine]
    costs = [charge.cost_usd for charge in charges if charge.cost_usd is not None]
    assert any(charge.cost_usd is None for charge in charges) and len(costs) >= 2, charges
    assert usage[mine].cost_usd == pytest.approx(sum(costs)) and usage[mine].cost_usd > max(costs)
    assert not usage[mine].cost_partial and usage[mine].uncosted_tokens == 0
    assert "cli_work" in transcript
    _decisions_were_small(fakes)


def _decisions_were_small(fakes: FakeProviders) -> None:
    """Each CLI's decision runs got our system prompt, no shell or file tool and not the CLI's own
    instructions, and saw the answers as what they changed (coordination/cli_turns.py, clis/)."""
    ours = json.dumps(DECISION_SYSTEM)[1:80]  # as it sits in a JSON body
    for fake, wire in (("claude", "anthropic"), ("codex", "responses")):
        requests = fakes.script.requests_of(fake)
        decisions = [r for r in requests if DECISION_MARK in _first_user_text(r.body, wire)]
        work = max(len(r.text()) for r in requests if r not in decisions)
        assert decisions, fake
        for request in decisions:
            assert ours in request.text(), (fake, request.text()[:3000])
            assert "--- a/calc.py\n+++ b/calc.py" in _first_user_text(request.body, wire)  # as a diff
            assert len(request.text()) * 4 < work, (fake, len(request.text()), work)
    for request in fakes.script.requests_of("claude"):
        if DECISION_MARK in _first_user_text(request.body, "anthropic"):
            assert set(_tool_names(request.body)) <= {"StructuredOutput", "DeferredToolPlaceholder"}
    for request in fakes.script.requests_of("codex"):
        if DECISION_MARK in _first_user_text(request.body, "responses"):
            assert "exec_command" not in request.text() and "You are Codex" not in request.text()


def _secret_in_tree(root: Path, secret: str) -> list[str]:
    return [
        str(path)
        for path in root.rglob("*")
        if path.is_file() and not path.is_socket() and secret.encode() in path.read_bytes()
    ]


async def test_the_key_never_reaches_files_transcript_or_logs(
    clis_image: str, tmp_path: Path, fakes: FakeProviders, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The member's CLI has a key in its environment (its shell tool sees one: the placeholder, its
    egress proxy holding the real key, tests/security/test_cli_keys.py), the provider gets the real key,
    and nothing of the job keeps it: workspaces, snapshots, final/, check copies, the patch, the
    transcript, the events and the server's log."""
    secret = ENV[KEY]
    claude = CliWorker(
        "anthropic",
        "test -n \"$ANTHROPIC_API_KEY\" && echo key-present; sed -i 's/return a - b/return a + b/' calc.py",
        "Fixed add().",
    )
    fakes.script.set_default("claude", claude).set_default("api", api_agent)
    team = tmp_path / "team.yaml"
    team.write_text(f"""\
agents:
  - model: cli/claude-code
    base_url: {fakes.base_url("anthropic", "claude")}
    api_key_env: {KEY}
  - model: openai/gpt-fake
    base_url: {fakes.base_url("openai", "api")}
    api_key_env: {KEY}
coordination: {{max_answers_per_agent: 1, final: reuse}}
""")
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        view = await cli_job(service, team, project, verify="pytest -q")
        transcript = (await service.lookup.read(view.job_id, "transcript", None, 0, 100_000)).content
        events = [event.model_dump_json() for event in service.store.sync.events(view.job_id)]
    assert view.state == "completed" and any("key-present" in result for result in claude.tool_results)
    assert fakes.script.requests_of("claude")[0].headers.get("x-api-key") == secret  # it was used
    assert _secret_in_tree(tmp_path / "state", secret) == [] and _secret_in_tree(project, secret) == []
    assert secret not in transcript and not any(secret in event for event in events)
    assert secret not in caplog.text


async def test_a_cancelled_job_leaves_no_cli_process_and_no_container(
    clis_image: str, tmp_path: Path, fakes: FakeProviders, project: Path
) -> None:
    """The CLI is mid-run (its model is slow to answer) and has started a `setsid` child of its own
    when the job is cancelled: its whole tree and its container are gone at once."""
    import docker

    marker = "conclave-cancel-probe"
    claude = CliWorker(
        "anthropic", f"setsid sh -c 'sleep 600; echo {marker}' >/dev/null 2>&1 & echo started", "never"
    )
    slow: list[int] = []

    def respond(request: RecordedRequest) -> Reply:
        reply = claude(request)
        if claude.tool_results:  # the shell ran (the setsid child lives): now hang the model
            slow.append(1)
            return Reply(text="late", delay=300)
        return reply

    fakes.script.set_default("claude", respond).set_default("api", api_agent)
    team = tmp_path / "team.yaml"
    team.write_text(f"""\
agents:
  - model: cli/claude-code
    base_url: {fakes.base_url("anthropic", "claude")}
    api_key_env: {KEY}
""")
    client = docker.from_env()
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        view = await service.submit(
            JobRequest(task=TASK, team=str(team), context_paths=[{"path": str(project)}])
        )
        with anyio.fail_after(300):
            while not slow:
                await anyio.sleep(0.5)
        running = client.containers.list(
            ignore_removed=True, filters={"label": f"conclave.job={view.job_id}"}
        )
        assert running and marker in container_processes(running[0])
        view = await service.cancel(view.job_id)
        with anyio.fail_after(60):
            while not view.done:
                view = await service.wait(view.job_id, 5)
    assert view.state == "cancelled"
    assert (
        client.containers.list(
            all=True, ignore_removed=True, filters={"label": f"conclave.job={view.job_id}"}
        )
        == []
    )
    assert not [
        line for line in _host_processes() if marker in line or ("claude -p" in line and TASK[:20] in line)
    ]


def _host_processes() -> list[str]:
    import subprocess

    return subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()


@pytest.mark.parametrize(("cli", "wire"), [("gemini", "gemini"), ("copilot", "anthropic")])
async def test_gemini_cli_and_copilot_members_fix_the_test(
    clis_image: str, tmp_path: Path, fakes: FakeProviders, project: Path, cli: str, wire: str
) -> None:
    """Gemini CLI (the Gemini API) and Copilot CLI (its own-key provider, Anthropic-style) as members:
    each fixes add() with its own shell tool and decides with JSON in text (they have no schema mode)."""
    worker = CliWorker(wire, "sed -i 's/return a - b/return a + b/' calc.py", f"Fixed add() ({cli}).")
    fakes.script.cache.enabled = True  # a repeated prefix is cached, as its provider does
    fakes.script.set_default(cli, worker).set_default("api", api_agent)
    team = tmp_path / "team.yaml"
    team.write_text(f"""\
agents:
  - model: cli/{cli}:fake-model
    base_url: {fakes.base_url(wire, cli)}
    api_key_env: {KEY}
  - model: openai/gpt-fake
    base_url: {fakes.base_url("openai", "api")}
    api_key_env: {KEY}
coordination: {{max_answers_per_agent: 1, final: reuse}}
sandbox: {{memory: 2g}}
""")
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        view = await cli_job(service, team, project, verify="pytest -q")
        patch = (await service.lookup.read(view.job_id, "@diff", None, 0, 100_000)).content
    print(view.text(), worker.tool_names)
    letter = next(agent.letter for agent in view.agents if agent.model.startswith("cli/"))
    assert view.state == "completed" and view.result.winner == f"{letter}1", view.text()
    assert view.answer == f"Fixed add() ({cli})." and "+    return a + b\n" in patch
    assert worker.decisions, "it never decided"
    member = next(agent for agent in view.agents if agent.letter == letter)
    assert member.usage.input_tokens == fakes.script.bill[cli][0] > 0
    # the cached input its JSON reported (Gemini CLI: stats' `cached`); Copilot 1.0.102's own-key Anthropic
    # requests mark no cache_control, so the API caches nothing and its usage file says no cacheReadTokens
    marks = sum(request.text().count("cache_control") for request in fakes.script.requests_of(cli))
    assert member.usage.cached_input_tokens == fakes.script.bill[cli][2]
    assert (fakes.script.bill[cli][2] > 0) if cli == "gemini" else (marks == 0), (
        fakes.script.bill[cli],
        marks,
    )


async def test_a_cli_members_tokens_count_toward_max_tokens(
    clis_image: str, tmp_path: Path, fakes: FakeProviders, project: Path
) -> None:
    """One Claude Code run bills far more than the budget (its own system prompt alone): the job stops
    there with the budget reached, no further run starts, and the usage is what the fake billed."""
    claude = CliWorker("anthropic", "true", "Looked at it.")
    # the reply after its shell command is never sent: the kill, at the first response's usage, comes
    # first. Sent before the kill lands, the API would bill a response the CLI may not have printed yet
    # (docs/subscriptions.md: a killed run is charged what its CLI said), and under load it sometimes was
    fakes.script.set_default("claude", answer_held(claude, threading.Event()))
    team = tmp_path / "team.yaml"
    team.write_text(f"""\
agents:
  - model: cli/claude-code
    base_url: {fakes.base_url("anthropic", "claude")}
    api_key_env: {KEY}
coordination: {{max_tokens: 2000, final: reuse}}
""")
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        view = await cli_job(service, team, project)
    member = next(agent for agent in view.agents if agent.model == "cli/claude-code")
    assert view.result.reason and view.result.reason.startswith("budget reached: "), view.text()
    assert member.usage.input_tokens == fakes.script.bill["claude"][0] > 2000
    assert claude.decisions == []  # no decision run started after the budget was reached
