"""A CLI member's decision: when it needs no run at all, what each CLI is told to leave out of a decision
run, and a decision prompt whose fixed part comes first (coordination/cli_turns.py, clis/), without a
container; then the real Gemini CLI and Copilot CLI deciding in their containers, as the fakes received
their requests (Claude Code's and Codex's: tests/clis/test_cli_members_e2e.py)."""

from __future__ import annotations

import json
import shlex
import threading
from pathlib import Path

import anyio
import pytest

from conclave.backends.base import ToolCall, Usage
from conclave.backends.retry import RetryPolicy
from conclave.clis.claude_code import ClaudeCode
from conclave.clis.cli_adapter import SYSTEM_FILE
from conclave.clis.codex import Codex
from conclave.clis.copilot import Copilot
from conclave.clis.gemini_cli import Gemini
from conclave.clis.runner import CliMember
from conclave.config.loading import parse_team
from conclave.coordination.cli_turns import DECISION_SYSTEM, cli_turn, decision_prompt, decision_schema
from conclave.coordination.prompts import FilesPicture
from conclave.coordination.protocol_events import StartTurn, VoteCast
from conclave.coordination.reports import ShownAnswer
from conclave.coordination.turn_context import TurnContext
from conclave.errors import ProviderError
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.clis.test_cli_members_e2e import ENV, FAST, KEY, api_agent
from tests.fakes.calc_task import TASK
from tests.fakes.cli_worker import DECISION_MARK, CliWorker, _first_user_text, _tool_names, answer_held
from tests.fakes.server import FakeProviders
from tests.fakes.waits import until_cli_done

pytestmark = pytest.mark.anyio
FIX = "diff --git a/calc.py b/calc.py\n-    return a - b\n+    return a + b\n"
OTHER = "diff --git a/calc.py b/calc.py\n-    return a - b\n+    return b + a\n"


def _member_and_context() -> tuple[CliMember, TurnContext]:
    """A Claude Code member never bound to a container: any run it starts fails at once."""
    spec = parse_team(
        {"agents": [{"model": "cli/claude-code", "base_url": "http://127.0.0.1:9/x", "api_key_env": "K"}]},
        "t",
    ).agents[0]

    async def on_usage(usage: Usage, first: bool) -> None:
        return None

    async def on_work(call: ToolCall) -> None:
        return None

    ctx = TurnContext(
        spec=spec,
        letter="A",
        system="",
        task="Fix add() in calc.py.",
        retry=RetryPolicy(),
        limiter=anyio.CapacityLimiter(1),
        on_usage=on_usage,
        on_work=on_work,
    )
    return CliMember.for_spec(spec, {"K": "key-0123456789abcdef"}), ctx


def _answer(label: str, content: str, votes: int = 0, agrees: tuple[str, ...] = ()) -> ShownAnswer:
    return ShownAnswer(
        label=label, letter=label[0], revision=1, content=content, votes=votes, agrees_with=agrees
    )


def _files(**changes: str) -> FilesPicture:
    return FilesPicture(("proj",), {}, True, root="proj", changes=changes)


async def _turn(shown: list[ShownAnswer], files: FilesPicture) -> object:
    """The turn's event, or the error of the CLI run it tried to start (it has no container)."""
    member, ctx = _member_and_context()
    action = StartTurn("A", 7, 2, True, tuple(answer.label for answer in shown))
    try:
        return await cli_turn(ctx, member, action, shown, files)
    except ProviderError as exc:
        assert "needs its sandbox" in str(exc)
        return exc


async def test_every_answer_alike_with_the_same_changes_is_a_vote_without_a_run() -> None:
    same = "Fixed add(): it subtracted."
    shown = [_answer("B1", same, agrees=("A1",)), _answer("A1", same, agrees=("B1",))]
    event = await _turn(shown, _files(A1=FIX, B1=FIX))
    assert isinstance(event, VoteCast) and event.label == "A1", event  # its own, no run
    # the same words over different changes are two answers: the member decides, with its CLI
    event = await _turn(shown, _files(A1=FIX, B1=OTHER))
    assert isinstance(event, ProviderError), event


async def test_its_own_answer_holding_every_other_vote_is_a_vote_without_a_run() -> None:
    shown = [_answer("B1", "add() multiplies."), _answer("A1", "Fixed add()."), _answer("C1", "Nothing.")]
    held = [_answer("B1", "add() multiplies."), _answer("A1", "Fixed add().", votes=2), _answer("C1", "x")]
    event = await _turn(held, _files())
    assert isinstance(event, VoteCast) and event.label == "A1", event
    # one vote short, or a vote elsewhere: its vote could matter, so it decides
    for votes in ((0, 1, 0), (1, 1, 0)):
        shown = [_answer(a.label, a.content, votes=v) for a, v in zip(shown, votes, strict=True)]
        event = await _turn(shown, _files())
        assert isinstance(event, ProviderError), (votes, event)


def test_a_decision_run_leaves_out_the_clis_own_prompt_and_work_tools() -> None:
    schema = decision_schema(("A1", "B1"), True)
    claude = ClaudeCode().command("p", None, schema)
    assert claude[claude.index("--tools") + 1] == "" and claude[claude.index("--system-prompt-file") + 1] == (
        SYSTEM_FILE
    )
    codex = Codex().command("p", None, schema)
    assert f'model_instructions_file="{SYSTEM_FILE}"' in codex and "shell_tool" in codex
    gemini = Gemini().command("p", None, schema)
    assert gemini[0] == "env" and f"GEMINI_SYSTEM_MD={SYSTEM_FILE}" in gemini
    assert gemini[-1].endswith("decision-policy.toml")
    copilot = Copilot().command("p", None, schema)
    assert copilot[copilot.index("--available-tools") :] == ["--available-tools", "view"]
    # a work run keeps each CLI's own prompt and its shell
    assert "Bash" in ClaudeCode().command("p", None, None)[-1]
    assert "shell_tool" not in Codex().command("p", None, None)
    assert Gemini().command("p", None, None)[0] == "gemini"
    assert "bash" in Copilot().command("p", None, None)
    # the runner writes our system prompt where the decision run reads it, from the exec's environment
    member, _ = _member_and_context()
    script, env = member.script("p", schema, DECISION_SYSTEM)
    assert f"> {SYSTEM_FILE}" in script and env["CONCLAVE_SYSTEM"] == DECISION_SYSTEM
    assert "CONCLAVE_SYSTEM" not in member.script("p", None)[1]
    assert shlex.split(script.splitlines()[-1])[0] == "exec"


def test_a_decision_prompt_puts_the_fixed_part_first_and_shows_changes_and_checks() -> None:
    _, ctx = _member_and_context()
    first = [_answer("B1", "add() multiplies.")]
    second = [_answer("A1", "Fixed add()."), _answer("B1", "add() multiplies.")]
    first[0] = first[0].model_copy(update={"check": "failed (exit 1): 1 failed"})
    one = decision_prompt(ctx, StartTurn("A", 1, 1, True, ("B1",)), first, _files(B1=OTHER))
    two = decision_prompt(
        ctx, StartTurn("A", 2, 2, False, ("A1", "B1"), note="look again"), second, _files(A1=FIX, B1="")
    )
    fixed = one[: one.index("The current answers")]
    assert two.startswith(fixed) and "Fix add() in calc.py." in fixed and '{"decision"' in fixed
    assert "[check: failed (exit 1): 1 failed]" in one and OTHER in one and "/peers/B" in one
    assert FIX in two and "No file changed." in two and two.endswith("look again")


async def test_gemini_and_copilot_decide_with_our_prompt_and_one_read_tool(
    clis_image: str, tmp_path: Path, fakes: FakeProviders, project: Path
) -> None:
    """Gemini CLI fixes add(), Copilot CLI (its own-key provider on the Anthropic wire) breaks it, the API
    agent changes nothing; the answers land in that order (Copilot's once the API agent's is in,
    Gemini's once Copilot has voted), so each CLI has a real choice to make. Gemini's decision run gets
    our system prompt and only its read_file tool; Copilot's only its view tool (its own system prompt
    cannot be replaced); both see the answers as diffs, and the fix wins."""
    gemini = CliWorker("gemini", "sed -i 's/return a - b/return a + b/' calc.py", "Fixed add() in calc.py.")
    copilot = CliWorker("anthropic", "sed -i 's/return a - b/return a * b/' calc.py", "add() now multiplies.")
    api_in, copilot_voted = threading.Event(), threading.Event()
    fakes.script.set_default("gemini", answer_held(gemini, copilot_voted))
    fakes.script.set_default("copilot", answer_held(copilot, api_in)).set_default("api", api_agent)
    team = tmp_path / "team.yaml"
    team.write_text(f"""\
agents:
  - model: cli/gemini:gemini-2.5-pro
    base_url: {fakes.base_url("gemini", "gemini")}
    api_key_env: {KEY}
  - model: cli/copilot:claude-sonnet-4.5
    base_url: {fakes.base_url("anthropic", "copilot")}
    api_key_env: {KEY}
  - model: openai/gpt-fake
    base_url: {fakes.base_url("openai", "api")}
    api_key_env: {KEY}
coordination: {{max_answers_per_agent: 1, final: reuse, timeout_s: 900}}
sandbox: {{memory: 2g, cpus: 1}}
""")
    async with JobService.open(Settings(home=tmp_path / "state"), environ=ENV, retry=FAST) as service:
        request = JobRequest(
            task=TASK, team=str(team), context_paths=[{"path": str(project)}], verify="pytest -q"
        )
        view = await service.submit(request)
        try:
            with anyio.fail_after(300):
                while not copilot_voted.is_set() and not view.done:
                    view = await service.wait(view.job_id, 10)
                    for agent in view.agents:
                        if agent.model == "openai/gpt-fake" and agent.answers:
                            api_in.set()
                        if agent.model.startswith("cli/copilot") and agent.vote:
                            copilot_voted.set()
            view = await until_cli_done(service, view)
        finally:
            api_in.set()
            copilot_voted.set()
    print(view.text())
    letters = {agent.model: agent.letter for agent in view.agents}
    assert view.state == "completed" and view.result.winner == f"{letters['cli/gemini:gemini-2.5-pro']}1"
    assert gemini.decisions and copilot.decisions
    ours = json.dumps(DECISION_SYSTEM)[1:80]
    for fake, wire, tools in (("gemini", "gemini", ["read_file"]), ("copilot", "anthropic", ["view"])):
        decisions = [
            r for r in fakes.script.requests_of(fake) if DECISION_MARK in _first_user_text(r.body, wire)
        ]
        assert decisions, fake
        for sent in decisions:
            assert _tool_names(sent.body) == tools, (fake, _tool_names(sent.body))
            assert "--- a/calc.py\n+++ b/calc.py" in _first_user_text(sent.body, wire)
            assert (ours in sent.text()) == (fake == "gemini"), fake  # Copilot keeps its own prompt
