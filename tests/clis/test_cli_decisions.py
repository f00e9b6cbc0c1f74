"""A CLI member's decision: when it needs no run at all, what each CLI is told to leave out of a decision
run, and a decision prompt whose fixed part comes first (coordination/cli_turns.py, clis/), without a
container; then the real Gemini CLI and Copilot CLI deciding in their containers, as the fakes received
their requests (Claude Code's and Codex's: tests/clis/test_cli_members_e2e.py)."""

from __future__ import annotations

import json
import re
import shlex
import threading
from pathlib import Path

import anyio
import pytest

from conclave.backends.base import ToolCall, Usage
from conclave.backends.retry import RetryPolicy
from conclave.clis.claude_code import ClaudeCode
from conclave.clis.cli_adapter import SYSTEM_FILE, Login
from conclave.clis.codex import BRIEF_CATALOG, DEFAULT_MODEL, Codex
from conclave.clis.copilot import BRIEF_SESSION, USAGE_FILE, Copilot
from conclave.clis.gemini_cli import Gemini
from conclave.clis.member import CliMember
from conclave.config.loading import parse_team
from conclave.coordination.agents import CliAgent
from conclave.coordination.cli_turns import (
    DECISION_SYSTEM,
    DIFF_BUDGET,
    MAX_SUMMARY,
    cli_turn,
    decision_prompt,
    decision_schema,
    presentation_answers,
)
from conclave.coordination.prompts import PRESENT_SYSTEM, FilesPicture
from conclave.coordination.protocol_events import StartTurn, VoteCast
from conclave.coordination.reports import ShownAnswer
from conclave.coordination.tally import Outcome
from conclave.coordination.turn_context import TurnContext
from conclave.errors import ProviderError
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.sandbox.member import HOME
from conclave.settings import Settings
from tests.clis.test_cli_members_e2e import ENV, FAST, KEY, api_agent
from tests.fakes.calc_task import TASK
from tests.fakes.cli_worker import (
    DECISION_MARK,
    PRESENT_MARK,
    WORK_MARK,
    CliWorker,
    _first_user_text,
    _tool_names,
    answer_held,
)
from tests.fakes.environment import environment_of
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import decide, vote_labels
from tests.fakes.waits import until_cli_done_opening

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
    claude = ClaudeCode().command("p", None, schema, True, Login())
    assert claude[claude.index("--tools") + 1] == "" and claude[claude.index("--system-prompt-file") + 1] == (
        SYSTEM_FILE
    )
    codex = Codex().command("p", None, schema, True, Login())
    assert f'model_instructions_file="{SYSTEM_FILE}"' in codex and "shell_tool" in codex
    gemini = Gemini().command("p", None, schema, True, Login())
    assert gemini[0] == "env" and f"GEMINI_SYSTEM_MD={SYSTEM_FILE}" in gemini
    assert gemini[-1].endswith("decision-policy.toml")
    copilot = Copilot().command("p", None, schema, True, Login())  # its server mode, driven by our script
    assert copilot[:4] == ["python3", "-I", "-c", BRIEF_SESSION]
    assert copilot[4:7] == [SYSTEM_FILE, USAGE_FILE, "view"]
    # a work run keeps each CLI's own prompt and its shell
    assert "Bash" in ClaudeCode().command("p", None, None, False, Login())[-1]
    assert "shell_tool" not in Codex().command("p", None, None, False, Login())
    assert Gemini().command("p", None, None, False, Login())[0] == "gemini"
    assert "bash" in Copilot().command("p", None, None, False, Login())
    # the member writes our system prompt where the decision run reads it, from the exec's environment
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
    our system prompt and only its read_file tool; Copilot's (a session of its server mode) our system
    prompt and only its view tool; both see the answers as diffs, and the fix wins."""
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
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        request = JobRequest(
            task=TASK, team=str(team), context_paths=[{"path": str(project)}], verify="pytest -q"
        )
        gates = {
            api_in: lambda agent: agent.model == "openai/gpt-fake" and bool(agent.answers),
            copilot_voted: lambda agent: agent.model.startswith("cli/copilot") and agent.vote is not None,
        }
        view = await until_cli_done_opening(service, await service.submit(request), gates, 300)
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
            assert ours in sent.text(), fake


def _diff(path: str, lines: int, value: str) -> str:
    body = "".join(f"+VALUE_{n} = {value}\n" for n in range(1, lines + 1))
    head = f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
    return f"{head}@@ -0,0 +1,{lines} @@\n{body}"


def test_a_decision_shows_answers_bounded_whatever_their_diffs_size() -> None:
    """Three answers each changing 1,500 lines (about 25 kB of diff): the decision shows each as its
    summary, a stat of its files and the hunks that tell it apart, within DIFF_BUDGET in all; the rest
    it names, with the full files at /peers."""
    _, ctx = _member_and_context()
    fix = "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n"
    changes = {
        "A1": fix + "-    return a - b\n+    return a + b\n" + _diff("table.py", 1500, "n"),
        "B1": fix + "-    return a - b\n+    return a * b\n" + _diff("table.py", 1500, "n + 1"),
        "C1": _diff("table.py", 1500, "n") + _diff("other.py", 3, "0"),
    }
    shown = [_answer(label, f"Answer {label}: " + "why " * 500) for label in ("B1", "A1", "C1")]
    prompt = decision_prompt(ctx, StartTurn("A", 1, 1, True, ("B1", "A1", "C1")), shown, _files(**changes))
    fixed = prompt[: prompt.index("The current answers")]
    assert sum(map(len, changes.values())) > 70_000
    assert len(prompt) - len(fixed) <= DIFF_BUDGET + 3 * (MAX_SUMMARY + 300), len(prompt)
    assert "+    return a + b" in prompt and "+    return a * b" in prompt  # the hunks that differ
    assert " table.py | +1500 -0" in prompt and "/peers/B" in prompt and "Hunks not shown" in prompt
    assert "+VALUE_1 = 0" in prompt  # C1's small hunk fits; its table is named, not shown


async def test_a_cli_winner_presents_briefly_or_its_answer_stands() -> None:
    """Every vote for the winner and none elsewhere: its answer stands as it is, with no run. Otherwise
    the presentation is a brief run (our system prompt, no work tools, as a decision), shown the
    winner's answer whole and the others' cut."""
    member, ctx = _member_and_context()
    agent = CliAgent(member)
    long = "because " * 1000
    won = _answer("A1", "Fixed add().", votes=2)
    shown = [won, _answer("B1", "add() multiplies. " + long), _answer("C1", "Nothing.")]
    outcome = Outcome(
        winner="A1", consensus=True, reason="a majority", votes=2, voters=2, tally={"A1": 2, "B1": 0, "C1": 0}
    )
    assert await agent.present(ctx, "Fix add().", shown, outcome) == "Fixed add()."
    split = [won.model_copy(update={"votes": 1}), shown[1].model_copy(update={"votes": 1}), shown[2]]
    with pytest.raises(ProviderError, match="needs its sandbox"):  # it runs: there is something to fold in
        await agent.present(ctx, "Fix add().", split, outcome)
    answers = presentation_answers(split, "A1")
    assert answers is not None and [a.label for a in answers] == ["A1", "B1", "C1"]
    assert len(answers[1].content) < MAX_SUMMARY + 20
    script, env = member.script("the answers", None, PRESENT_SYSTEM)
    assert env["CONCLAVE_SYSTEM"] == PRESENT_SYSTEM and "--system-prompt-file" in script
    assert "Bash" not in script and "--json-schema" not in script


def test_codex_decides_on_its_default_model_without_its_code_mode_tools() -> None:
    """Codex 0.169's default model (and each the catalog marks code-mode only) gets its JavaScript exec
    orchestrator and sub-agent tools whatever the features say: a brief run on it reads a catalog of our
    own whose one entry is that model without them (nor apply_patch); a model outside that catalog keeps
    Codex's own description."""
    codex = Codex()
    argv = codex.command("p", None, decision_schema(("A1",), False), True, Login())
    assert argv[argv.index("-m") + 1] == DEFAULT_MODEL
    assert f'model_catalog_json="{HOME}/{BRIEF_CATALOG}"' in argv
    assert "include_collaboration_mode_instructions=false" in argv
    catalog = json.loads(codex.home_files(Login(), None)[BRIEF_CATALOG])
    (entry,) = catalog["models"]
    assert entry["slug"] == DEFAULT_MODEL and "tool_mode" not in entry and "multi_agent_version" not in entry
    assert not entry["experimental_supported_tools"]
    named = codex.command("p", "gpt-4.1", None, True, Login())
    assert not any("model_catalog_json" in arg for arg in named) and BRIEF_CATALOG not in codex.home_files(
        Login(), "gpt-4.1"
    )
    assert "tools.experimental_request_user_input.enabled=false" in named  # no tool at all
    assert not any("model_catalog_json" in arg for arg in codex.command("p", None, None, False, Login()))


TABLE = "seq 1 1500 | sed 's/.*/VALUE_& = {}/' > table.py"  # about 25 kB of diff: each answer its own
# (fixer, its fake's wire), (breaker, its wire): each CLI with the model it uses when a team names none,
# and with one named; each is the fixer (which wins and presents) in one job. Copilot CLI's own-key
# provider has no default model ("BYOK providers require an explicit model"): two named ones.
PAIRS = {
    "claude-codex": (("cli/claude-code", "anthropic"), ("cli/codex", "responses")),
    "codex-claude": (("cli/codex:gpt-5.5", "responses"), ("cli/claude-code:claude-sonnet-4-5", "anthropic")),
    "gemini-copilot": (("cli/gemini", "gemini"), ("cli/copilot:claude-haiku-4.5", "anthropic")),
    "copilot-gemini": (
        ("cli/copilot:claude-sonnet-4.5", "anthropic"),
        ("cli/gemini:gemini-2.5-pro", "gemini"),
    ),
}


def _firsts(fakes: FakeProviders, name: str, wire: str) -> dict[str, list[tuple[int, int]]]:
    """By kind, each request's size and its fixed part's (the body without the prompt we gave): the work
    run's first request that offers tools (Gemini CLI's model router asks first, with none), and every
    request of a decision or a presentation (their router calls too)."""
    found: dict[str, list[tuple[int, int]]] = {"work": [], "decision": [], "presentation": []}
    for request in fakes.script.requests_of(name):
        prompt = _first_user_text(request.body, wire)
        kind = "decision" if DECISION_MARK in prompt else "presentation" if PRESENT_MARK in prompt else "work"
        if kind == "work" and (WORK_MARK not in prompt or not _tool_names(request.body)):
            continue  # a CLI's side call
        size = len(request.text().encode())
        found[kind].append((size, size - len(json.dumps(prompt, ensure_ascii=False).encode()) + 2))
    return found


@pytest.mark.parametrize("pair", list(PAIRS))
async def test_each_cli_decides_and_presents_for_a_tenth_of_its_work(
    pair: str, clis_image: str, tmp_path: Path, fakes: FakeProviders, project: Path
) -> None:
    """Two real CLIs and an API member on a job whose answers' diffs are tens of kB (each CLI writes a
    table of its own besides its calc.py change); the API member votes for its own answer, so the
    winner presents. As the fakes received them: the fixed part of each CLI's decision (its
    instructions, tools and environment) and of the winner's presentation is at most a tenth of its
    work run's first request, and what a decision shows of the answers is bounded."""
    (fixer_model, fixer_wire), (breaker_model, breaker_wire) = PAIRS[pair]
    fixer = CliWorker(
        fixer_wire,
        f"sed -i 's/return a - b/return a + b/' calc.py && {TABLE.format('&')} && python3 -m pytest -q",
        "Fixed add() in calc.py: it subtracted; the test passes now.",
    )
    breaker = CliWorker(
        breaker_wire,
        f"sed -i 's/return a - b/return a * b/' calc.py && {TABLE.format('& + 1')}",
        "Multiplies.",
    )
    api_in, breaker_voted = threading.Event(), threading.Event()

    def api(request: RecordedRequest) -> Reply:
        if "(your own answer)" not in request.text():
            return decide("new_answer", {"content": "calc.py looks right to me; I changed nothing."}, request)
        own = re.findall(r"## Answer ([A-P][0-9]+) \(your own answer\)", request.text())
        return decide("vote", {"answer": (own or vote_labels(request))[0], "reason": "mine"}, request)

    fakes.script.set_default("fixer", answer_held(fixer, breaker_voted))
    fakes.script.set_default("breaker", answer_held(breaker, api_in)).set_default("api", api)
    team = tmp_path / "team.yaml"
    team.write_text(f"""\
agents:
  - model: {fixer_model}
    base_url: {fakes.base_url(fixer_wire, "fixer")}
    api_key_env: {KEY}
  - model: {breaker_model}
    base_url: {fakes.base_url(breaker_wire, "breaker")}
    api_key_env: {KEY}
  - model: openai/gpt-fake
    base_url: {fakes.base_url("openai", "api")}
    api_key_env: {KEY}
coordination: {{max_answers_per_agent: 1, final: present, timeout_s: 900}}
sandbox: {{memory: 2g, cpus: 1}}
""")
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        request = JobRequest(
            task=TASK, team=str(team), context_paths=[{"path": str(project)}], verify="pytest -q"
        )
        gates = {
            api_in: lambda agent: agent.model == "openai/gpt-fake" and bool(agent.answers),
            breaker_voted: lambda agent: agent.model == breaker_model and agent.vote is not None,
        }
        view = await until_cli_done_opening(service, await service.submit(request), gates)
    print(view.text())
    letters = {agent.model: agent.letter for agent in view.agents}
    assert view.state == "completed" and view.result.winner == f"{letters[fixer_model]}1"
    for name, model, wire in (("fixer", fixer_model, fixer_wire), ("breaker", breaker_model, breaker_wire)):
        runs = _firsts(fakes, name, wire)
        work = runs["work"][0][0]
        assert runs["decision"], name
        for size, fixed in runs["decision"] + runs["presentation"]:
            print(name, model, "work", work, "brief", size, "fixed", fixed)
            assert fixed <= work * 0.1, (model, fixed, work)
            assert size - fixed <= DIFF_BUDGET + 3 * (MAX_SUMMARY + 400) + 1000, (model, size)
    # the vote was split, so the winner presents, with a brief run
    assert _firsts(fakes, "fixer", fixer_wire)["presentation"], pair
