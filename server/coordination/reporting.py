"""What a running job tells its sink: each protocol event in words (a `JobEvent`), the live progress
beside it, and the result, built once from the protocol's outcome.

The orchestrator (orchestrator.py) drives the job and hands this every event the protocol took; the
progress itself is read from the protocol state by picture.py. Checks and their runs are kept here,
since what a check found is a report (verification.py runs them). Every event's data has the job's
secrets masked (files/secrets.py): a CLI member's text already is at its source (clis/member.py),
this catches any other way a value could reach the store.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from conclave.coordination import picture, protocol
from conclave.coordination.members import JobSink, Member
from conclave.coordination.protocol_events import (
    AnswerPosted,
    Deadline,
    Finish,
    NoDecision,
    ProtocolEvent,
    Steer,
    Stop,
    TurnFailed,
    Verified,
    VoteCast,
)
from conclave.coordination.reports import (
    JOB_EVENT,
    AgentFailedEvent,
    AnswerEvent,
    BudgetReachedEvent,
    Check,
    CheckedEvent,
    DeadlineEvent,
    FinishedEvent,
    JobEvent,
    JobResult,
    NoDecisionEvent,
    Progress,
    SteeredEvent,
    TurnFailedEvent,
    VoteDiscardedEvent,
    VoteEvent,
)
from conclave.coordination.tally import Answer
from conclave.files.secrets import Secrets

if TYPE_CHECKING:
    from conclave.coordination.verification import CheckRun


class Reporter:
    """One job's reports to its sink, in the order the protocol took the events."""

    def __init__(
        self,
        sink: JobSink,
        state: protocol.Coordination,
        members: Mapping[str, Member],
        clock: Callable[[], float],
        secrets: Secrets | None = None,
    ) -> None:
        self.sink, self.state, self.members, self._clock = sink, state, members, clock
        self.secrets = secrets if secrets is not None else Secrets()
        self.checks: dict[str, Check] = {}  # per answer label, with `verify`
        self.runs: dict[str, CheckRun] = {}  # finished checks, until their Verified is reported
        self.verify_blocked: str | None = None  # the check command cannot run on the caller's files
        self.started = 0.0

    def progress(self) -> Progress:
        """The live picture: each agent's state, answers and vote, the tally, the round (picture.py)."""
        return picture.progress(self.state, self.members, self.checks, self.verify_blocked)

    async def emit(self, event: JobEvent) -> None:
        """Record `event`, stamped with the job's time, with the job's secrets masked in it."""
        if len(self.secrets):
            event = JOB_EVENT.validate_python(self.secrets.scrub(event.model_dump()))
        event = event.model_copy(update={"at": round(self._clock() - self.started, 3)})
        await self.sink.record(event, self.progress())

    async def answer(self, answer: Answer) -> None:
        await self.emit(
            AnswerEvent(
                letter=answer.letter, label=answer.label, revision=answer.revision, content=answer.content
            )
        )

    async def event(self, event: ProtocolEvent) -> None:
        """An event that posted no answer, in words (an answer posted: `answer`)."""
        state = self.state
        match event:
            case AnswerPosted():
                await self.emit(
                    TurnFailedEvent(letter=event.letter, error="answer refused; the agent is asked again")
                )
            case VoteCast():
                vote, turn = state.agents[event.letter].vote, state.agents[event.letter].turn
                kept = vote is not None and vote.label == event.label and turn is None
                kind = VoteEvent if kept else VoteDiscardedEvent
                await self.emit(kind(letter=event.letter, label=event.label, reason=event.reason))
            case NoDecision():
                await self.emit(NoDecisionEvent(letter=event.letter, text=event.text[:2000]))
            case TurnFailed():
                failed = AgentFailedEvent if not state.agents[event.letter].active else TurnFailedEvent
                await self.emit(failed(letter=event.letter, error=event.error))
            case Verified() if event.label in self.runs:
                run = self.runs.pop(event.label)
                self.checks[event.label] = run.check
                await self.emit(
                    CheckedEvent(letter=event.label[0], label=event.label, check=run.check, output=run.output)
                )
            case Stop():
                await self.emit(BudgetReachedEvent(reason=event.reason))
            case Deadline():
                await self.emit(DeadlineEvent(reason=event.reason))
            case Steer():
                late = state.phase != "coordinating"
                await self.emit(SteeredEvent(note=event.note, round=state.version, late=late))
            case _:
                pass  # a tool call was reported when it was made; the rest say nothing new

    def result(self, action: Finish) -> JobResult:
        """The job's result: the outcome with the final text (the presented one, else the winner's)."""
        outcome = action.outcome
        winner = self.state.answer(outcome.winner) if outcome.winner else None
        presented = action.final_text is not None
        answer = action.final_text if presented else (winner.content if winner else None)
        return JobResult.of(outcome, answer, winner.letter if winner and presented else None)

    async def finished(self, result: JobResult) -> None:
        await self.emit(FinishedEvent(result=result))
