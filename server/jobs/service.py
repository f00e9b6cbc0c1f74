"""The job registry: jobs run in the background, apart from the MCP request that started them.

`JobService.open` owns the task group every job runs in, so it must be entered outside FastMCP's
lifespan (see app/server.py). A job records its owner (process id + a random id) and a heartbeat; a starting
service marks `interrupted` only jobs whose owner is gone, never another live server's.

`submit` only checks (what the caller may name, jobs/access.py; the queue bound; the team's keys and
sandbox; verify and budgets, jobs/plan.py) and queues, with an estimate of what the job may use
(jobs/estimate.py): the context paths are copied when the job gets its slot, so ask_team returns at once.

A job belongs to the caller that started it (`caller`: `local` for the CLI and stdio, an HTTP token's name):
every operation given a caller answers only for that caller's jobs, as if the others did not exist; the
CLI passes none and sees all (tests/security/test_callers.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc

from conclave.backends.local import LocalServers
from conclave.backends.retry import RetryPolicy
from conclave.config import Team, resolve_team
from conclave.coordination.limits import ProviderLimits
from conclave.coordination.orchestrator import BackendFactory, Orchestrator, endpoint_factory
from conclave.errors import ConclaveError, InputError, JobFinished, QueueFull, term
from conclave.files.contexts import parse_context_paths
from conclave.files.review import Consent
from conclave.jobs.access import Access
from conclave.jobs.async_store import AsyncStore
from conclave.jobs.estimate import estimate
from conclave.jobs.file_steps import admit, collect, job_files, job_verifier, prepare
from conclave.jobs.follow_ups import carried, carry_files, thread_history
from conclave.jobs.lookup import JobLookup
from conclave.jobs.maintenance import prune_old_jobs, sweep_leftovers
from conclave.jobs.owners import process_alive
from conclave.jobs.plan import check_runnable, shape_team
from conclave.jobs.reach import check_reachable
from conclave.jobs.reader import WorkspacePage
from conclave.jobs.records import ApplyMode, JobOptions
from conclave.jobs.steering import Steering, checked_note, delivered
from conclave.jobs.store import ACTIVE_STATES, JobRow, Store
from conclave.jobs.store_sink import StoreSink
from conclave.jobs.teams import TeamList
from conclave.jobs.views import JobView
from conclave.settings import MAX_WAIT_S, Settings

logger = logging.getLogger(__name__)
POLL_S = 0.2  # a job another process runs: how often its waiters here look at the store
# A job this process runs wakes its waiters at every write (jobs/async_store.py); this is only a
# backstop for a write made around AsyncStore (directly through `store.sync`).
OWN_POLL_S = 1.0
LOCAL = "local"  # the caller name of the local user (the CLI, stdio); HTTP callers are named by their tokens

ProgressCallback = Callable[[JobView], Awaitable[None]]


def new_job_id() -> str:
    return "cj-" + secrets.token_hex(6)


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
    ) -> None:
        self.settings, self.store, self._tg = settings, store, tg
        self.access = access or Access.local(settings)
        self._environ, self._factory, self._retry = environ, backend_factory, retry
        self._probe = probe  # submit refuses a team whose own server is down (a test's fake backends have none)
        self._owner_id = uuid.uuid4().hex
        self._slots = anyio.CapacityLimiter(settings.max_jobs)
        self._check_slots = anyio.CapacityLimiter(settings.verify_concurrency)  # verification containers
        self._provider_limits = ProviderLimits(settings.provider_concurrency)  # shared by every job here
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._steering = Steering(store.sync)
        self.lookup = JobLookup(settings, store, environ)  # every read, the job-id check and the caller's rules
        # The web view's address when this server serves it (serve --http); else `conclave web`'s, if running.
        self.web_base: str | None = None

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
    ) -> AsyncIterator[JobService]:
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
                for job_id in await store.orphans(process_alive, settings.stale_after_s):
                    await store.set_state(job_id, "interrupted", "the server that ran this job stopped")
                factory = backend_factory or endpoint_factory(env, local_servers)
                service = cls(settings, store, tg, env, factory, retry, access, probe=backend_factory is None)
                tg.start_soon(service._watch)
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
        text = task.strip() if isinstance(task, str) else ""
        if not text:
            raise InputError("task", task, "give the team a non-empty task")
        if len(task) > self.settings.max_task_chars:
            raise InputError(
                "task", f"<{len(task)} characters>",
                f"keep the task under {self.settings.max_task_chars} characters; put large material in files",
            )
        if apply not in (False, True, "force"):
            raise InputError("apply", apply, 'use true (apply only with consensus), "force" or false')
        earlier = await self._row(follow_up, caller, "follow_up") if follow_up is not None else None
        stored: Team | None = None
        if earlier is not None:
            stored, context_paths = carried(earlier, team, context_paths)
        sources = parse_context_paths(context_paths or [])
        for index, source in enumerate(sources):
            self.access.check_folder(f"context_paths[{index}].path", source.path)
        if apply and not any(source.permission == "write" for source in sources):
            raise InputError("apply", apply, f"applying needs {term('context_write')}")
        queued = await self.store.queued(self._owner_id)
        if queued >= self.settings.max_queued:
            raise QueueFull(queued, self.settings.max_queued)
        self.access.check_team(team)
        resolved = stored if stored is not None else resolve_team(team, self._environ)
        check_runnable(resolved, self._environ, self.settings.sandbox_network)
        if self._probe:
            await check_reachable(resolved)
        resolved = shape_team(resolved, verify=verify, max_cost_usd=max_cost_usd, max_tokens=max_tokens,
                              has_context=bool(sources))
        job_id = new_job_id()
        consent = Consent(force_binary=force_binary is True, allow_artifacts=allow_artifacts is True)
        options = await admit(sources, resolved, apply, consent) if sources else JobOptions()
        options.estimate = estimate(resolved, await self.store.team_usage(resolved.name))
        await self.store.create_job(
            job_id, task, resolved.name, resolved.model_dump_json(), os.getpid(), self._owner_id, options,
            caller or LOCAL,
        )
        if earlier is not None:
            await self.store.write(job_id, self.store.sync.set_follow_up, job_id, earlier.id)
        self._scopes[job_id] = anyio.CancelScope()
        self._tg.start_soon(self._run, job_id, task, resolved)
        return await self._view(job_id)

    async def view(self, job_id: str, caller: str | None = None) -> JobView:
        return await self._view(job_id, caller)

    async def wait(
        self, job_id: str, wait_seconds: float, on_progress: ProgressCallback | None = None, caller: str | None = None
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
        await self.store.write(view.job_id, self.store.sync.add_note, view.job_id, text)
        self._steering.deliver(view.job_id)  # a job of ours takes it now; another process's watch loop does
        with anyio.move_on_after(5 if view.state != "queued" else 0):
            while not await self.store.read(delivered, self.store.sync, view.job_id, count) and not (
                    await self._view(job_id)).done:
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
        return self.settings.home / "jobs" / job_id

    async def teams(self) -> TeamList:
        """The presets, each with its status (jobs/lookup.py)."""
        return await self.lookup.teams()

    # Internals -----------------------------------------------------------------------------------
    async def _row(self, job_id: str, caller: str | None = None, field: str = "job_id") -> JobRow:
        return await self.lookup.row(job_id, caller, field)

    async def _view(self, job_id: str, caller: str | None = None) -> JobView:
        return await self.lookup.view(job_id, caller, self.web_base)


    async def _run(self, job_id: str, task: str, team: Team) -> None:
        scope = self._scopes[job_id]
        try:
            with scope:
                async with self._slots:
                    options = (await self._row(job_id)).options
                    timeout = team.coordination.timeout_s
                    deadline = anyio.current_time() + timeout  # the copy counts against the job's timeout
                    if options.context_paths:
                        await self.store.set_state(job_id, "running", "copying the context paths")
                        try:
                            with anyio.move_on_after(timeout) as copying:
                                await prepare(self.job_dir(job_id), options)
                        except ConclaveError as exc:
                            await self.store.set_state(job_id, "failed", f"failed: {exc}", error=str(exc))
                            return
                        if copying.cancelled_caught:
                            error = (f"the job reached its timeout of {timeout:g} s while copying the context "
                                     "paths; give smaller folders or raise coordination.timeout_s")
                            await self.store.set_state(job_id, "failed", f"failed: {error}", error=error)
                            return
                    row = await self._row(job_id)
                    files = job_files(job_id, self.job_dir(job_id), team, options, self.settings)
                    past, thread = thread_history(self.store.sync, row) if row.follow_up else ("", None)
                    try:
                        if files is not None and row.follow_up:
                            await self.store.set_state(job_id, "running", "starting from the earlier job's files")
                            await carry_files(self.store.sync, row, self.settings.home / "jobs", files.workspaces)
                    except ConclaveError as exc:
                        await self.store.set_state(job_id, "failed", f"failed: {exc}", error=str(exc))
                        return
                    await self.store.set_state(job_id, "running", "starting the agents")
                    orchestrator = Orchestrator(
                        job_id, task, team, StoreSink(self.store, job_id), self._factory,
                        retry=self._retry, limiters=self._provider_limits, files=files, deadline=deadline,
                        verifier=job_verifier(job_id, team, files, self.settings, self._check_slots), history=past, thread=thread,
                    )
                    self._steering.attach(job_id, orchestrator)
                    try:
                        async with files.egress() if files is not None else contextlib.nullcontext():
                            result = await orchestrator.run()
                        if files is not None:
                            await self.store.set_files(job_id, await collect(files, options, result.consensus))
                    except ConclaveError as exc:
                        await self.store.set_state(job_id, "failed", f"failed: {exc}", error=str(exc))
                    else:
                        state = "failed" if result.failed else "completed"
                        await self.store.set_state(job_id, state, error="; ".join(result.errors.values()) or None)
            if scope.cancelled_caught:
                with anyio.CancelScope(shield=True):
                    await self.store.set_state(job_id, "cancelled", "cancelled by the caller")
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._end_if_active(job_id, "interrupted", "the server stopped while the job ran")
            raise
        except Exception as exc:  # a bug: fail this job, keep the server serving
            logger.exception("job %s crashed", job_id)
            await self._end_if_active(job_id, "failed", "failed: internal error", error=f"internal error: {exc!r}")
        finally:
            self._scopes.pop(job_id, None)
            self._steering.detach(job_id)

    async def _end_if_active(self, job_id: str, state: str, phase: str, error: str | None = None) -> None:
        row = await self.store.job(job_id)
        if row is not None and row.state in ACTIVE_STATES:
            await self.store.set_state(job_id, state, phase, error=error)

    async def _watch(self) -> None:
        """Heartbeat our jobs and honour cancel requests other processes left in the store."""
        last_beat = 0.0
        while True:
            for job_id in await self.store.cancel_requests(self._owner_id):
                if job_id in self._scopes:
                    self._scopes[job_id].cancel()
            await anyio.to_thread.run_sync(self._steering.deliver_all)  # notes other processes left for our jobs
            if time.monotonic() - last_beat >= self.settings.heartbeat_s:
                await self.store.heartbeat(self._owner_id)
                last_beat = time.monotonic()
            await anyio.sleep(0.5)


def _check_wait(wait_seconds: float) -> None:
    if not 0 <= wait_seconds <= MAX_WAIT_S:
        raise InputError("wait_seconds", wait_seconds, f"use a number from 0 to {MAX_WAIT_S:g}")
