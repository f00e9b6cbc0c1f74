"""The orchestrator against the fake providers, through the real SDKs over HTTP."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from conclave.backends.retry import RetryPolicy
from conclave.config.models import Team
from conclave.coordination.members import assign_letters, endpoint_factory, seed_for
from conclave.coordination.orchestrator import Orchestrator, Shared
from conclave.coordination.reports import JobEvent, JobResult, Progress
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, decide, install, is_presentation, team_data, vote_labels, voter

pytestmark = pytest.mark.anyio
FAST_RETRY = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05)
JOB = "cj-0123456789ab"


Gate = tuple[str, str, threading.Event]  # (event kind, agent letter, the gate that event opens)


class MemorySink:
    """The job's events and progress, in order; `gates` open when the event they wait for is recorded.

    A gate is a scripted reply's `gate` (tests/fakes/script.py): the fake holds that reply until the
    orchestrator has recorded the event, which orders the job without sleeping.
    """

    def __init__(self, gates: tuple[Gate, ...] = ()) -> None:
        self.events: list[JobEvent] = []
        self.progress: list[Progress] = []
        self.gates = gates

    async def record(self, event: JobEvent, progress: Progress) -> None:
        self.events.append(event)
        self.progress.append(progress)
        for kind, letter, gate in self.gates:
            if event.kind == kind and event.letter == letter:
                gate.set()

    def kinds(self, kind: str) -> list[JobEvent]:
        return [event for event in self.events if event.kind == kind]


def letters_of(job_id: str = JOB) -> dict[str, str]:
    """The anonymous letter of each fake agent (ann, bob, cy) in this job."""
    letters = assign_letters(3, seed_for(job_id))
    return {agent: letter for (_, agent), letter in zip(TRIO, letters, strict=True)}


async def run(
    fakes: FakeProviders, job_id: str = JOB, gates: tuple[Gate, ...] = (), **options: Any
) -> tuple[JobResult, MemorySink]:
    """Run the job; every gate is opened at the end, so a reply held by a gate never outlives the test."""
    team = Team.model_validate(team_data(fakes, TRIO, **options))
    sink = MemorySink(gates)
    orchestrator = Orchestrator(
        job_id,
        "What is 6 times 7?",
        team,
        sink,
        Shared(endpoint_factory({KEY_ENV: "test-key-0123456789"}), FAST_RETRY),
    )
    try:
        return await orchestrator.run(), sink
    finally:
        for _, _, gate in gates:
            gate.set()


def scripted(
    letter_of: dict[str, str], first: dict[str, threading.Event | None], *, revise: bool = False
) -> Callable[[str], Any]:
    """Per agent: answer once (held by its gate in `first`), then vote for bob's latest answer.

    bob may revise.
    """
    bob = letter_of["bob"]

    def make(agent: str) -> Callable[[RecordedRequest], Reply]:
        def respond(request: RecordedRequest) -> Reply:
            if is_presentation(request):
                return Reply(text=f"FINAL by {agent}: 42")
            labels = vote_labels(request)
            mine = [label for label in labels if label.startswith(letter_of[agent])]
            if not mine:
                return Reply(tool_calls=[("new_answer", {"content": f"{agent} v1: 42"})], gate=first[agent])
            if revise and agent == "bob" and len(labels) == 3 and mine == [f"{bob}1"]:
                return Reply(tool_calls=[("new_answer", {"content": "bob v2: 42, with cy's check"})])
            bobs = [label for label in labels if label.startswith(bob)]
            target = bobs[0] if bobs else mine[0]
            return decide("vote", {"answer": target, "reason": f"{target} is right"}, request)

        return respond

    return make


async def test_three_providers_reach_consensus_after_an_invalidated_vote(fakes: FakeProviders) -> None:
    letter_of = letters_of()
    ann, bob, cy = (letter_of[name] for name in ("ann", "bob", "cy"))
    # ann answers and votes for its own answer; only then does bob's first answer land (clearing that
    # vote), and only after it cy's, which bob revises its answer for.
    after_ann_votes, after_bob_answers = threading.Event(), threading.Event()
    make = scripted(letter_of, {"ann": None, "bob": after_ann_votes, "cy": after_bob_answers}, revise=True)
    for _, agent in TRIO:
        fakes.script.set_default(agent, make(agent))
    gates = (("vote", ann, after_ann_votes), ("answer", bob, after_bob_answers))
    result, sink = await run(fakes, gates=gates)

    assert result.winner == f"{bob}2" and result.consensus and not result.tie
    assert result.tally == {f"{ann}1": 0, f"{cy}1": 0, f"{bob}2": 3}
    assert result.answer == "FINAL by bob: 42" and result.presented_by == bob
    posted = [event.label for event in sink.kinds("answer")]
    assert sorted(posted) == sorted([f"{ann}1", f"{bob}1", f"{cy}1", f"{bob}2"])
    assert posted.index(f"{bob}1") < posted.index(f"{bob}2")
    # ann voted for its own answer before bob's first answer landed: that vote was cleared by it.
    kinds = [(event.kind, event.letter, getattr(event, "label", None)) for event in sink.events]
    first_vote = kinds.index(("vote", ann, f"{ann}1"))
    assert kinds.index(("answer", bob, f"{bob}1")) > first_vote
    # Usage: every agent was billed for every call, and the progress adds up.
    final = sink.progress[-1]
    for agent in final.agents:
        assert agent.usage.calls >= 2 and agent.usage.input_tokens > 0 and agent.usage.output_tokens > 0
    calls = sum(len(fakes.script.requests_of(name)) for _, name in TRIO)
    billed = sum(agent.usage.calls for agent in final.agents)
    # every request counted; a call cancelled as it started may not have reached its provider
    assert calls <= billed <= calls + len(sink.kinds("turn_cancelled"))
    # Every token the fakes reported, and nothing else. A reply to a turn the orchestrator cancelled
    # (stale once a new answer landed) may be billed by the fake after the client stopped reading it:
    # its input is charged an estimate, marked as such (tests/test_billing.py).
    cut = {event.letter for event in sink.kinds("turn_cancelled")}
    for agent in final.agents:
        name = next(name for name, letter in letter_of.items() if letter == agent.letter)
        u = agent.usage
        reported = (u.input_tokens - u.estimated_input_tokens, u.output_tokens, u.cached_input_tokens)
        bill = fakes.script.bill[name]
        if agent.letter in cut:
            assert all(mine <= theirs for mine, theirs in zip(reported, bill, strict=True)), (u, bill)
        else:
            assert reported == bill and not u.estimated
    # Anonymity: no model name in any prompt; votes cast so far are never shown.
    for request in fakes.script.requests:
        prompt = json.dumps({key: value for key, value in request.body.items() if key != "model"})
        assert "fake-" not in prompt and "voted for" not in prompt
    # The end comes after every answer, the last vote and the presentation, in that order.
    order = [event.kind for event in sink.events]
    last_answer = max(i for i, kind in enumerate(order) if kind == "answer")
    assert last_answer < order.index("presenting") < order.index("finished") == len(order) - 1


async def test_stale_thinking_turn_is_cancelled_and_restarted(fakes: FakeProviders) -> None:
    letter_of = letters_of()
    ann, bob = letter_of["ann"], letter_of["bob"]

    def ann_responder(request: RecordedRequest) -> Reply:
        labels = vote_labels(request)
        if is_presentation(request):
            return Reply(text="FINAL")
        if not any(label.startswith(ann) for label in labels):
            return Reply(tool_calls=[("new_answer", {"content": "ann: 42"})])
        # A think while bob's answer is still coming: bob's answer is let through now, and this reply is
        # held until the orchestrator cancelled the turn, which bob's answer made stale.
        if not any(label.startswith(bob) for label in labels):
            ann_thinks.set()
            return Reply(tool_calls=[("vote", {"answer": labels[0], "reason": "ok"})], gate=ann_cancelled)
        return Reply(tool_calls=[("vote", {"answer": labels[0], "reason": "ok"})])

    ann_thinks, ann_cancelled = threading.Event(), threading.Event()
    bob_voter = voter()
    fakes.script.set_default("ann", ann_responder)
    install(fakes.script, TRIO[1:], voter())
    fakes.script.set_default("bob", lambda request: replace(bob_voter(request), gate=ann_thinks))
    result, sink = await run(fakes, gates=(("turn_cancelled", ann, ann_cancelled),))
    cancelled = [event for event in sink.kinds("turn_cancelled") if event.letter == ann]
    assert cancelled, "ann's stale turn should have been cancelled"
    assert result.consensus and result.winner is not None


async def test_job_timeout_falls_back_without_consensus(fakes: FakeProviders) -> None:
    install(fakes.script, TRIO[:2], voter())
    fakes.script.set_default("cy", lambda request: Reply(text="never", delay=30))
    result, sink = await run(fakes, coordination={"timeout_s": 2.0})
    assert result.consensus is False and "timeout" in result.reason
    assert result.winner is not None and result.answer
    assert sink.kinds("deadline")


async def test_failing_provider_drops_the_agent_and_the_job_goes_on(fakes: FakeProviders) -> None:
    install(fakes.script, TRIO[:2], voter())
    fakes.script.set_default("cy", Reply(status=500, error_message="gemini is down"))
    result, sink = await run(fakes)
    letter_of = letters_of()
    assert letter_of["cy"] in result.errors  # the result names the agent that dropped out
    failed = sink.kinds("agent_failed")
    assert [event.letter for event in failed] == [letter_of["cy"]]
    assert "gemini is down" in failed[0].error
    # two agents remain; they reach consensus between them
    assert result.winner is not None and result.answer


async def test_every_agent_failing_fails_the_job_with_every_error(fakes: FakeProviders) -> None:
    for _, agent in TRIO:
        fakes.script.set_default(agent, Reply(status=401, error_message=f"bad key for {agent}"))
    result, _ = await run(fakes)
    assert result.failed and result.winner is None
    assert len(result.errors) == 3 and all("bad key" in error for error in result.errors.values())


async def test_malformed_arguments_are_repaired_within_the_turn(fakes: FakeProviders) -> None:
    install(fakes.script, TRIO, voter())
    fakes.script.enqueue("ann", Reply(tool_calls=[("new_answer", '{"content": "unterminated')]))
    result, _ = await run(fakes)
    repair = fakes.script.requests_of("ann")[1]
    assert "not valid JSON" in repair.text()
    assert result.consensus


async def test_plain_text_gets_one_corrective_retry(fakes: FakeProviders) -> None:
    install(fakes.script, TRIO, voter())
    fakes.script.enqueue("bob", Reply(text="I think the answer is 42."))
    result, sink = await run(fakes)
    assert [event.letter for event in sink.kinds("no_decision")] == [letters_of()["bob"]]
    corrective = fakes.script.requests_of("bob")[1]
    assert "ended without a decision" in corrective.text()
    assert result.consensus


async def test_json_decision_mode(fakes: FakeProviders) -> None:
    install(fakes.script, TRIO, voter())
    result, _ = await run(fakes, tool_mode="json")
    assert result.consensus and result.winner is not None
    first = fakes.script.requests_of("ann")[0]
    assert "new_answer" in first.text() and "response_format" in first.body


async def test_reuse_final_returns_the_winning_answer_as_is(fakes: FakeProviders) -> None:
    install(fakes.script, TRIO, voter())
    result, sink = await run(fakes, coordination={"final": "reuse"})
    assert not sink.kinds("presenting") and result.presented_by is None
    assert result.answer is not None and result.answer.startswith("Answer from")
