"""The job registry: jobs run in the background, apart from the MCP request that started them.

`JobService.open` owns the task group every job runs in, so it must be entered outside FastMCP's
lifespan (see app.py). A job records its owner (process id + a random id) and a heartbeat; a starting
service marks `interrupted` only jobs whose owner is gone, never another live server's.

`submit` only checks (what the caller may name, jobs/access.py; the queue bound; the team's keys and
sandbox; verify and budgets, jobs/plan.py) and queues, with an estimate of what the job may use
(jobs/estimate.py): the context paths are copied when the job gets its slot, so ask_team returns at once.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc

from conclave.backends import check_ready
from conclave.backends.local import LocalServers
from conclave.backends.retry import RetryPolicy
from conclave.config import ConfigError, Team, list_presets, resolve_team
from conclave.config import Sandbox as SandboxSpec
from conclave.coordination.job_files import JobFiles
from conclave.coordination.limits import ProviderLimits
from conclave.coordination.orchestrator import BackendFactory, Orchestrator, endpoint_factory
from conclave.coordination.reports import JobEvent, Progress
from conclave.coordination.verification import Verifier
from conclave.errors import ConclaveError, InputError, JobNotFound, QueueFull
from conclave.files.budget import MB
from conclave.files.contexts import parse_context_paths
from conclave.files.workspaces import Workspaces
from conclave.jobs.access import Access
from conclave.jobs.async_store import AsyncStore
from conclave.jobs.estimate import estimate, history
from conclave.jobs.file_steps import admit, collect, prepare
from conclave.jobs.gc import GcReport, prune
from conclave.jobs.owners import process_alive
from conclave.jobs.plan import shape_team
from conclave.jobs.reader import WorkspacePage, job_workspaces, read_job, read_whole
from conclave.jobs.records import ApplyMode, JobOptions
from conclave.jobs.store import ACTIVE_STATES, JobRow, Store
from conclave.jobs.teams import TeamList, team_list
from conclave.jobs.views import JobView, job_view, phase_of
from conclave.sandbox.container import container_user, sweep
from conclave.settings import MAX_WAIT_S, Settings

logger = logging.getLogger(__name__)
JOB_ID = re.compile(r"^cj-[0-9a-f]{12}$")
POLL_S = 0.2  # a job another process runs: how often its waiters here look at the store
# A job this process runs wakes its waiters at every write (jobs/async_store.py); this is only a
# backstop for a write made around AsyncStore (directly through `store.sync`).
OWN_POLL_S = 1.0

ProgressCallback = Callable[[JobView], Awaitable[None]]


def new_job_id() -> str:
    return "cj-" + secrets.token_hex(6)


class StoreSink:
    """The orchestrator's reports, written to the store."""

    def __init__(self, store: AsyncStore, job_id: str) -> None:
        self._store, self._job_id = store, job_id

    async def record(self, event: JobEvent, progress: Progress) -> None:
        await self._store.record(self._job_id, event, progress, phase_of(event))
        if event.kind == "presenting":
            await self._store.set_state(self._job_id, "presenting")


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
    ) -> None:
        self.settings, self.store, self._tg = settings, store, tg
        self.access = access or Access.local(settings)
        self._environ, self._factory, self._retry = environ, backend_factory, retry
        self._owner_id = uuid.uuid4().hex
        self._slots = anyio.CapacityLimiter(settings.max_jobs)
        self._check_slots = anyio.CapacityLimiter(settings.verify_concurrency)  # verification containers
        self._provider_limits = ProviderLimits(settings.provider_concurrency)  # shared by every job here
        self._scopes: dict[str, anyio.CancelScope] = {}

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
            # The store's writer outlives the jobs' task group (their last writes are shielded), and so
            # does the pool: jobs release their servers as they end, then the pool stops any left over
            # (tests/test_local.py).
            body_error: Exception | None = None
            async with (
                AsyncStore.open(sync_store) as store,
                LocalServers() as local_servers,
                anyio.create_task_group() as tg,
            ):
                for job_id in await store.orphans(process_alive, settings.stale_after_s):
                    await store.set_state(job_id, "interrupted", "the server that ran this job stopped")
                factory = backend_factory or endpoint_factory(env, local_servers)
                service = cls(settings, store, tg, env, factory, retry, access)
                tg.start_soon(service._watch)
                tg.start_soon(service._sweep)
                if settings.gc_auto:
                    tg.start_soon(service._prune)
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
        verify: str | None = None,
        max_cost_usd: float | None = None,
        max_tokens: int | None = None,
    ) -> JobView:
        """Check and queue a job; it starts (and copies its context paths) as soon as a slot is free."""
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
        sources = parse_context_paths(context_paths or [])
        for index, source in enumerate(sources):
            self.access.check_folder(f"context_paths[{index}].path", source.path)
        if apply and not any(source.permission == "write" for source in sources):
            raise InputError("apply", apply, "apply needs a context path with permission 'write'")
        queued = await self.store.queued(self._owner_id)
        if queued >= self.settings.max_queued:
            raise QueueFull(queued, self.settings.max_queued)
        self.access.check_team(team)
        resolved = resolve_team(team, self._environ)
        self._check_runnable(resolved)
        resolved = shape_team(resolved, verify=verify, max_cost_usd=max_cost_usd, max_tokens=max_tokens,
                              has_context=bool(sources))
        job_id = new_job_id()
        options = await admit(sources, resolved, apply, force_binary) if sources else JobOptions()
        options.estimate = estimate(resolved, await self.store.team_usage(resolved.name))
        await self.store.create_job(
            job_id, task, resolved.name, resolved.model_dump_json(), os.getpid(), self._owner_id, options
        )
        self._scopes[job_id] = anyio.CancelScope()
        self._tg.start_soon(self._run, job_id, task, resolved)
        return await self._view(job_id)

    async def view(self, job_id: str) -> JobView:
        return await self._view(job_id)

    async def wait(self, job_id: str, wait_seconds: float, on_progress: ProgressCallback | None = None) -> JobView:
        """Long-poll: return when the job is done or `wait_seconds` pass, reporting every change."""
        _check_wait(wait_seconds)
        view = await self._view(job_id)
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

    async def cancel(self, job_id: str) -> JobView:
        """Cancel a job here or, through the store, in whichever server process runs it."""
        view = await self._view(job_id)
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

    async def read(self, job_id: str, path: str, source: str | None, offset: int, limit: int) -> WorkspacePage:
        row = await self._row(job_id)
        workspaces = job_workspaces(row, self.settings.home / "jobs")
        return await read_job(self.store.sync, row, workspaces, path, source, offset, limit)

    async def read_whole(self, job_id: str, path: str) -> WorkspacePage:
        """One text of a job in full, every page gathered (for resources, which are not paged)."""
        row = await self._row(job_id)
        return await read_whole(self.store.sync, row, job_workspaces(row, self.settings.home / "jobs"), path, None)

    def job_dir(self, job_id: str) -> Path:
        return self.settings.home / "jobs" / job_id

    async def teams(self) -> TeamList:
        """The presets and each one's history here (team files and the store, read in a worker thread)."""
        store = self.store.sync
        return await anyio.to_thread.run_sync(lambda: team_list(
            list_presets(self._environ), self._environ, lambda team: history(team, store.team_usage(team.name))))

    # Internals -----------------------------------------------------------------------------------
    async def _row(self, job_id: str) -> JobRow:
        if not isinstance(job_id, str) or not JOB_ID.match(job_id.strip()):
            raise InputError("job_id", job_id, "job ids look like cj-1a2b3c4d5e6f (from ask_team's result)")
        row = await self.store.job(job_id.strip())
        if row is None:
            raise JobNotFound(job_id)
        return row

    async def _view(self, job_id: str) -> JobView:
        return job_view(await self._row(job_id), time.time())

    def _check_runnable(self, team: Team) -> None:
        """Refuse at once what would only fail later: a missing key, or what a backend needs installed."""
        for agent in team.agents:
            agent.api_key(self._environ)  # raises MissingApiKey naming the variable to set
            check_ready(agent.provider, agent.model_name, agent.model_path)
        if not isinstance(team.sandbox, str) and team.sandbox.network != "none" and not self.settings.sandbox_network:
            raise ConfigError(
                f"team {team.name!r} asks for `sandbox: network: {team.sandbox.network}`, which gives agents' "
                "commands the network; the server allows that only when its user sets "
                "CONCLAVE_SANDBOX_NETWORK=true. Otherwise use network: none"
            )

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
                    await self.store.set_state(job_id, "running", "starting the agents")
                    files = self._files(job_id, team, options)
                    orchestrator = Orchestrator(
                        job_id, task, team, StoreSink(self.store, job_id), self._factory,
                        retry=self._retry, limiters=self._provider_limits, files=files, deadline=deadline,
                        verifier=self._verifier(job_id, team, files),
                    )
                    try:
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

    def _files(self, job_id: str, team: Team, options: JobOptions) -> JobFiles | None:
        if not options.context_paths:
            return None
        sandbox = team.sandbox if options.commands and not isinstance(team.sandbox, str) else None
        workspaces = Workspaces(self.job_dir(job_id), agent_owner=container_user())
        return JobFiles(job_id, workspaces, sandbox, disk_budget=self.settings.job_disk_mb * MB)

    def _verifier(self, job_id: str, team: Team, files: JobFiles | None) -> Verifier | None:
        if team.verify is None or files is None:
            return None  # plan.shape_team refused a verify without context paths at submit
        spec = team.sandbox if not isinstance(team.sandbox, str) else SandboxSpec()
        return Verifier(job_id, team.verify, files.workspaces, spec, timeout_s=self.settings.verify_timeout_s,
                        limiter=self._check_slots)

    async def _end_if_active(self, job_id: str, state: str, phase: str, error: str | None = None) -> None:
        row = await self.store.job(job_id)
        if row is not None and row.state in ACTIVE_STATES:
            await self.store.set_state(job_id, state, phase, error=error)

    async def _prune(self) -> None:
        """Prune old finished jobs once at start (CONCLAVE_GC_AUTO; `conclave gc` does it by hand)."""
        settings = self.settings

        def run() -> GcReport:
            store = Store(settings.db_path)  # its own connection: a transaction in a thread stays its own
            try:
                return prune(store, settings.home / "jobs", keep_days=settings.gc_keep_days,
                             max_bytes=settings.gc_max_mb * MB)
            finally:
                store.close()

        report = await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
        if report.removed:
            logger.info("pruned old jobs: %s", report.text())

    async def _sweep(self) -> None:
        """Remove sandbox containers left by servers that died (never a live server's)."""
        try:
            removed = await sweep(lambda _owner, pid: not process_alive(pid))
        except ConclaveError:
            return  # no Docker engine: nothing to sweep
        except Exception:  # e.g. a container removed between the listing and its inspection: next start
            logger.warning("sweeping leftover sandbox containers failed", exc_info=True)
            return
        if removed:
            logger.info("removed %d leftover sandbox container(s): %s", len(removed), ", ".join(removed))

    async def _watch(self) -> None:
        """Heartbeat our jobs and honour cancel requests other processes left in the store."""
        last_beat = 0.0
        while True:
            for job_id in await self.store.cancel_requests(self._owner_id):
                if job_id in self._scopes:
                    self._scopes[job_id].cancel()
            if time.monotonic() - last_beat >= self.settings.heartbeat_s:
                await self.store.heartbeat(self._owner_id)
                last_beat = time.monotonic()
            await anyio.sleep(0.5)


def _check_wait(wait_seconds: float) -> None:
    if not 0 <= wait_seconds <= MAX_WAIT_S:
        raise InputError("wait_seconds", wait_seconds, f"use a number from 0 to {MAX_WAIT_S:g}")
