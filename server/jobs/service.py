"""The job registry: jobs run in the background, apart from the MCP request that started them.

`JobService.open` owns the task group every job runs in, so it must be entered outside FastMCP's
lifespan (see app/server.py). The service is the one door the tools (and the CLI) use; behind it, three parts:
- admission (jobs/admission.py): what `submit` checks, and the queued job it stores; ask_team returns
  at once, the context paths are copied when the job gets its slot;
- lifecycle (jobs/lifecycle.py): a job's run from its slot to its one final state;
- maintenance (jobs/maintenance.py): what a server does beside its jobs (orphans, heartbeats, cancel
  requests and notes from other processes, pruning). A job records its owner (process id + a random
  id) and a heartbeat; a starting service marks `interrupted` only jobs whose owner is gone.

A job belongs to the caller that started it (`caller`: `local` for the CLI and stdio, an HTTP token's name):
every operation given a caller answers only for that caller's jobs, as if the others did not exist; the
CLI passes none and sees all (tests/security/test_callers.py).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc

from conclave.backends.llama_server import LocalServers
from conclave.backends.retry import RetryPolicy
from conclave.coordination.members import BackendFactory, endpoint_factory
from conclave.errors import InputError, JobFinished
from conclave.jobs.access import Access
from conclave.jobs.admission import Admission, JobRequest
from conclave.jobs.async_store import AsyncStore
from conclave.jobs.lifecycle import Lifecycle
from conclave.jobs.lookup import JobLookup
from conclave.jobs.maintenance import mark_orphans, prune_old_jobs, sweep_leftovers, watch
from conclave.jobs.reader import WorkspacePage
from conclave.jobs.records import ApplyMode
from conclave.jobs.steering import Steering, checked_note, delivered
from conclave.jobs.store import JobRow, Store
from conclave.jobs.teams import TeamList
from conclave.jobs.views import JobView
from conclave.sandbox.redirect import ProviderRedirect
from conclave.settings import MAX_WAIT_S, Settings

POLL_S = 0.2  # a job another process runs: how often its waiters here look at the store
# A job this process runs wakes its waiters at every write (jobs/async_store.py); this is only a
# backstop for a write made around AsyncStore (directly through `store.sync`).
OWN_POLL_S = 1.0
LOCAL = "local"  # the caller name of the local user (the CLI, stdio); HTTP callers are named by their tokens

ProgressCallback = Callable[[JobView], Awaitable[None]]


class JobService:
    """Submit, watch, cancel and read jobs."""

    def __init__(
        self,
        settings: Settings,
        store: AsyncStore,
        tg: anyio.abc.TaskGroup,
        environ: Mapping[str, str],
        backend_factory: BackendFactory,
        retry: RetryPolicy | None,
        access: Access | None = None,
        probe: bool = True,
        redirect: ProviderRedirect | None = None,
    ) -> None:
        self.settings, self.store, self._tg = settings, store, tg
        self.access = access or Access.local(settings)
        self._environ = environ
        self._owner_id = uuid.uuid4().hex
        self._steering = Steering(store)
        self._admission = Admission(settings, store, self.access, environ, self._owner_id, probe=probe)
        self._jobs = Lifecycle(settings, store, backend_factory, retry, self._steering, redirect)
        self._scopes = self._jobs.scopes  # the jobs this process runs
        self.lookup = JobLookup(
            settings, store, environ
        )  # every read, the job-id check and the caller's rules
        self.web_links = self.lookup.web_links  # job pages: this server's web view, else `conclave web`'s

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        settings: Settings,
        *,
        environ: Mapping[str, str] | None = None,
        backend_factory: BackendFactory | None = None,
        retry: RetryPolicy | None = None,
        access: Access | None = None,
        redirect: ProviderRedirect | None = None,
    ) -> AsyncIterator[JobService]:
        """`redirect` is for tests only: CLI members' provider hosts go to fakes (sandbox/redirect.py);
        the server and the CLI never pass one."""
        env = dict(os.environ if environ is None else environ)
        sync_store = await anyio.to_thread.run_sync(Store, settings.db_path)
        try:
            # The pool outlives the jobs' task group: jobs release their servers as they end, then the
            # pool stops any left over (tests/test_local.py).
            body_error: Exception | None = None
            async with (
                AsyncStore.open(sync_store) as store,
                LocalServers() as local_servers,
                anyio.create_task_group() as tg,
            ):
                await mark_orphans(store, settings)
                factory = backend_factory or endpoint_factory(env, local_servers)
                service = cls(
                    settings,
                    store,
                    tg,
                    env,
                    factory,
                    retry,
                    access,
                    probe=backend_factory is None,
                    redirect=redirect,
                )
                tg.start_soon(watch, store, settings, service._owner_id, service._scopes, service._steering)
                tg.start_soon(sweep_leftovers)
                if settings.gc_auto:
                    tg.start_soon(prune_old_jobs, settings)
                try:
                    yield service
                except Exception as exc:  # the caller's error: re-raised below as itself, not in a group
                    body_error = exc
                finally:
                    tg.cancel_scope.cancel()  # running jobs end as `interrupted`, answers kept
            if body_error is not None:
                raise body_error
        finally:
            sync_store.close()

    # The tools' operations -----------------------------------------------------------------------
    async def submit(
        self,
        task: str,
        team: str | None,
        context_paths: list[object] | None = None,
        apply: ApplyMode = False,
        force_binary: bool = False,
        *,
        allow_artifacts: bool = False,
        verify: str | None = None,
        max_cost_usd: float | None = None,
        max_tokens: int | None = None,
        follow_up: str | None = None,
        caller: str | None = None,
    ) -> JobView:
        """Check and queue a job; it starts (and copies its context paths) as soon as a slot is free.

        With `follow_up`, the job continues that earlier one (follow_ups.py says what carries over)."""
        earlier = await self._row(follow_up, caller, "follow_up") if follow_up is not None else None
        request = JobRequest(
            task,
            team,
            context_paths,
            apply,
            force_binary,
            allow_artifacts,
            verify,
            max_cost_usd,
            max_tokens,
            caller or LOCAL,
        )
        job = await self._admission.admit(request, earlier)
        self._jobs.admitted(job.job_id)
        self._tg.start_soon(self._jobs.run, job.job_id, job.task, job.team)
        return await self._view(job.job_id)

    async def view(self, job_id: str, caller: str | None = None) -> JobView:
        return await self._view(job_id, caller)

    async def wait(
        self,
        job_id: str,
        wait_seconds: float,
        on_progress: ProgressCallback | None = None,
        caller: str | None = None,
    ) -> JobView:
        """Long-poll: return when the job is done or `wait_seconds` pass, reporting every change."""
        _check_wait(wait_seconds)
        view = await self._view(job_id, caller)
        if view.done or wait_seconds == 0:
            return view
        rev = await self.store.rev(job_id)
        with anyio.move_on_after(wait_seconds):
            while not view.done:
                await self._changed(job_id)
                now = await self.store.rev(job_id)
                if now != rev:
                    view, rev = await self._view(job_id), now
                    if on_progress is not None:
                        await on_progress(view)
        return await self._view(job_id)

    async def _changed(self, job_id: str) -> None:
        """Until the job may have changed: woken by our own write to it, else polled (another process's)."""
        changed = self.store.changed(job_id)
        with anyio.move_on_after(OWN_POLL_S if job_id in self._scopes else POLL_S):
            await changed.wait()

    async def cancel(self, job_id: str, caller: str | None = None) -> JobView:
        """Cancel a job here or, through the store, in whichever server process runs it."""
        view = await self._view(job_id, caller)
        if view.done:
            return view
        scope = self._scopes.get(job_id)
        if scope is not None:
            scope.cancel()
        else:
            await self.store.request_cancel(job_id)
        with anyio.move_on_after(10):
            while not (view := await self._view(job_id)).done:
                await self._changed(job_id)
        return view

    async def steer(self, job_id: str, message: str, caller: str | None = None) -> JobView:
        """Leave a note for a running job's agents; it reaches them here or in the process that runs it."""
        text = checked_note(message, self.settings.max_task_chars)
        view = await self._view(job_id, caller)
        if view.done:
            raise JobFinished(job_id, view.state)
        count = len(view.notes) + 1
        await self.store.add_note(view.job_id, text)
        await self._steering.deliver(
            view.job_id
        )  # a job of ours takes it now; another process's watch loop does
        with anyio.move_on_after(5 if view.state != "queued" else 0):
            while (
                not await self.store.read(delivered, self.store.sync, view.job_id, count)
                and not (await self._view(job_id)).done
            ):
                await anyio.sleep(POLL_S)
        return await self._view(job_id)

    async def read(
        self, job_id: str, path: str, source: str | None, offset: int, limit: int, caller: str | None = None
    ) -> WorkspacePage:
        return await self.lookup.read(job_id, path, source, offset, limit, caller)

    async def read_whole(self, job_id: str, path: str, caller: str | None = None) -> WorkspacePage:
        """One text of a job in full, every page gathered (for resources, which are not paged)."""
        return await self.lookup.read_whole(job_id, path, caller=caller)

    def job_dir(self, job_id: str) -> Path:
        return self._jobs.job_dir(job_id)

    async def teams(self) -> TeamList:
        """The presets, each with its status (jobs/lookup.py)."""
        return await self.lookup.teams()

    # Internals -----------------------------------------------------------------------------------
    async def _row(self, job_id: str, caller: str | None = None, field: str = "job_id") -> JobRow:
        return await self.lookup.row(job_id, caller, field)

    async def _view(self, job_id: str, caller: str | None = None) -> JobView:
        return await self.lookup.view(job_id, caller)


def _check_wait(wait_seconds: float) -> None:
    if not 0 <= wait_seconds <= MAX_WAIT_S:
        raise InputError("wait_seconds", wait_seconds, f"use a number from 0 to {MAX_WAIT_S:g}")
