"""Finding and reading jobs: the one read path, for the MCP tools (through jobs/service.py) and the CLI.

A job id is checked here before the store is asked, and a caller sees only its own jobs (None, the
CLI: every job), so `get_status` and `conclave status` refuse a bad id with the same error and the
same rules. The store is read in worker threads, never on the event loop.

    async with JobLookup.open(settings, os.environ) as jobs:  # the CLI: a store of its own, read-only
        view = await jobs.view("cj-0123456789ab")
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import anyio.to_thread

from conclave.config.models import Team
from conclave.config.presets import list_presets
from conclave.errors import InputError, JobNotFound, term
from conclave.files.workspaces import Workspaces
from conclave.jobs.admission.estimate import history
from conclave.jobs.admission.reach import endpoints, unreachable
from conclave.jobs.read.reader import WorkspacePage, job_workspaces, read_job, read_whole
from conclave.jobs.read.teams import TeamList, team_list
from conclave.jobs.read.view_read import JobLine, PageParts, job_line, page_parts, view_parts
from conclave.jobs.read.views import FINAL_STATES, JobView, job_view
from conclave.jobs.read.web_link import WebLinks
from conclave.jobs.run.fair_share import queued_phase
from conclave.jobs.store.async_store import AsyncStore
from conclave.jobs.store.sql import JobRow, JobState, Store, StoreSummary
from conclave.settings import Settings

JOB_ID = re.compile(r"^cj-[0-9a-f]{12}$")


def checked_job_id(job_id: object, field: str = "job_id") -> str:
    """`job_id` without surrounding blanks; InputError, naming `field`, when it is no job id at all."""
    if not isinstance(job_id, str) or not JOB_ID.match(job_id.strip()):
        raise InputError(field, job_id, f"job ids look like cj-1a2b3c4d5e6f; see {term('list_jobs')}")
    return job_id.strip()


def store_summary(settings: Settings) -> tuple[str, StoreSummary]:
    """Where the job store is, in words, and the store at a glance (`conclave doctor`): blocking, on a
    store of its own, opened once (which also checks the folder is usable and the schema current)."""
    store = Store.of(settings)
    try:
        return store.shown, store.summary(time.time())
    finally:
        store.close()


def check_state_folder(settings: Settings) -> str:
    """Open the state folder's store once and close it: the folder is usable and the schema current
    (blocking; raises what went wrong). Where the store is, in words."""
    store = Store.of(settings)
    store.close()
    return store.shown


class JobLookup:
    """Jobs by id, for a caller: rows, views, pages of what they produced; the recent jobs; the teams."""

    def __init__(self, settings: Settings, store: AsyncStore, environ: Mapping[str, str]) -> None:
        self.settings, self.store, self._environ = settings, store, environ
        self.web_links = WebLinks(settings.home)  # job pages: a server's own web view, else `conclave web`'s

    @classmethod
    @asynccontextmanager
    async def open(cls, settings: Settings, environ: Mapping[str, str]) -> AsyncIterator[JobLookup]:
        """A lookup on a store of its own (the CLI's; a server's is its JobService's `lookup`), keys and
        logins read from `environ` (the CLI's: its process's variables)."""
        store = await anyio.to_thread.run_sync(Store.of, settings)
        try:
            async with AsyncStore.open(store) as async_store:
                yield cls(settings, async_store, dict(environ))
        finally:
            store.close()

    async def row(self, job_id: object, caller: str | None = None, field: str = "job_id") -> JobRow:
        """The job, for `caller` (None: the CLI, any job); another caller's job is not found, not refused,
        so its existence is not told either."""
        row = await self.store.job(checked_job_id(job_id, field))
        if row is None or (caller is not None and row.caller != caller):
            raise JobNotFound(str(job_id))
        return row

    async def view(self, job_id: object, caller: str | None = None) -> JobView:
        """The job as get_status shows it, read in one reader-thread hop (jobs/read/view_read.py), with its
        page on the web view when one is served (jobs/read/web_link.py)."""
        job_id = checked_job_id(job_id)
        parts = await self.store.read(view_parts, self.store.sync, self.web_links, job_id, caller)
        if parts is None:
            raise JobNotFound(str(job_id))
        row = parts.row
        if parts.place is not None:  # why it waits, and where it stands, as of now
            row = row.model_copy(update={"phase": queued_phase(parts.place, row.caller, self.settings)})
        view = job_view(row, time.time(), parts.notes, parts.conversation)
        return view.model_copy(update={"web_url": parts.web_url})

    async def recent(self) -> list[JobView]:
        """The latest 20 jobs, everyone's, newest first (the CLI's `conclave status`)."""
        now = time.time()
        return [job_view(row, now) for row in await self.store.recent_jobs(20)]

    async def lines(self, caller: str | None = None) -> list[JobLine]:
        """The latest 50 jobs as a list shows them, newest first (only `caller`'s when given)."""
        rows = await self.store.recent_jobs(50)
        return [job_line(row) for row in rows if caller is None or row.caller == caller]

    async def changes(self, job_id: object) -> tuple[int, int, str] | None:
        """What tells a watcher the job moved: (rev, events, state); None once it is gone."""
        return await self.store.read(self.store.sync.changes, checked_job_id(job_id))

    async def page(self, job_id: object, caller: str | None = None, patch_chars: int = 400_000) -> PageParts:
        """Everything the job's web page shows, read in one reader-thread hop (jobs/read/view_read.py); the
        patch cut at `patch_chars`."""
        job_id = checked_job_id(job_id)
        jobs_root = self.settings.jobs_root
        parts = await self.store.read(
            page_parts, self.store.sync, self.web_links, jobs_root, job_id, caller, patch_chars
        )
        if parts is None:
            raise JobNotFound(str(job_id))
        return parts

    async def request_cancel(self, job_id: object, caller: str | None = None) -> JobState:
        """Ask whichever server runs the job to cancel it (it watches the store: jobs/upkeep/maintenance.py);
        the job's state when asked (a job already over is left as it is)."""
        row = await self.row(job_id, caller)
        if row.state not in FINAL_STATES:
            await self.store.request_cancel(row.id)
        return row.state

    async def read(
        self,
        job_id: object,
        path: str,
        source: str | None,
        offset: int,
        limit: int,
        caller: str | None = None,
    ) -> WorkspacePage:
        """One page of what the job produced (read_workspace; jobs/read/reader.py says what can be read)."""
        row = await self.row(job_id, caller)
        return await read_job(self.store.sync, row, self._workspaces(row), path, source, offset, limit)

    async def read_whole(
        self, job_id: object, path: str, source: str | None = None, caller: str | None = None
    ) -> WorkspacePage:
        """One text or listing of a job in full, every page gathered (resources, `conclave show`)."""
        row = await self.row(job_id, caller)
        return await read_whole(self.store.sync, row, self._workspaces(row), path, source)

    async def teams(self) -> TeamList:
        """The presets, each with its status: keys set, its own servers answering (jobs/admission/reach.py),
        and what its past jobs here used (read in a worker thread)."""
        presets = list_presets(self._environ)
        down = await unreachable(endpoints(team for _, team in presets if isinstance(team, Team)))

        def listed(store: Store) -> TeamList:
            usage = store.team_usage
            return team_list(presets, self._environ, lambda team: history(team, usage(team.name)), down)

        return await self.store.read(listed, self.store.sync)

    def _workspaces(self, row: JobRow) -> Workspaces | None:
        return job_workspaces(row, self.settings.jobs_root)
