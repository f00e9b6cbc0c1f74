"""The orchestrator against the fake providers, through the real SDKs over HTTP."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from conclave.backends.retry import RetryPolicy
from conclave.config import Team
from conclave.coordination.orchestrator import Orchestrator, assign_letters, endpoint_factory, seed_for
from conclave.coordination.reports import JobEvent, JobResult, Progress
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, decide, install, is_presentation, team_data, vote_labels, voter

pytestmark = pytest.mark.anyio
FAST_RETRY = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05)
JOB = "cj-0123456789ab"


class MemorySink:
    def __init__(self) -> None:
        self.events: list[JobEvent] = []
        self.progress: list[Progress] = []

    async def record(self, event: JobEvent, progress: Progress) -> None:
        self.events.append(event)
        self.progress.append(progress)

    def kinds(self, kind: str) -> list[JobEvent]:
        return [event for event in self.events if event.kind == kind]



def letters_of(job_id: str = JOB) -> dict[str, str]:
    """The anonymous letter of each fake agent (ann, bob, cy) in this job."""
    letters = assign_letters(3, seed_for(job_id))
    return {agent: letter for (_, agent), letter in zip(TRIO, letters, strict=True)}


async def run(fakes: FakeProviders, job_id: str = JOB, **options: Any) -> tuple[JobResult, MemorySink]:
    team = Team.model_validate(team_data(fakes, TRIO, **options))
    sink = MemorySink()
    orchestrator = Orchestrator(
        job_id,
        "What is 6 times 7?",
        team,
        sink,
        endpoint_factory({KEY_ENV: "test-key-0123456789"}),
        retry=FAST_RETRY,
    )
    return await orchestrator.run(), sink


def scripted(letter_of: dict[str, str], *, first_delay: float, revise: bool = False) -> Callable[[str], Any]:
    """Per agent: answer once (after `first_delay`), then vote for bob's latest answer; bob may revise."""
    bob = letter_of["bob"]
    first = {"ann": 0.05, "bob": 0.3, "cy": first_delay}  # ann answers, then votes, before bob's answer

    def make(agent: str) -> Callable[[RecordedRequest], Reply]:
        def respond(request: RecordedRequest) -> Reply:
            if is_presentation(request):
                return Reply(text=f"FINAL by {agent}: 42", delay=0.05)
            labels = vote_labels(request)
            mine = [label for label in labels if label.startswith(letter_of[agent])]
            if not mine:
                return Reply(tool_calls=[("new_answer", {"content": f"{agent} v1: 42"})], delay=first[agent])
            if revise and agent == "bob" and len(labels) == 3 and mine == [f"{bob}1"]:
                return Reply(
                    tool_calls=[("new_answer", {"content": "bob v2: 42, with cy's check"})], delay=0.05
                )
            bobs = [label for label in labels if label.startswith(bob)]
            target = bobs[0] if bobs else mine[0]
            return decide("vote", {"answer": target, "reason": f"{target} is right"}, request)

        return respond

    return make


async def test_three_providers_reach_consensus_after_an_invalidated_vote(fakes: FakeProviders) -> None:
    letter_of = letters_of()
    make = scripted(letter_of, first_delay=1.5, revise=True)
    for _, agent in TRIO:
        fakes.script.set_default(agent, make(agent))
    result, sink = await run(fakes)
    ann, bob, cy = (letter_of[name] for name in ("ann", "bob", "cy"))

    assert result.winner == f"{bob}2" and result.consensus and not result.tie
    assert result.tally == {f"{ann}1": 0, f"{cy}1": 0, f"{bob}2": 3}
    assert result.answer == "FINAL by bob: 42" and result.presented_by == bob
    posted = [event.data["label"] for event in sink.kinds("answer")]
    assert sorted(posted) == sorted([f"{ann}1", f"{bob}1", f"{cy}1", f"{bob}2"])
    assert posted.index(f"{bob}1") < posted.index(f"{bob}2")
    # ann voted for its own answer before bob's first answer landed: that vote was cleared by it.
    kinds = [(event.kind, event.letter, event.data.get("label")) for event in sink.events]
    first_vote = kinds.index(("vote", ann, f"{ann}1"))
    assert kinds.index(("answer", bob, f"{bob}1")) > first_vote
    # Usage: every agent was billed for every call, and the progress adds up.
    final = sink.progress[-1]
    for agent in final.agents:
        assert agent.usage.calls >= 2 and agent.usage.input_tokens > 0 and agent.usage.output_tokens > 0
    calls = sum(len(fakes.script.requests_of(name)) for _, name in TRIO)
    billed = sum(agent.usage.calls for agent in final.agents)
    assert (
        billed <= calls <= billed + len(sink.kinds("turn_cancelled"))
    )  # cancelled before any usage: not billed
    for agent in final.agents:  # every token the fakes reported, and nothing else
        name = next(name for name, letter in letter_of.items() if letter == agent.letter)
        u = agent.usage
        assert (u.input_tokens, u.output_tokens, u.cached_input_tokens) == fakes.script.bill[name]
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
        # a slow think while bob's answer is still coming: this turn goes stale and is cancelled
        slow = not any(label.startswith(bob) for label in labels)
        return Reply(tool_calls=[("vote", {"answer": labels[0], "reason": "ok"})], delay=3.0 if slow else 0.0)

    fakes.script.set_default("ann", ann_responder)
    install(fakes.script, TRIO[1:], voter())
    fakes.script.set_default("bob", voter(delay=0.5))
    result, sink = await run(fakes)
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
    assert "gemini is down" in failed[0].data["error"]
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
