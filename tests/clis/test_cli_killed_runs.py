"""A CLI member's run cut short, and a CLI member that wins and presents: the real Claude Code inside
its container against the fake Anthropic server, as in test_cli_members_e2e.py.

- A run killed mid-way (the job cancelled, or its decision gone stale when a peer answers) is charged
  what the CLI's stream reported before the kill: the fake streams `message_start` (billing the
  input) and then stalls; the member's usage equals what the fake billed, the stalled call included.
- A stale decision run is killed at once, charged, and the turn asked again: the job still ends in a vote.
- With `final: present`, a winning CLI member presents: its presentation is the job's answer, and
  the diff is the change it made in its workspace.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import anyio
import pytest

from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.clis.test_cli_members_e2e import (
    ENV,
    FAST,
    KEY,
    api_agent,
)
from tests.fakes.calc_task import TASK
from tests.fakes.cli_worker import DECISION_MARK, CliWorker, _first_user_text
from tests.fakes.environment import environment_of
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import decide
from tests.fakes.waits import cli_job

pytestmark = pytest.mark.anyio
FIX = "sed -i 's/return a - b/return a + b/' calc.py"


def _team(path: Path, fakes: FakeProviders, *, api: bool, final: str = "reuse", answers: int = 1) -> str:
    extra = (
        f"  - model: openai/gpt-fake\n    base_url: {fakes.base_url('openai', 'api')}\n"
        f"    api_key_env: {KEY}\n"
        if api
        else ""
    )
    path.write_text(
        f"agents:\n  - model: cli/claude-code\n    base_url: {fakes.base_url('anthropic', 'claude')}\n"
        f"    api_key_env: {KEY}\n{extra}coordination: {{max_answers_per_agent: {answers}, final: {final}}}\n"
    )
    return str(path)


def _usage(view: object, model: str) -> tuple[int, int]:
    agent = next(agent for agent in view.agents if agent.model == model)  # type: ignore[attr-defined]
    return agent.usage.input_tokens, agent.usage.output_tokens


async def test_a_cancelled_run_is_charged_what_its_stream_reported(
    clis_image: str, tmp_path: Path, fakes: FakeProviders, project: Path
) -> None:
    """Claude Code makes one call (a shell command), then its next call's response starts (input
    billed) and stalls; the job is cancelled: both calls are in the member's usage, as billed."""
    claude = CliWorker("anthropic", FIX, "never")
    stalled: list[int] = []

    def respond(request: RecordedRequest) -> Reply:
        reply = claude(request)
        if claude.tool_results:  # the shell ran: this call's response starts, then hangs
            stalled.append(1)
            return Reply(text="late", stall=300)
        return reply

    fakes.script.set_default("claude", respond)
    team = _team(tmp_path / "team.yaml", fakes, api=False)
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        view = await service.submit(JobRequest(task=TASK, team=team, context_paths=[{"path": str(project)}]))
        with anyio.fail_after(300):
            while not stalled:
                await anyio.sleep(0.5)
        # sleep-ok: nothing on the host shows when the CLI has read the stalled response's message_start
        await anyio.sleep(2)
        view = await service.cancel(view.job_id)
        with anyio.fail_after(60):
            while not view.done:
                view = await service.wait(view.job_id, 5)
    billed = fakes.script.bill["claude"]
    assert view.state == "cancelled"
    assert len(fakes.script.requests_of("claude")) >= 2 and billed[0] > 0
    assert _usage(view, "cli/claude-code") == billed[:2], (_usage(view, "cli/claude-code"), billed)


async def test_a_stale_decision_run_is_killed_charged_and_asked_again(
    clis_image: str, tmp_path: Path, fakes: FakeProviders, project: Path
) -> None:
    """The API agent answers, then Claude Code answers and starts deciding between the two; its
    decision call stalls until the API agent posts a second answer. The new answer makes the decision
    stale: the run is killed at once (its turn cancelled), its stalled call charged, and the next
    decision run votes. (With its own answer alone in view it would not run a decision at all:
    coordination/cli_turns.py.)"""
    claude = CliWorker("anthropic", FIX, "Fixed add() in calc.py.")
    deciding = threading.Event()
    first_decision: list[int] = []

    def respond(request: RecordedRequest) -> Reply:
        # the decision run's main request (streamed, with tools), not a side call of the CLI's own
        main = request.streamed and bool(request.body.get("tools"))
        if main and DECISION_MARK in _first_user_text(request.body, "anthropic") and not first_decision:
            first_decision.append(1)
            # the peer answers again once the stalled response's message_start has reached the CLI
            threading.Timer(3.0, deciding.set).start()
            return Reply(text="thinking", stall=300)
        return claude(request)

    second: list[int] = []

    def api(request: RecordedRequest) -> Reply:
        if claude.answer in request.text() and not second:  # its second answer waits for the decision
            second.append(1)
            reply = decide("new_answer", {"content": "On a second look, calc.py is fine as it is."}, request)
            reply.gate = deciding
            return reply
        return api_agent(request)

    fakes.script.set_default("claude", respond).set_default("api", api)
    team = _team(tmp_path / "team.yaml", fakes, api=True, answers=2)
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        view = await cli_job(service, team, project, verify="pytest -q")
        events = list(service.store.sync.events(view.job_id))
    letter = next(agent.letter for agent in view.agents if agent.model == "cli/claude-code")
    print(view.text())
    assert view.state == "completed" and view.result and view.result.winner == f"{letter}1", view.text()
    assert first_decision and claude.decisions, "the second decision run never came"
    cancelled = next(
        index for index, e in enumerate(events) if e.kind == "turn_cancelled" and e.letter == letter
    )
    assert any(event.kind == "vote" and event.letter == letter for event in events[cancelled:])
    # the killed run was charged (then the next decision run): exactly what its stream reported when
    # the stalled response's start reached it, else an estimate (the CLI may not print it before its
    # first content: docs/subscriptions.md), so the total is not compared with the bill here
    # (charged as its stream goes, clis/meter.py: several usage events a run, their sum its total)
    charged = [e.charge for e in events[:cancelled] if e.kind == "usage" and e.letter == letter]
    assert sum(usage.input_tokens for usage in charged) > 0, charged
    after = [e.charge for e in events[cancelled:] if e.kind == "usage" and e.letter == letter]
    assert sum(usage.input_tokens for usage in after) > 0, after


async def test_a_winning_cli_member_presents_the_final_answer(
    clis_image: str, tmp_path: Path, fakes: FakeProviders, project: Path
) -> None:
    """`final: present`: Claude Code's fix wins the vote, and its presentation run (one more headless
    run in its container) writes the job's answer; the diff is its workspace change."""
    answer = "add() subtracted; I changed it and ran pytest.\n\nAnswer: add() returns a + b."
    claude = CliWorker("anthropic", FIX, answer)
    # a rewrite that keeps the winner's final line (a presentation may not change the final answer)
    presented = (
        "The bug was in add() in calc.py: it returned a - b. I changed that line, and the test in "
        "test_calc.py passes now (pytest -q: 1 passed).\n\nAnswer: add() returns a + b."
    )
    presentations: list[str] = []

    def respond(request: RecordedRequest) -> Reply:
        if "Write the final answer now." in request.text():
            presentations.append(request.text())
            return Reply(text=presented)
        return claude(request)

    def api_keeps_its_own(request: RecordedRequest) -> Reply:
        """Votes for its own answer: the winner has a vote to fold in, so presenting adds something (a
        winner every vote went to stands as it is, whichever order the votes came in)."""
        own = re.search(r"## Answer (\w+) \(your own answer\)", request.text())
        if own is None:
            return api_agent(request)
        return decide("vote", {"answer": own.group(1), "reason": "mine"}, request)

    fakes.script.set_default("claude", respond).set_default("api", api_keeps_its_own)
    team = _team(tmp_path / "team.yaml", fakes, api=True, final="present")
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        view = await cli_job(service, team, project, verify="pytest -q")
        patch = (await service.lookup.read(view.job_id, "@diff", None, 0, 100_000)).content
        events = list(service.store.sync.events(view.job_id))
    letter = next(agent.letter for agent in view.agents if agent.model == "cli/claude-code")
    print(view.text())
    assert view.state == "completed" and view.result and view.result.winner == f"{letter}1", view.text()
    assert presentations, "the winner never presented"
    assert view.answer == presented
    assert [event.letter for event in events if event.kind == "presenting"] == [letter]
    finished_event = next(event for event in events if event.kind == "finished")
    assert finished_event.result.presented_by == letter
    assert "-    return a - b\n+    return a + b\n" in patch
    assert _usage(view, "cli/claude-code") == fakes.script.bill["claude"][:2]
