"""Everything a JobView shows, read in one reader thread: the job's row, its notes, its thread, its page.

`get_status` is the call a client makes most, often while many jobs run; each hop between the event loop
and a worker thread waits for the loop's next turn, which a busy loop makes long (bench/bench_store.py).
So a view is one hop: the job-id check, the caller check and every read behind it run together, on a
reader connection (jobs/connections.py), and web.json is looked at there too, never on the loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from conclave.jobs.steering import notes_and_thread
from conclave.jobs.store import JobRow, Store
from conclave.jobs.views import NoteView
from conclave.jobs.web_link import WebLinks


@dataclass(frozen=True)
class ViewParts:
    row: JobRow
    notes: list[NoteView]
    thread: list[str]
    web_url: str | None


def view_parts(store: Store, links: WebLinks, job_id: str, caller: str | None) -> ViewParts | None:
    """The job's parts, or None when there is no such job for `caller` (None: the CLI, any job).
    Blocking: run it through `AsyncStore.read`."""
    row = store.job(job_id)
    if row is None or (caller is not None and row.caller != caller):
        return None
    notes, thread = notes_and_thread(store, row)
    return ViewParts(row, notes, thread, links.page_url(job_id))
