"""How the team decides, end to end with the fake providers over the real SDKs: no vote by position,
equivalent answers agree, consensus only with a strict majority, apply only with consensus, non-answers
refused, presentations that would change the answer refused, and every stop returns a marked answer."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from conclave.backends import create_backend
from conclave.backends.base import Backend, Endpoint
from conclave.config.models import AgentSpec, Team
from conclave.coordination.agents import Agent, ApiAgent
from conclave.coordination.members import endpoint_factory
from conclave.coordination.orchestrator import Orchestrator, Shared
from conclave.coordination.reports import JobResult
from conclave.jobs.read.views import JobView
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import (
    KEY_ENV,
    TRIO,
    decide,
    install,
    is_presentation,
    split_choices,
    team_data,
    voter,
    write_team,
)
from tests.test_orchestrator import FAST_RETRY, MemorySink

pytestmark = pytest.mark.anyio
ENV = {KEY_ENV: "test-key-0123456789"}
TASK = "What is the capital of France?"
CITIES = {"ann": "Paris.", "bob": "London.", "cy": "Rome."}
_OWN = re.compile(r"## Answer ([A-Z][0-9]+) \(your own answer\)")


def city(request: RecordedRequest) -> str:
    return CITIES[request.agent]


def enum_order(request: RecordedRequest) -> list[str]:
    """The labels of a vote, in the order this voter was shown them (the schema's enum)."""
    body = json.dumps(request.body)
    found = re.search(r'"answer": \{"type": "string", "enum": (\[[^\]]*\])', body)
    return json.loads(found.group(1)) if found else split_choices(request)


@pytest.fixture(autouse=True, scope="module")
def warm_sdks() -> None:
    """Load the three SDKs once, up front: the first client of each takes seconds to build, which must
    not eat the short timeouts these tests set (a job's set-up counts against its timeout)."""
    for provider in ("openai", "anthropic", "gemini"):
        create_backend(
            Endpoint(
                provider=provider,
                model="warm-up",
                api_key="unused-key",
                base_url="http://127.0.0.1:9/v1",
                timeout_s=5.0,
            )
        )


async def run(
    fakes: FakeProviders,
    job_id: str = "cj-0123456789ab",
    factory: Callable[[AgentSpec], Agent] | None = None,
    **options: Any,
) -> tuple[JobResult, MemorySink]:
    team = Team.model_validate(team_data(fakes, TRIO, **options))
    sink = MemorySink()
    orchestrator = Orchestrator(
        job_id, TASK, team, sink, Shared(factory or endpoint_factory(ENV), FAST_RETRY)
    )
    with anyio.fail_after(60):
        return await orchestrator.run(), sink


def self_voter(request: RecordedRequest) -> Reply:
    """Answers with its city, then votes for its own answer."""
    if is_presentation(request):
        return Reply(text="unused")
    own = _OWN.search(request.text())
    if own is None:
        return decide("new_answer", {"content": city(request)}, request)
    return decide("vote", {"answer": own.group(1), "reason": "mine"}, request)


# Position -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("turn", ["single", "split"])
async def test_a_voter_that_takes_the_first_label_shown_no_longer_decides_the_winner(
    fakes: FakeProviders, turn: str
) -> None:
    install(fakes.script, TRIO, voter(answer=city, by_position=True))
    unanimous = 0
    for job in ("cj-00000000000a", "cj-00000000000b", "cj-00000000000c", "cj-00000000000d"):
        fakes.script.requests.clear()
        result, sink = await run(fakes, job, turn=turn, coordination={"final": "reuse"})
        orders = {}
        for request in fakes.script.requests:
            if enum_order(request):
                orders[request.agent] = enum_order(request)
        votes = {event.letter: event.label for event in sink.kinds("vote")}
        assert sorted(votes.values()) == sorted(order[0] for order in orders.values())  # it voted by position
        assert len({tuple(order) for order in orders.values()}) > 1, "every voter saw one order"
        unanimous += len(set(votes.values())) == 1
        assert result.consensus == (max(map(list(votes.values()).count, votes.values())) >= 2)
    assert unanimous < 4  # with one order for all, position alone made every job unanimous


# Equivalent answers and honest consensus ------------------------------------------------------------
async def test_self_votes_for_different_answers_are_no_consensus(fakes: FakeProviders) -> None:
    install(fakes.script, TRIO, self_voter)
    result, _ = await run(fakes, coordination={"final": "reuse"})
    assert result.all_voted and not result.consensus and result.tie
    assert (result.votes, result.voters) == (1, 3) and not result.agree


async def test_equivalent_answers_agree_and_their_votes_make_a_majority(fakes: FakeProviders) -> None:
    CITIES["bob"] = "The capital of France is Paris."
    try:
        install(fakes.script, TRIO, self_voter)
        result, _ = await run(fakes, coordination={"final": "reuse"})
    finally:
        CITIES["bob"] = "London."
    paris = sorted(result.agree[0])
    assert len(result.agree) == 1 and len(paris) == 2
    assert result.consensus and result.winner in paris and (result.votes, result.voters) == (2, 3)
    # voters were shown which answers agree
    seen = [r.text() for r in fakes.script.requests if "(the same final answer as" in r.text()]
    assert seen and all(label in " ".join(seen) for label in paris)


# Non-answers -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "junk", ["{", '{"action": "new', "This is a question about France. It asks for the capital."]
)
async def test_non_answers_are_refused_with_a_corrective_turn(fakes: FakeProviders, junk: str) -> None:
    install(fakes.script, TRIO, voter(answer=city))
    fakes.script.enqueue("ann", Reply(tool_calls=[("new_answer", {"content": junk})]))
    result, sink = await run(fakes, coordination={"final": "reuse"})
    refused = sink.kinds("answer_refused")
    assert len(refused) == 1 and refused[0].error.startswith("answer refused: ")
    posted = [event.content for event in sink.kinds("answer")]
    assert junk not in posted and "Paris." in posted
    again = fakes.script.requests_of("ann")[1].text()
    assert "answer refused" in again  # the corrective turn says why
    assert result.winner is not None and result.answer != junk


# Presentation -----------------------------------------------------------------------------------------
async def test_a_presentation_that_changes_the_final_answer_is_refused(fakes: FakeProviders) -> None:
    install(fakes.script, TRIO, voter(answer=city, final=lambda request: "The capital of France is Lyon."))
    result, _ = await run(fakes)
    assert result.presented_by is None and result.answer in CITIES.values()
    assert "changed the final answer" in result.reason and "returned as it stands" in result.reason


async def test_a_presentation_that_keeps_the_answer_is_used(fakes: FakeProviders) -> None:
    install(
        fakes.script, TRIO, voter(answer=lambda r: "Paris", final=lambda r: "Paris is the capital of France.")
    )
    result, _ = await run(fakes)
    assert result.presented_by is not None and result.answer == "Paris is the capital of France."


# Stops -------------------------------------------------------------------------------------------------
async def test_timeout_returns_the_best_supported_answer_marked(fakes: FakeProviders) -> None:
    install(fakes.script, TRIO[:2], voter(answer=lambda r: "Paris"))
    fakes.script.set_default("cy", lambda request: Reply(text="never", delay=30))
    result, sink = await run(fakes, coordination={"timeout_s": 2.0})
    assert result.fallback and not result.consensus and not result.all_voted
    assert result.winner is not None and result.answer == "Paris" and "timeout" in result.reason
    assert sink.kinds("deadline")


async def test_timeout_during_the_presentation_returns_the_winner_not_presented(fakes: FakeProviders) -> None:
    slow_final = voter(answer=lambda r: "Paris", delay=0.0)

    def responder(request: RecordedRequest) -> Reply:
        reply = slow_final(request)
        if is_presentation(request):
            reply.delay = 30
        return reply

    install(fakes.script, TRIO, responder)
    result, sink = await run(fakes, coordination={"timeout_s": 3.0})
    assert sink.kinds("presenting") and result.presented_by is None
    assert result.answer == "Paris" and result.consensus and not result.fallback
    assert "not presented" in result.reason and "timeout" in result.reason


async def test_timeout_covers_the_set_up(fakes: FakeProviders) -> None:
    install(fakes.script, TRIO, voter())
    real = endpoint_factory(ENV)
    built: list[str] = []

    def slow(spec: AgentSpec) -> Agent:
        import time

        built.append(spec.model)
        time.sleep(3)  # sleep-ok: a backend that takes long to build (an SDK import on a busy machine)
        return real(spec)

    result, sink = await run(fakes, factory=slow, coordination={"timeout_s": 1.0})
    assert len(built) == 1  # abandoned at the deadline while building the first, never the other two
    assert result.failed and result.winner is None and "while setting up" in result.reason
    assert [event.kind for event in sink.events] == ["deadline", "finished"]
    assert fakes.script.requests == []


# An unexpected error in one turn ----------------------------------------------------------------------
class _Flaky:
    """A backend whose first call fails with an error no provider maps (a bug, not a ProviderError)."""

    def __init__(self, inner: Backend) -> None:
        self.inner, self.calls, self.provider = inner, 0, inner.provider

    def stream(self, request: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise KeyError("unexpected")
        return self.inner.stream(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_an_unexpected_error_fails_the_turn_not_the_job(fakes: FakeProviders) -> None:
    install(fakes.script, TRIO, voter())
    real = endpoint_factory(ENV)

    def factory(spec: AgentSpec) -> Agent:
        agent = real(spec)
        assert isinstance(agent, ApiAgent)
        return ApiAgent(_Flaky(agent.backend)) if spec.model.endswith("bob") else agent  # type: ignore[arg-type]

    result, sink = await run(fakes, factory=factory, coordination={"final": "reuse"})
    failed = sink.kinds("turn_failed")
    assert len(failed) == 1 and "KeyError" in failed[0].error
    assert not sink.kinds("agent_failed") and not result.errors
    assert result.consensus and result.voters == 3


async def test_an_agent_whose_turns_keep_failing_drops_out(fakes: FakeProviders) -> None:
    install(fakes.script, TRIO, voter())
    real = endpoint_factory(ENV)

    class Broken(_Flaky):
        def stream(self, request: Any) -> Any:
            raise ValueError("always")

    def factory(spec: AgentSpec) -> Agent:
        agent = real(spec)
        assert isinstance(agent, ApiAgent)
        return ApiAgent(Broken(agent.backend)) if spec.model.endswith("cy") else agent  # type: ignore[arg-type]

    result, sink = await run(fakes, factory=factory, coordination={"final": "reuse", "max_failed_turns": 2})
    assert len(sink.kinds("agent_failed")) == 1 and len(result.errors) == 1
    assert result.winner is not None and result.voters == 2


# apply -------------------------------------------------------------------------------------------------
NEW_CALC = "def add(a, b):\n    return a + b\n"


def fixer(request: RecordedRequest) -> Reply:
    """ann fixes calc.py, answers first and votes for its fix; bob and cy answer later without files and
    vote for their own: a 1-1-1 split that the tie-break gives to ann's fix, without consensus."""
    text = request.text()
    if is_presentation(request):
        return Reply(text="unused")
    own = _OWN.search(text)
    if own is not None:
        return decide("vote", {"answer": own.group(1), "reason": "mine"}, request)
    if request.agent == "ann" and "wrote" not in text:
        return Reply(tool_calls=[("write_file", {"path": "calc.py", "content": NEW_CALC})])
    reply = decide("new_answer", {"content": f"add() is fixed, says {request.agent}"}, request)
    reply.delay = 0 if request.agent == "ann" else 1.5
    return reply


@pytest.mark.parametrize(("apply", "applied"), [(True, False), ("force", True)])
async def test_apply_needs_consensus_unless_forced(
    tmp_path: Path, fakes: FakeProviders, apply: object, applied: bool
) -> None:
    install(fakes.script, TRIO, fixer)
    project = tmp_path / "proj"
    project.mkdir()
    project.joinpath("calc.py").write_text("def add(a, b):\n    return a - b\n")
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO, coordination={"final": "reuse"}))
    async with JobService.serve(environment_of(Settings(home=tmp_path / "home"), ENV)) as service:
        view: JobView = await service.submit(
            JobRequest(
                task="Fix add()",
                team=team,
                context_paths=[{"path": str(project), "permission": "write"}],
                apply=apply,
            )
        )  # type: ignore[arg-type]
        with anyio.fail_after(60):
            while not view.done:
                view = await service.wait(view.job_id, 10)
    assert view.state == "completed" and view.result.consensus is False, view.text()
    ann = next(agent.letter for agent in view.agents if agent.model.endswith("ann"))
    assert view.result.winner == f"{ann}1" and view.result.tie
    assert view.majority is not None and view.majority.startswith("no majority: 1 of 3 votes")
    assert view.diff_summary is not None
    context = view.diff_summary.model_dump()["contexts"][0]
    assert context["applied"] is applied
    assert (project.joinpath("calc.py").read_text() == NEW_CALC) is applied
    if not applied:
        assert "no consensus" in context["apply_error"] and "force" in context["apply_error"]


# The split turn on a provider that cannot score -----------------------------------------------------
async def test_split_turns_answer_in_plain_text_then_choose_or_revise(fakes: FakeProviders) -> None:
    install(fakes.script, TRIO, voter(answer=city))

    choices = []

    def bob(request: RecordedRequest) -> Reply:
        if split_choices(request):
            choices.append(request)
            if len(choices) == 1:  # its first decision: none is right, it writes a better one
                return Reply(text=json.dumps({"choice": "new"}))
        if "Answers written so far" in request.text():
            return Reply(text="Paris, not London.")
        return voter(answer=city)(request)

    fakes.script.set_default("bob", bob)
    result, sink = await run(fakes, turn="split", coordination={"final": "reuse"})
    first = fakes.script.requests_of("ann")[0]
    assert "tools" not in first.body and "response_format" not in first.body  # a plain answer call
    assert "What is the capital of France?" in first.text() and "vote" not in first.text()
    revised = [event.content for event in sink.kinds("answer") if event.revision == 2]
    assert revised == ["Paris, not London."]  # bob chose "new" and wrote again, the others as material
    assert result.winner is not None and result.all_voted


async def test_apply_takes_true_false_or_force_only(tmp_path: Path) -> None:
    from conclave.errors import InputError

    async with JobService.serve(environment_of(Settings(home=tmp_path / "home"), ENV)) as service:
        with pytest.raises(InputError, match='"force"'):
            await service.submit(JobRequest(task="task", team="local", context_paths=[], apply="yes"))  # type: ignore[arg-type]


def test_the_cli_asks_for_apply_with_or_without_consensus() -> None:
    from conclave.cli.main import build_parser

    parse = build_parser().parse_args
    assert parse(["ask", "t"]).apply is False
    assert parse(["ask", "t", "--apply"]).apply is True
    assert parse(["ask", "t", "--force-apply"]).apply == "force"
