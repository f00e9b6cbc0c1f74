"""Budgets, end to end on the fake providers through the real SDKs: the job stops at its limit with the
best-supported answer so far, and its usage is exactly what the fakes billed, a retried attempt and
cancelled calls included; a cost budget needs prices; the estimate and list_teams' history."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
import yaml

from conclave.backends.base import Backend, Request, StreamEvent, Usage
from conclave.backends.retry import RetryPolicy
from conclave.config.models import AgentSpec, Team
from conclave.coordination.agents import Agent, ApiAgent
from conclave.coordination.members import endpoint_factory
from conclave.errors import InputError, OverLimit
from conclave.jobs.read.views import JobView, structured
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.agents import given_agents
from tests.fakes.environment import environment_of
from tests.fakes.script import RecordedRequest, Reply, Script
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, decide, install, team_data, vote_labels, voter, write_team

pytestmark = pytest.mark.anyio
ENV = {KEY_ENV: "test-key-0123456789"}
FAST = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05)
TASK = "What is the capital of France?"
SMALL = (1000, 10, 0)  # every scripted call's usage but one: exact figures, so the bill is known


def label_of(request: RecordedRequest, author: str) -> str | None:
    """The current label whose answer names `author` (answers say who wrote them)."""
    text = request.text()
    for label in vote_labels(request):
        if f"({author})" in text.split(f"## Answer {label}", 1)[-1].split("## Answer", 1)[0]:
            return label
    return None


def vote_for(author: str, **reply: Any) -> Callable[[RecordedRequest], Reply]:
    """Answer once (naming yourself), then vote for `author`'s answer (your own until it exists)."""

    def respond(request: RecordedRequest) -> Reply:
        if not label_of(request, request.agent):
            made = decide("new_answer", {"content": f"Paris ({request.agent})."}, request)
        else:
            target = label_of(request, author) or label_of(request, request.agent)
            made = decide("vote", {"answer": target, "reason": "it is right"}, request)
        made.usage, made.delay = SMALL, reply.get("delay", 0.05)
        made.stall = reply.get("stall", 0.0)
        return made

    return respond


def by_call(*steps: Callable[[RecordedRequest], Reply]) -> Callable[[RecordedRequest], Reply]:
    """The n-th request gets the n-th responder; the last one answers every request after."""
    counter = itertools.count()

    def respond(request: RecordedRequest) -> Reply:
        return steps[min(next(counter), len(steps) - 1)](request)

    return respond


def cut(request: RecordedRequest) -> Reply:
    return Reply(text="...", cut_stream=True, usage=SMALL)  # Anthropic bills message_start's input


async def run_job(service: JobService, team: str, **options: Any) -> JobView:
    view = await service.submit(JobRequest(task=TASK, team=team, **options))
    with anyio.fail_after(60):
        while not view.done:
            view = await service.wait(view.job_id, 10)
    return view


def over_budget(request: RecordedRequest) -> Reply:
    """A vote whose first chunk reports 50,000 input tokens, then stalls: the budget is reached mid-call."""
    made = decide("vote", {"answer": label_of(request, "bob"), "reason": "fine"}, request)
    made.text, made.usage, made.delay, made.stall = "Let me weigh these answers.", (50_000, 10, 0), 1.5, 30
    return made


def budget_scenario(script: Script) -> None:
    """ann (OpenAI) answers and votes for bob; bob (Anthropic) answers after a stream cut midway and a
    retry, then its vote turn stalls after message_start and is cancelled as stale when cy answers; cy
    (Gemini) answers late, and its next call's first chunk reports 50,000 input tokens: over 40,000."""
    script.set_default("ann", vote_for("bob"))
    script.set_default(
        "bob", by_call(cut, vote_for("bob", delay=0.1), vote_for("bob", stall=30), vote_for("bob", delay=0.1))
    )
    script.set_default("cy", by_call(vote_for("cy", delay=0.8), over_budget))


BUDGET = 40_000


async def test_the_job_stops_at_its_token_budget_and_usage_equals_the_bill(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    budget_scenario(fakes.script)
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        view = await run_job(service, team, max_tokens=BUDGET)
        events = await service.store.events(view.job_id)

    bob = next(a.letter for a in view.agents if a.model.endswith("bob"))
    assert (
        view.state == "completed" and view.result.reason and view.result.reason.startswith("budget reached: ")
    ), view.text()
    assert (
        view.result.fallback and not view.result.consensus and view.result.winner == f"{bob}1"
    )  # the best supported: 2 votes
    assert view.answer == "Paris (bob)." and view.budget == {"max_tokens": 40_000}  # no presentation call
    assert view.usage.tokens >= 40_000 and "the answer with the most current votes" in view.result.reason
    kinds = [event.kind for event in events]
    stop = kinds.index("budget_reached")
    assert "turn_started" not in kinds[stop:]  # no new turn once the budget was reached
    assert "turn_cancelled" in kinds[:stop] and "turn_cancelled" in kinds[stop:]  # stale, then in flight
    for agent in view.agents:  # every token the providers reported, and nothing else
        name = agent.model.removeprefix(agent.model.split("-")[0] + "-")
        usage = agent.usage
        assert (usage.input_tokens, usage.output_tokens, usage.cached_input_tokens) == fakes.script.bill[name]
    # bob: the cut attempt's and the cancelled stale call's input were billed and are counted
    assert len(fakes.script.requests_of("bob")) == 4 and fakes.script.bill["bob"] == (4000, 22, 0)
    assert fakes.script.bill["cy"] == (51_000, 10, 0)  # the stalled call's first chunk, cancelled after it


async def test_a_cost_budget_stops_the_job_too(tmp_path: Path, fakes: FakeProviders) -> None:
    install(fakes.script, TRIO, voter())
    # US$ per million tokens: a first call is ~$0.0025 (~140 in, ~11 out), so the three first calls cost
    # ~$0.0074 together, however they interleave. $0.009 is reached only by a fourth call, and a fourth
    # call starts only once the protocol has taken an answer: the job ends with answers to choose from.
    price = {"input": 10.0, "output": 100.0}
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO, price=price))
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        view = await run_job(service, team, max_cost_usd=0.009)
    assert view.state == "completed" and view.result.reason.startswith("budget reached: $"), view.text()
    assert (
        view.usage.cost_usd is not None
        and view.usage.cost_usd >= 0.009
        and view.budget == {"max_cost_usd": 0.009}
    )


async def test_a_cost_budget_needs_a_price_for_every_agent(tmp_path: Path, fakes: FakeProviders) -> None:
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV)) as service:
        with pytest.raises(
            InputError, match=r"max_cost_usd=0\.5 is not valid: a cost budget needs a price"
        ) as caught:
            await service.submit(JobRequest(task=TASK, team=team, max_cost_usd=0.5))
        assert "openai/fake-ann" in str(caught.value) and "max_tokens instead" in str(caught.value)
        for field, value in (
            ("max_tokens", 0),
            ("max_tokens", 1.5),
            ("max_cost_usd", -1.0),
            ("max_cost_usd", float("nan")),
        ):
            with pytest.raises(InputError, match=field):
                await service.submit(JobRequest(task=TASK, team=team, **{field: value}))
        assert await service.store.recent_jobs() == []  # nothing was queued


async def test_the_team_file_sets_default_budgets(tmp_path: Path, fakes: FakeProviders) -> None:
    install(fakes.script, TRIO, voter())
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO, coordination={"max_tokens": 1}))
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        from_file = await run_job(service, team)
        # a caller may lower a team's limit, never raise it (tests/security/test_budget_ceilings.py)
        with pytest.raises(OverLimit, match="team 'fake-team' allows at most 1"):
            await run_job(service, team, max_tokens=10**9)
    assert from_file.result.reason.startswith("budget reached: ") and from_file.budget == {"max_tokens": 1}


async def test_the_estimate_comes_from_past_jobs_and_list_teams_shows_history(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    install(fakes.script, TRIO, voter())
    config = tmp_path / "config"
    write_team(
        config / "conclave" / "teams" / "priced.yaml",
        fakes,
        TRIO,
        name="priced",
        price={"input": 2.0, "output": 8.0},
    )
    env = {**ENV, "XDG_CONFIG_HOME": str(config)}
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), env, FAST)) as service:
        assert next(t for t in (await service.lookup.teams()).teams if t.name == "priced").history is None
        first = await service.submit(JobRequest(task=TASK, team="priced", max_tokens=10**6))
        assert first.estimate is not None and first.estimate.jobs == 0 and first.estimate.tokens is None
        assert "no past jobs of team 'priced'" in first.estimate.note
        assert first.estimate.cost_usd == [0.0, 8.0]  # the budget caps it: 10^6 tokens at $8 per million
        assert structured(first)["estimate"] == first.estimate.model_dump(exclude_none=True)
        done = first
        with anyio.fail_after(60):
            while not done.done:
                done = await service.wait(first.job_id, 10)
        assert done.estimate is None  # once done, `usage` says what it took
        # the listing before the second job, which the fakes may finish before a later listing
        teams = await service.lookup.teams()
        listed = next(t for t in teams.teams if t.name == "priced")
        second = await service.submit(JobRequest(task=TASK, team="priced"))
        await service.cancel(second.job_id)

    tokens, cost = done.usage.tokens, done.usage.cost_usd
    # the estimate sums the stored rows again in another order: a cost on a rounding edge (0.00745)
    # may round either way at the fourth decimal
    near = pytest.approx(cost, abs=1e-4)
    assert second.estimate.jobs == 1 and second.estimate.tokens == [tokens, tokens]
    assert second.estimate.cost_usd == [near, near] and second.estimate.typical_tokens == tokens
    assert listed.history is not None and (listed.history.jobs, listed.history.typical_tokens) == (1, tokens)
    assert listed.history.typical_cost_usd == near
    shown = f"${listed.history.typical_cost_usd:.4f}"
    assert f"typically {tokens:,} tokens, {shown} per job (1 past job here)" in teams.text()


def priced_team(path: Path, fakes: FakeProviders, price: dict[str, float]) -> str:
    """TRIO with a price for ann only: bob's and cy's providers bill tokens Conclave cannot cost."""
    data = team_data(fakes, TRIO)
    data["agents"][0]["price"] = price
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return str(path)


def priced(bill: tuple[int, int, int], price: dict[str, float]) -> float:
    return (bill[0] * price["input"] + bill[1] * price["output"]) / 1e6


async def test_an_agent_without_a_price_leaves_the_jobs_cost_known_and_partial(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    """ann has a price, bob and cy none: the job's cost is ann's, marked partial (it was None: one agent
    without a cost hid every other's); each agent's own figure is as it was."""
    install(fakes.script, TRIO, voter())
    price = {"input": 2.0, "output": 8.0}
    team = priced_team(tmp_path / "team.yaml", fakes, price)
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        view = await run_job(service, team)
    # what each agent was charged: a turn cancelled as stale before its provider said anything is charged
    # an estimate of its input, marked as such (tests/test_billing.py); what the providers reported is
    # never more than they billed
    used = {agent.model.rsplit("-", 1)[1]: agent.usage for agent in view.agents}
    ann = used["ann"]
    assert 0 < ann.tokens - ann.estimated_input_tokens <= sum(fakes.script.bill["ann"][:2])
    ann_cost = priced((ann.input_tokens, ann.output_tokens, 0), price)
    assert view.usage.cost_usd == pytest.approx(ann_cost), view.text()
    unpriced = used["bob"].tokens + used["cy"].tokens
    assert view.usage.cost_partial and view.usage.uncosted_tokens == unpriced > 0
    approx = "~" if view.usage.estimated else ""  # part of ann's cost prices an estimate
    cost = f"cost ≥ {approx}${view.usage.cost_usd:.4f} (partial: {unpriced:,} tokens without a cost)"
    assert cost in view.text()
    costs = {name: usage.cost_usd for name, usage in used.items()}
    assert costs == {"ann": pytest.approx(ann_cost), "bob": None, "cy": None}


@dataclass
class SomeCallsCosted:
    """bob's provider, saying the cost of every odd call itself (as a CLI says its run's cost) and
    nothing of the others: what it reported, costed and not, is kept for the test."""

    inner: Backend
    provider: ClassVar[str] = "anthropic"
    calls: int = 0  # calls that reported usage (one cancelled before it reported any is not counted)
    cost: float = 0.0
    uncosted_tokens: int = 0

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        costed: bool | None = None  # decided at the call's first report: odd calls say their cost
        async for event in self.inner.stream(request):
            if isinstance(event, Usage):
                if costed is None:
                    self.calls += 1
                    costed = self.calls % 2 == 1
                if costed:
                    self.cost += 0.01
                    event = event.costing(0.01)
                else:
                    self.uncosted_tokens += event.tokens
            yield event

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_charges_with_and_without_a_cost_sum_to_every_known_cost(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    """bob's charges come with a cost and without one, in turn: its cost is the sum of every cost that
    came (a charge without one used to wipe the cost before it), partial by the tokens of the others,
    in the job's total and in the stored usage that estimates read."""
    install(fakes.script, TRIO, voter())
    price = {"input": 2.0, "output": 8.0}
    team = priced_team(tmp_path / "team.yaml", fakes, price)
    made = endpoint_factory(ENV)
    real_bob = made(Team.model_validate(team_data(fakes, TRIO)).agents[1])
    assert isinstance(real_bob, ApiAgent)
    bob = SomeCallsCosted(real_bob.backend)

    def backends(spec: AgentSpec) -> Agent:
        return ApiAgent(bob) if spec.model.endswith("bob") else made(spec)

    settings = Settings(home=tmp_path / "state")
    async with JobService.serve(given_agents(environment_of(settings, ENV, FAST), backends)) as service:
        view = await run_job(service, team)
        stored = await service.store.team_usage("fake-team")
    assert bob.calls >= 2 and bob.uncosted_tokens > 0, view.text()  # both kinds of charge came
    usage = {agent.model.rsplit("-", 1)[1]: agent.usage for agent in view.agents}
    assert usage["bob"].cost_usd == pytest.approx(bob.cost) and usage["bob"].cost_partial
    # bob's estimate of a call cancelled as stale before it reported (a slow machine's order) has no cost
    bob_estimated = usage["bob"].estimated_input_tokens
    assert usage["bob"].uncosted_tokens == bob.uncosted_tokens + bob_estimated
    # ann's and cy's as charged: what their providers reported never above their bill (a turn cancelled
    # as stale before its provider said anything is charged an estimate besides, marked as such)
    ann, cy = usage["ann"], usage["cy"]
    for name, used in (("ann", ann), ("cy", cy)):
        assert used.tokens - used.estimated_input_tokens <= sum(fakes.script.bill[name][:2])
    assert view.usage.cost_usd == pytest.approx(
        priced((ann.input_tokens, ann.output_tokens, 0), price) + bob.cost
    )
    assert view.usage.uncosted_tokens == bob.uncosted_tokens + bob_estimated + cy.tokens
    assert [row.usage for row in stored[0]] == [
        agent.usage for agent in sorted(view.agents, key=lambda a: a.letter)
    ]


@pytest.mark.parametrize("priced", [True, False])
def test_an_estimate_is_the_teams_history_with_a_range_beside_it(priced: bool) -> None:
    """One record of what past jobs used (TeamHistory, list_teams): ask_team's estimate carries the same
    typical figures, with the range beside them; unpriced, neither has a cost."""
    from conclave.jobs.admission.estimate import estimate, history
    from conclave.jobs.store.sql import AgentUsage

    price = {"price": {"input": 1.0, "output": 2.0}} if priced else {}
    team = Team.model_validate({"name": "t", "agents": [{"model": "openai/a", **price}]})
    past = [
        [
            AgentUsage(
                job_id=f"cj-{n}",
                model="openai/a",
                usage=Usage(input_tokens=n * 100_000, output_tokens=n * 1000),
            )
        ]
        for n in (1, 3, 8)
    ]
    typical, found = history(team, past), estimate(team, past)
    assert typical is not None and typical.jobs == found.jobs == 3
    assert (found.typical_tokens, found.typical_cost_usd) == (
        typical.typical_tokens,
        typical.typical_cost_usd,
    )
    assert found.typical_tokens == 303_000 and found.tokens == [101_000, 808_000]
    assert found.typical_cost_usd == (0.306 if priced else None)
    assert found.cost_usd == ([0.102, 0.816] if priced else None)
    assert history(team, []) is None and estimate(team, []).typical_tokens is None
