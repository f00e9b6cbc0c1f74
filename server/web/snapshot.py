"""What a job's page shows, read through the lookup in one go (jobs/read/lookup.py `page`): the JobView,
every answer with its check, a timeline of the transcript, the diff and the final answer.

The lookup reads in a reader thread, so a page never blocks the event loop the jobs run on. The page's
script renders every string with textContent: answers, reasons and the diff are model text, hence
attacker-controlled.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from conclave.coordination.reports import JobEvent, ShownAnswer
from conclave.jobs.read.view_read import PageParts
from conclave.jobs.read.views import JobView

MAX_DIFF_CHARS = 400_000  # a bigger patch is cut; read_workspace(path='@diff') pages through all of it
QUIET = {"turn_started", "turn_cancelled", "tool_call", "usage", "check_started"}  # not on the timeline


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
        d, who, kind = event.data, event.letter, event.kind
        if kind in QUIET:
            continue
        if kind in ("answer", "checked", "steer", "steered", "steering") and held:
            cleared = ", ".join(f"{voter}'s vote for {label}" for voter, label in sorted(held.items()))
            cause = (
                "a new answer" if kind == "answer" else "a check result" if kind == "checked" else "a note"
            )
            moments.append(Moment(at=event.at, kind="invalidated", text=f"{cause} cleared {cleared}"))
            held.clear()
        if kind == "vote":
            held[who or "?"] = d["label"]
        moments.append(_moment(event))
    return moments


def _moment(event: JobEvent) -> Moment:
    """One event on the timeline: a line in words, with the label it is about and the text behind it."""
    d, who, kind = event.data, event.letter, event.kind
    match kind:
        case "answer":
            label, text, body = d["label"], f"{who} posted {d['label']}", d["content"]
        case "vote":
            label, text, body = d["label"], f"{who} voted for {d['label']}", d.get("reason") or None
        case "vote_discarded":
            label, body = d.get("label"), d.get("reason") or None
            text = (
                f"{who}'s vote for {label} was discarded (it named no current answer, or the answers changed)"
            )
        case "checked":
            label, body = d["label"], "\n".join(d.get("tail") or []) or None
            text = f"check of {label}: {d['status']} (exit {d.get('exit_code')})"
        case "steer" | "steered" | "steering":
            note = d.get("note") or d.get("text") or d.get("message") or ""
            return Moment(at=event.at, kind="steer", letter=who, text="steering note", body=str(note))
        case "finished":
            winner = d.get("winner")
            text = (
                f"finished: {winner} won" if winner else "finished without a winner"
            ) + f"; {d.get('reason')}"
            return Moment(at=event.at, kind=kind, label=winner, text=text)
        case _:
            return Moment(at=event.at, kind=kind, letter=who, text=_words(kind, who, d))
    return Moment(at=event.at, kind=kind, letter=who, label=label, text=text, body=body)


def _words(kind: str, who: str | None, d: dict[str, object]) -> str:
    """An event with no line of its own, in words."""
    match kind:
        case "started":
            agents = d.get("agents")
            return f"{len(agents) if isinstance(agents, list) else 0} agents started"
        case "presenting":
            return f"{who} is writing the final answer ({d.get('winner')} won the vote)"
        case "resumed":
            return "the job resumed after its server stopped"
        case "agent_failed" | "turn_failed" | "answer_refused" | "snapshot_failed":
            return f"{who or 'the job'}: {kind.replace('_', ' ')}: {d.get('error', '')}"
        case "no_decision":
            return f"{who} ended a turn without a decision"
        case "budget_reached" | "deadline":
            return f"stopping: {d.get('reason', kind)}"
    return f"{who or ''} {kind.replace('_', ' ')}".strip()
