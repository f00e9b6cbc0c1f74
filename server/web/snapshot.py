"""What a job's page shows, read through the lookup in one go (jobs/lookup.py `page`): the JobView,
every answer with its check, a timeline of the transcript, the diff and the final answer.

The lookup reads in a reader thread, so a page never blocks the event loop the jobs run on. The page's
script renders every string with textContent: answers, reasons and the diff are model text, hence
attacker-controlled.
"""

from __future__ import annotations

from typing import assert_never

from pydantic import BaseModel, ConfigDict

from conclave.coordination.reports import (
    AgentFailedEvent,
    AnswerEvent,
    AnswerRefusedEvent,
    BudgetReachedEvent,
    CheckedEvent,
    CheckStartedEvent,
    DeadlineEvent,
    FinishedEvent,
    JobEvent,
    NoDecisionEvent,
    NoteEvent,
    PresentingEvent,
    ResumedEvent,
    ShownAnswer,
    SnapshotFailedEvent,
    StartedEvent,
    SteeredEvent,
    ToolCallEvent,
    TurnCancelledEvent,
    TurnFailedEvent,
    TurnStartedEvent,
    UsageEvent,
    VerifyBlockedEvent,
    VoteDiscardedEvent,
    VoteEvent,
)
from conclave.jobs.read.view_read import PageParts
from conclave.jobs.read.views import JobView

MAX_DIFF_CHARS = 400_000  # a bigger patch is cut; read_workspace(path='@diff') pages through all of it
# not on the timeline
QUIET = (TurnStartedEvent, TurnCancelledEvent, ToolCallEvent, UsageEvent, CheckStartedEvent)


class _Page(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Moment(_Page):
    """One line of the timeline."""

    at: float
    kind: str
    letter: str | None = None
    label: str | None = None
    text: str
    body: str | None = None  # an answer's text, a check's last lines


class JobPage(_Page):
    """A job's page: the view callers get, plus what only the page shows."""

    view: JobView
    task: str
    answers: dict[str, list[ShownAnswer]]  # by agent letter, oldest first
    timeline: list[Moment]
    diff: str | None = None
    diff_cut: bool = False
    file_notes: list[str] = []  # held-back changes and files that run code on their own, with why
    seq: int = 0  # events the page reflects


def job_page(parts: PageParts, web_url: str | None) -> JobPage:
    """The page from what the lookup read (jobs/read/view_read.py), its own URL in the view."""
    view = parts.view.model_copy(update={"web_url": web_url})
    cards: dict[str, list[ShownAnswer]] = {agent.letter: [] for agent in view.agents}
    for answer in parts.answers:
        cards.setdefault(answer.letter, []).append(answer)
    return JobPage(
        view=view,
        task=parts.task,
        answers=cards,
        timeline=timeline(parts.events),
        diff=parts.patch,
        diff_cut=parts.cut,
        file_notes=view.diff_summary.file_notes() if view.diff_summary is not None else [],
        seq=len(parts.events),
    )


def timeline(events: list[JobEvent]) -> list[Moment]:
    """The transcript as moments: answers, votes, the votes a new answer or a check cleared, checks,
    steering notes, the end. Turn starts, tool calls and usage are left out: the columns show them."""
    moments: list[Moment] = []
    held: dict[str, str] = {}  # voter -> label: the valid votes standing now
    for event in events:
        if isinstance(event, QUIET):
            continue
        if isinstance(event, AnswerEvent | CheckedEvent | SteeredEvent) and held:
            cleared = ", ".join(f"{voter}'s vote for {label}" for voter, label in sorted(held.items()))
            kind = event.kind
            cause = (
                "a new answer" if kind == "answer" else "a check result" if kind == "checked" else "a note"
            )
            moments.append(Moment(at=event.at, kind="invalidated", text=f"{cause} cleared {cleared}"))
            held.clear()
        if isinstance(event, VoteEvent):
            held[event.letter or "?"] = event.label
        moments.append(_moment(event))
    return moments


def _moment(event: JobEvent) -> Moment:
    """One event on the timeline: a line in words, with the label it is about and the text behind it."""
    who, kind, at = event.letter, event.kind, event.at
    match event:
        case AnswerEvent():
            text = f"{who} posted {event.label}"
            return Moment(at=at, kind=kind, letter=who, label=event.label, text=text, body=event.content)
        case VoteEvent():
            text = f"{who} voted for {event.label}"
            return Moment(
                at=at, kind=kind, letter=who, label=event.label, text=text, body=event.reason or None
            )
        case VoteDiscardedEvent():
            text = (
                f"{who}'s vote for {event.label} was discarded (it named no current answer, or the answers "
                "changed)"
            )
            return Moment(
                at=at, kind=kind, letter=who, label=event.label, text=text, body=event.reason or None
            )
        case CheckedEvent():
            check = event.check
            text = f"check of {event.label}: {check.status} (exit {check.exit_code})"
            body = "\n".join(check.tail) or None
            return Moment(at=at, kind=kind, letter=who, label=event.label, text=text, body=body)
        case SteeredEvent():
            return Moment(at=at, kind="steer", letter=who, text="steering note", body=event.note)
        case FinishedEvent():
            winner = event.result.winner
            text = (
                f"finished: {winner} won" if winner else "finished without a winner"
            ) + f"; {event.result.reason}"
            return Moment(at=at, kind=kind, label=winner, text=text)
        case StartedEvent():
            return Moment(at=at, kind=kind, letter=who, text=f"{len(event.agents)} agents started")
        case PresentingEvent():
            text = f"{who} is writing the final answer ({event.winner} won the vote)"
            return Moment(at=at, kind=kind, letter=who, text=text)
        case ResumedEvent():
            return Moment(at=at, kind=kind, letter=who, text="the job resumed after its server stopped")
        case AgentFailedEvent() | TurnFailedEvent() | AnswerRefusedEvent() | SnapshotFailedEvent():
            text = f"{who or 'the job'}: {kind.replace('_', ' ')}: {event.error}"
            return Moment(at=at, kind=kind, letter=who, text=text)
        case NoDecisionEvent():
            return Moment(at=at, kind=kind, letter=who, text=f"{who} ended a turn without a decision")
        case BudgetReachedEvent() | DeadlineEvent():
            return Moment(at=at, kind=kind, letter=who, text=f"stopping: {event.reason or kind}")
        case (
            VerifyBlockedEvent()
            | NoteEvent()
            | TurnStartedEvent()
            | TurnCancelledEvent()
            | ToolCallEvent()
            | UsageEvent()
            | CheckStartedEvent()
        ):
            return Moment(at=at, kind=kind, letter=who, text=f"{who or ''} {kind.replace('_', ' ')}".strip())
        case _:
            assert_never(event)
