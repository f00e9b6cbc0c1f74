"""Everything a JobView shows, read in one reader thread: the job's row, its notes, its conversation, its
page; and everything its web page shows beside (`page_parts`), and a job as a list shows it (`JobLine`).

`get_status` is the call a client makes most, often while many jobs run; each hop between the event loop
and a worker thread waits for the loop's next turn, which a busy loop makes long (bench/bench_store.py).
So a view is one hop: the job-id check, the caller check and every read behind it run together, on a
reader connection (jobs/store/connections.py), and web.json is looked at there too, never on the loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from conclave.coordination.reports import CheckedEvent, JobEvent, NoteEvent, ShownAnswer, SteeredEvent
from conclave.jobs.read.reader import job_workspaces
from conclave.jobs.read.views import JobView, NoteView, job_view
from conclave.jobs.read.web_link import WebLinks
from conclave.jobs.store.sql import AnswerRow, JobRow, JobState, LinePlace, Store


@dataclass(frozen=True)
class ViewParts:
    row: JobRow
    notes: list[NoteView]
    conversation: list[str]  # job ids, oldest first (JobView.thread)
    web_url: str | None
    place: LinePlace | None = None  # a queued job's place in its caller's line (jobs/run/fair_share.py)


def view_parts(store: Store, links: WebLinks, job_id: str, caller: str | None) -> ViewParts | None:
    """The job's parts, or None when there is no such job for `caller` (None: the CLI, any job).
    Blocking: run it through `AsyncStore.read`."""
    found = store.view_row(job_id)  # one statement; the notes and the conversation only where there are any
    if found is None or (caller is not None and found.row.caller != caller):
        return None
    row = found.row
    notes = note_views(store, job_id) if found.notes else []
    conversation = [r.id for r in store.conversation(row.id)] if row.follow_up or found.followed else []
    return ViewParts(row, notes, conversation, links.page_url(job_id), found.place)


MAX_OUTPUT_CHARS = 20_000  # of one check's output, its end kept


@dataclass(frozen=True)
class PageParts:
    """What a job's web page shows (web/snapshot.py): its view, the whole task, every answer as every
    reader shows it (`conclave show --answers` too), the events, and the start of the winner's patch
    (`cut`: there is more)."""

    view: JobView
    task: str
    events: list[JobEvent]
    answers: list[ShownAnswer]
    patch: str | None
    cut: bool


def page_parts(
    store: Store, links: WebLinks, jobs_root: Path, job_id: str, caller: str | None, patch_chars: int
) -> PageParts | None:
    """The job's page, read in one go like its view (None: no such job for `caller`). Blocking."""
    parts = view_parts(store, links, job_id, caller)
    if parts is None:
        return None
    patch, cut = None, False
    workspaces = job_workspaces(parts.row, jobs_root)
    if workspaces is not None and workspaces.patch.is_file():
        with workspaces.patch.open(encoding="utf-8", errors="replace") as file:
            text = file.read(patch_chars + 1)
        patch, cut = text[:patch_chars], len(text) > patch_chars
    events = store.events(job_id)
    view = job_view(parts.row, time.time(), parts.notes, parts.conversation)
    return PageParts(
        view, parts.row.task, events, shown_answers(view, store.answers(job_id), events), patch, cut
    )


def shown_answers(view: JobView, rows: list[AnswerRow], events: list[JobEvent]) -> list[ShownAnswer]:
    """Every answer the job posted, oldest first, with its votes now, whether it is still its author's
    latest, its check and the end of its check's output."""
    checks = view.progress.checks if view.progress is not None else {}
    outputs = {e.label: e.output for e in events if isinstance(e, CheckedEvent)}
    latest = {row.letter: row.label for row in rows}  # rows come oldest first
    tally = view.votes()[0]
    return [
        ShownAnswer.of(
            row,
            checks.get(row.label),
            at=row.at,
            latest=latest[row.letter] == row.label,
            votes=tally.get(row.label, 0),
            check_output=outputs[row.label][-MAX_OUTPUT_CHARS:] if outputs.get(row.label) else None,
        )
        for row in rows
    ]


class JobLine(BaseModel):
    """One job in a list of jobs (the web view's)."""

    model_config = ConfigDict(extra="forbid")

    job_id: str
    state: JobState
    team: str
    task: str = Field(description="the task, cut to 300 characters")
    phase: str
    created_at: float
    winner: str | None = None


def job_line(row: JobRow) -> JobLine:
    return JobLine(
        job_id=row.id,
        state=row.state,
        team=row.team_name,
        task=row.task[:300],
        phase=row.phase,
        created_at=row.created_at,
        winner=row.result.winner if row.result else None,
    )


def note_views(store: Store, job_id: str) -> list[NoteView]:
    """The job's steering notes, oldest first, each with whether the agents have it."""
    steered = [event for event in store.events(job_id, "steered") if isinstance(event, SteeredEvent)]
    notes = [event for event in store.events(job_id, "note") if isinstance(event, NoteEvent)]
    views = []
    for index, note in enumerate(notes):
        taken = steered[index] if index < len(steered) else None  # notes reach the protocol in order
        seen = taken is not None and not taken.late  # a note after the vote changes nothing
        views.append(
            NoteView(text=note.text, at=note.at, seen=seen, round=taken.round if taken and seen else None)
        )
    return views
