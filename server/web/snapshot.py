"""What a job's page shows, read from the store in one go: the JobView, every answer with its check,
a timeline of the transcript, the diff and the final answer.

Everything here runs in a worker thread (routes.py), on the web view's own connection to the store,
so a page never blocks the event loop the jobs run on. The page's script renders every string with
textContent: answers, reasons and the diff are model text, hence attacker-controlled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from conclave.coordination.reports import JobEvent
from conclave.jobs.reader import check_outputs, job_workspaces
from conclave.jobs.store import JobRow, Store
from conclave.jobs.views import JobView, job_view

MAX_DIFF_CHARS = 400_000  # a bigger patch is cut; read_workspace(path='@diff') pages through all of it
MAX_OUTPUT_CHARS = 20_000  # of one check's output, its end kept
QUIET = {"turn_started", "turn_cancelled", "tool_call", "usage", "check_started"}  # not on the timeline


class _Page(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AnswerCard(_Page):
    """One answer an agent posted, with its check when the job verifies answers."""

    label: str
    revision: int
    content: str
    at: float
    latest: bool
    votes: int = 0  # current valid votes (the tally's)
    check: str | None = None  # in words: "passed in 3.1 s", "failed (exit 1): ..."
    check_status: str | None = None
    check_output: str | None = None


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
    answers: dict[str, list[AnswerCard]]  # by agent letter, oldest first
    timeline: list[Moment]
    diff: str | None = None
    diff_cut: bool = False
    seq: int = 0  # events the page reflects


class JobLine(_Page):
    """One job in the list of jobs."""

    job_id: str
    state: str
    team: str
    task: str
    phase: str
    created_at: float
    winner: str | None = None


class Reader:
    """The web view's own connection to the shared store, one thread at a time."""

    def __init__(self, db_path: Path, jobs_dir: Path) -> None:
        self._store = Store(db_path)
        self._jobs_dir = jobs_dir
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._store.close()

    def row(self, job_id: str) -> JobRow | None:
        with self._lock:
            return self._store.job(job_id)

    def changes(self, job_id: str) -> tuple[int, int, str] | None:
        """What tells a page something happened: (rev, events, state); None when the job is gone."""
        with self._lock:
            return self._store.changes(job_id)

    def jobs(self, may_read: Callable[[JobRow], bool], limit: int = 50) -> list[JobLine]:
        with self._lock:
            rows = [row for row in self._store.recent_jobs(limit) if may_read(row)]
        return [
            JobLine(
                job_id=row.id,
                state=row.state,
                team=row.team_name,
                task=row.task[:300],
                phase=row.phase,
                created_at=row.created_at,
                winner=row.result.winner if row.result else None,
            )
            for row in rows
        ]

    def request_cancel(self, job_id: str) -> None:
        """Ask whichever server runs the job to cancel it (it watches the store: jobs/service.py)."""
        with self._lock:
            self._store.request_cancel(job_id)

    def page(self, row: JobRow, web_url: str | None = None) -> JobPage:
        with self._lock:
            events = self._store.events(row.id)
            answers = self._store.answers(row.id)
            outputs = check_outputs(self._store, row)
        view = job_view(row, time.time()).model_copy(update={"web_url": web_url})
        checks = row.progress.checks if row.progress else {}
        latest = {answer.letter: answer.label for answer in answers}
        tally = view.votes()[0]
        cards: dict[str, list[AnswerCard]] = {agent.letter: [] for agent in view.agents}
        for answer in answers:
            check = checks.get(answer.label)
            output = outputs.get(answer.label)
            cards.setdefault(answer.letter, []).append(
                AnswerCard(
                    label=answer.label,
                    revision=answer.revision,
                    content=answer.content,
                    at=answer.at,
                    latest=latest[answer.letter] == answer.label,
                    votes=tally.get(answer.label, 0),
                    check=check.text() if check else None,
                    check_status=check.status if check else None,
                    check_output=output[-MAX_OUTPUT_CHARS:] if output else None,
                )
            )
        diff, cut = self._diff(row)
        return JobPage(
            view=view,
            task=row.task,
            answers=cards,
            timeline=timeline(events),
            diff=diff,
            diff_cut=cut,
            seq=len(events),
        )

    def _diff(self, row: JobRow) -> tuple[str | None, bool]:
        workspaces = job_workspaces(row, self._jobs_dir)
        if workspaces is None or not workspaces.patch.is_file():
            return None, False
        with workspaces.patch.open(encoding="utf-8", errors="replace") as patch:
            text = patch.read(MAX_DIFF_CHARS + 1)
        return text[:MAX_DIFF_CHARS], len(text) > MAX_DIFF_CHARS


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
        match kind:
            case "answer":
                moments.append(
                    Moment(
                        at=event.at,
                        kind=kind,
                        letter=who,
                        label=d["label"],
                        text=f"{who} posted {d['label']}",
                        body=d["content"],
                    )
                )
            case "vote":
                held[who or "?"] = d["label"]
                moments.append(
                    Moment(
                        at=event.at,
                        kind=kind,
                        letter=who,
                        label=d["label"],
                        text=f"{who} voted for {d['label']}",
                        body=d.get("reason") or None,
                    )
                )
            case "vote_discarded":
                moments.append(
                    Moment(
                        at=event.at,
                        kind=kind,
                        letter=who,
                        label=d.get("label"),
                        text=f"{who}'s vote for {d.get('label')} was discarded (it named no current "
                        "answer, or the answers changed)",
                        body=d.get("reason") or None,
                    )
                )
            case "checked":
                tail = "\n".join(d.get("tail") or []) or None
                moments.append(
                    Moment(
                        at=event.at,
                        kind=kind,
                        letter=who,
                        label=d["label"],
                        text=f"check of {d['label']}: {d['status']} (exit {d.get('exit_code')})",
                        body=tail,
                    )
                )
            case "steer" | "steered" | "steering":
                note = d.get("note") or d.get("text") or d.get("message") or ""
                moments.append(
                    Moment(at=event.at, kind="steer", letter=who, text="steering note", body=str(note))
                )
            case "finished":
                winner = d.get("winner")
                moments.append(
                    Moment(
                        at=event.at,
                        kind=kind,
                        label=winner,
                        text=(f"finished: {winner} won" if winner else "finished without a winner")
                        + f"; {d.get('reason')}",
                    )
                )
            case _:
                moments.append(Moment(at=event.at, kind=kind, letter=who, text=_words(kind, who, d)))
    return moments


def _words(kind: str, who: str | None, d: dict[str, object]) -> str:
    """An event with no line of its own, in words."""
    match kind:
        case "started":
            return f"{len(d.get('agents') or [])} agents started"
        case "presenting":
            return f"{who} is writing the final answer ({d.get('winner')} won the vote)"
        case "agent_failed" | "turn_failed" | "answer_refused" | "snapshot_failed":
            return f"{who or 'the job'}: {kind.replace('_', ' ')}: {d.get('error', '')}"
        case "no_decision":
            return f"{who} ended a turn without a decision"
        case "budget_reached" | "deadline":
            return f"stopping: {d.get('reason', kind)}"
    return f"{who or ''} {kind.replace('_', ' ')}".strip()
