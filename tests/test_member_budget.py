"""A member's own token limit (`budget.max_tokens` in its team entry), end to end on the fake providers
through the real SDKs: the member that reaches it takes no more turns, the others finish the vote, and
the result, get_status and the CLI's table say so; each member's spend is shown beside it."""

from __future__ import annotations

import re
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import anyio
import pytest
import yaml
from rich.console import Console

from conclave.backends.base import Usage
from conclave.cli.render import render
from conclave.config.loading import parse_team
from conclave.config.models import Team
from conclave.coordination.members import assign_letters, seed_for
from conclave.coordination.orchestrator import Orchestrator, Shared
from conclave.coordination.protocol_events import AnswerPosted, ProtocolEvent, StartTurn, VoteCast
from conclave.coordination.reports import Check, JobEvent, Progress
from conclave.coordination.turn_context import TurnContext
from conclave.coordination.verification import CheckRun
from conclave.errors import ConfigError, InputError
from conclave.jobs.read.views import JobView, structured
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, decide, team_data, vote_labels

pytestmark = pytest.mark.anyio
ENV = {KEY_ENV: "test-key-0123456789"}
CALL = (1000, 10, 0)  # every call's usage: the bill is known
LIMIT = 1500  # bob's own: its first call (1,010 tokens) fits, its second one's start (Anthropic) does not


def answer_then_vote_for_ann(request: RecordedRequest) -> Reply:
    """Answer once (answers name their author), then vote for ann's answer. On a slow machine a member's
    second turn can come before ann has posted: it then votes for the first answer it is shown, and
    ann's answer, when it comes, resets that vote."""
    text = request.text()
    if "(your own answer)" not in text:
        made = decide("new_answer", {"content": f"Paris ({request.agent})."}, request)
    else:
        labels = vote_labels(request)
        ann = next(
            (
                label
                for label in labels
                if "(ann)" in text.split(f"## Answer {label}", 1)[-1].split("## Answer", 1)[0]
            ),
            labels[0],
        )
        made = decide("vote", {"answer": ann, "reason": "it is right"}, request)
    made.usage, made.delay = CALL, 0.05
    return made


async def test_a_member_at_its_own_limit_stops_and_the_others_finish(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    # bob's first answer is held until ann's and cy's are posted: its second call then starts with every
    # answer in, so no new answer makes it stale (a cancelled call stays charged its estimate, which
    # would stop bob before the call the test watches)
    others_posted = threading.Event()

    def bob_answers_last(request: RecordedRequest) -> Reply:
        first = "(your own answer)" not in request.text()
        made = answer_then_vote_for_ann(request)
        return replace(made, gate=others_posted) if first else made

    for _, agent in TRIO:
        fakes.script.set_default(agent, bob_answers_last if agent == "bob" else answer_then_vote_for_ann)
    data = team_data(fakes, TRIO, coordination={"final": "reuse"})
    data["agents"][1]["budget"] = {"max_tokens": LIMIT}  # bob (Anthropic)
    team = tmp_path / "team.yaml"
    team.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV)) as service:
        view = await service.submit(JobRequest(task="What is the capital of France?", team=str(team)))
        with anyio.fail_after(60):
            while sum(e.kind == "answer" for e in await service.store.events(view.job_id)) < 2:
                await anyio.sleep(0.02)  # polls the store: the job's events are the only witness
            others_posted.set()
            while not view.done:
                view = await service.wait(view.job_id, 10)
        events = await service.store.events(view.job_id)

    by_name = {agent.model.rsplit("-", 1)[-1]: agent for agent in view.agents}
    bob, ann = by_name["bob"], by_name["ann"]
    assert view.state == "completed" and view.result is not None, view.text()
    # bob is out at its own limit, in the middle of its second call; no call of its started after it
    assert bob.state == "stopped" and bob.max_tokens == LIMIT and bob.vote is None
    assert bob.error and bob.error.startswith("its own token limit reached: 2,011 tokens used"), bob.error
    assert len(fakes.script.requests_of("bob")) == 2 and bob.usage.tokens >= LIMIT
    # counted as the stream reported it, up to the stop: all the input, the output that reached us
    billed = fakes.script.bill["bob"]
    assert bob.usage.input_tokens == billed[0] and bob.usage.output_tokens <= billed[1]
    # the others finished the vote: ann's answer, chosen by both of them; the result names bob's stop
    assert view.result.winner == f"{ann.letter}1" and view.result.consensus and not view.result.fallback
    assert view.result.errors == {bob.letter: bob.error}
    assert [e.letter for e in events if e.kind == "agent_failed"] == [bob.letter]
    # the charge that crossed the limit is in the transcript too, before the drop
    charges = [e for e in events if e.kind == "usage" and e.letter == bob.letter]
    assert sum(e.charge.input_tokens for e in charges) == bob.usage.input_tokens
    assert events.index(charges[-1]) < next(i for i, e in enumerate(events) if e.kind == "agent_failed")
    assert f"  {bob.letter} stopped: its own token limit reached" in view.text()
    # every member's spend: what the fakes billed, and its part of the job's tokens
    shares = {agent.letter: agent.token_share for agent in view.agents}
    assert sum(s or 0 for s in shares.values()) == pytest.approx(1, abs=1e-3)
    for agent in view.agents:
        assert agent.token_share == pytest.approx(agent.usage.tokens / view.usage.tokens, abs=1e-4)
    # get_status's structured result carries each member's spend and limit
    data = structured(view)
    members = {a["letter"]: a for a in data["progress"]["agents"]}  # type: ignore[index]
    assert members[bob.letter]["usage"]["input_tokens"] == bob.usage.input_tokens
    assert members[bob.letter]["max_tokens"] == LIMIT and members[bob.letter]["state"] == "stopped"
    assert JobView.model_validate(data).agents == view.agents
    # and the CLI's table
    console = Console(width=140, record=True)
    console.print(render(view))
    table = console.export_text()
    row = next(line for line in table.splitlines() if f" {bob.letter} " in line and "bob" in line)
    assert "stopped" in row and f"{bob.usage.input_tokens:,}" in row and f"{shares[bob.letter]:.0%}" in row
    assert f"{bob.letter} stopped: its own token limit reached" in table


@pytest.mark.parametrize("value", [0, -3, "lots", 2.5, True, 10**11])
def test_a_bad_member_limit_names_the_field_the_value_and_the_fix(value: object) -> None:
    data = {"agents": [{"model": "openai/gpt-5", "budget": {"max_tokens": value}}]}
    with pytest.raises(ConfigError) as caught:
        parse_team(data, "team.yaml")
    message = str(caught.value)
    assert "team.yaml: agents.0.budget.max_tokens" in message and repr(value) in message
    assert "e.g. 300000" in message


def test_a_member_budget_takes_no_other_key() -> None:
    data = {"agents": [{"model": "openai/gpt-5", "budget": {"max_token": 1000}}]}
    with pytest.raises(
        ConfigError, match=re.escape("unknown key 'agents.0.budget.max_token'; did you mean 'max_tokens'")
    ):
        parse_team(data, "team.yaml")


async def test_the_callers_max_tokens_per_member_bounds_every_member(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    """ask_team's max_tokens_per_member lowers every member's limit under the team file's: bob's calls are
    big and it stops at its second; ann's and cy's small ones stay under and they finish the vote."""

    def big(request: RecordedRequest) -> Reply:
        made = answer_then_vote_for_ann(request)
        made.usage = (5000, 10, 0)
        return made

    fakes.script.set_default("ann", answer_then_vote_for_ann).set_default("bob", big)
    fakes.script.set_default("cy", answer_then_vote_for_ann)
    data = team_data(fakes, TRIO, coordination={"final": "reuse"})
    data["agents"][0]["budget"] = {"max_tokens": 100_000}  # the caller's lower limit replaces it
    team = tmp_path / "team.yaml"
    team.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV)) as service:
        with pytest.raises(InputError, match=r"max_tokens_per_member=0 is not valid: give a positive whole"):
            await service.submit(
                JobRequest(task="Capital of France?", team=str(team), max_tokens_per_member=0)
            )
        request = JobRequest(
            task="What is the capital of France?", team=str(team), max_tokens_per_member=6000
        )
        view = await service.submit(request)
        with anyio.fail_after(60):
            while not view.done:
                view = await service.wait(view.job_id, 10)

    by_name = {agent.model.rsplit("-", 1)[-1]: agent for agent in view.agents}
    ann, bob = by_name["ann"], by_name["bob"]
    assert {agent.max_tokens for agent in view.agents} == {6000}
    # two billed calls stop it; a third request is allowed only as a turn cancelled as stale once it had
    # reached the provider (a loaded machine's order): charged its estimate, marked
    asked = len(fakes.script.requests_of("bob"))
    assert bob.state == "stopped" and bob.usage.input_tokens - bob.usage.estimated_input_tokens == 10_000
    assert asked == 2 or (asked == 3 and bob.usage.estimated), view.text()
    assert ann.state != "stopped" and ann.usage.tokens < 6000
    assert view.result is not None and view.result.errors == {bob.letter: bob.error}
    assert view.result.winner == f"{ann.letter}1" and view.result.consensus


class HeldChecks:
    """The verifier as the orchestrator calls it (coordination/verification.py `Verifier`): every check
    passes, once `release` is set, so the agents' next turns wait until then."""

    concurrency = 1
    blocked: str | None = None  # the command runs on the caller's files

    def __init__(self) -> None:
        self.release = anyio.Event()

    async def warm(self, count: int = 1) -> None:
        pass

    async def close(self) -> None:
        pass

    async def run(self, label: str) -> CheckRun:
        await self.release.wait()
        return CheckRun(Check(status="passed", exit_code=0), "ok")


class AnswerSink:
    """The job's events; `posted[letter]` is set once that agent's answer is recorded."""

    def __init__(self, letters: list[str]) -> None:
        self.events: list[JobEvent] = []
        self.posted = {letter: anyio.Event() for letter in letters}

    async def record(self, event: JobEvent, progress: Progress) -> None:
        self.events.append(event)
        if event.kind == "answer" and event.letter in self.posted:
            self.posted[event.letter].set()


@dataclass
class Scripted:
    """An agent whose turns are this test's: `act` makes each turn's event."""

    act: Callable[[TurnContext, StartTurn], Awaitable[ProtocolEvent]]
    turns: int = 0

    def attach(self, sandbox: object, secrets: object) -> None:
        pass

    async def turn(self, ctx: TurnContext, action: StartTurn, shown: object, files: object) -> ProtocolEvent:
        self.turns += 1
        return await self.act(ctx, action)

    async def present(self, ctx: TurnContext, task: str, shown: object, outcome: object) -> str:
        return "unused"

    async def aclose(self) -> None:
        pass


async def test_a_limit_reached_between_turns_fails_the_next_turn_before_it_calls_anything() -> None:
    """x's last charge lands while x waits for the checks (a killed CLI run's final report comes like
    that): no turn of x's is in flight to stop, so its next turn fails at once, and x's agent is never
    asked again."""
    job_id, task = "cj-0123456789ab", "What is 6 times 7?"
    x, y = assign_letters(2, seed_for(job_id))
    sink, checks, charge_x = AnswerSink([x, y]), HeldChecks(), {}

    async def x_acts(ctx: TurnContext, action: StartTurn) -> ProtocolEvent:
        charge_x["late"] = ctx.on_usage
        await ctx.on_usage(Usage(40, 10), True)  # under its limit of 100
        return AnswerPosted(action.letter, action.turn_id, "6 times 7 is 42.\nAnswer: 42")

    async def y_acts(ctx: TurnContext, action: StartTurn) -> ProtocolEvent:
        if action.can_answer:
            await sink.posted[x].wait()  # x's answer is in, its check held: x waits for its next turn
            await charge_x["late"](Usage(100, 0), True)  # x reaches its limit with no turn in flight
            checks.release.set()
            return AnswerPosted(action.letter, action.turn_id, "It is 42.\nAnswer: 42")
        return VoteCast(action.letter, action.turn_id, f"{y}1", "mine")

    agents = {"openai/x": Scripted(x_acts), "openai/y": Scripted(y_acts)}
    team = Team.model_validate(
        {
            "name": "t",
            "agents": [
                {"model": "openai/x", "budget": {"max_tokens": 100}, "api_key_required": False},
                {"model": "openai/y", "api_key_required": False},
            ],
            "coordination": {"max_answers_per_agent": 1, "final": "reuse"},
            "sandbox": "none",
        }
    )
    orchestrator = Orchestrator(
        job_id,
        task,
        team,
        sink,
        Shared(lambda spec: agents[spec.model]),
        verifier=checks,  # type: ignore[arg-type]
    )
    with anyio.fail_after(30):
        result = await orchestrator.run()

    assert agents["openai/x"].turns == 1  # its next turn never reached the agent
    assert result.errors[x].startswith(
        "its own token limit reached: 150 tokens used of its budget.max_tokens 100"
    )
    kinds = [(event.kind, event.letter) for event in sink.events]
    assert kinds.index(("agent_failed", x)) > kinds.index(
        ("checked", y)
    )  # at its next turn, after the checks
    assert [a.state for a in orchestrator.progress().agents if a.letter == x] == ["stopped"]
