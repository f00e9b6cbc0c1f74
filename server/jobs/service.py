"""The job registry: jobs run in the background, apart from the MCP request that started them.

`JobService.open` owns the task group every job runs in, so it must be entered outside FastMCP's
lifespan (see app/server.py). The service is the one door the tools (and the CLI) use; behind it, three parts:
- admission (jobs/admission/admit.py): what `submit` checks, and the queued job it stores; ask_team returns
  at once, the context paths are copied when the job gets its slot;
- lifecycle (jobs/run/lifecycle.py): a job's run from its slot to its one final state, on the jobs' own
  event loop in a thread of its own (jobs/run/job_thread.py), so the loop serving MCP calls never waits
  behind the jobs' work;
- maintenance (jobs/upkeep/maintenance.py): what a server does beside its jobs (orphans, heartbeats, cancel
  requests and notes from other processes, pruning) and takeover (jobs/upkeep/takeover.py). A job records its
  owner (process id + a random id) and a lease its heartbeat renews; a service takes over (and resumes)
  only jobs whose owner is gone.
With a queue (CONCLAVE_QUEUE_URL: jobs/queue.py) the service is a front: it admits a job, stores it as
waiting on the queue and puts it there; `conclave worker` processes (jobs/worker.py) run it, and take
over each other's jobs. Cancels and notes reach the job through the store, as they reach another
process's; reads are the store's anyway.
Reads (a view, a job's files, the teams) go through `service.lookup` (jobs/lookup.py); the
service's own operations are the ones that change or wait on a job.

A job belongs to the caller that started it (`caller`: `local` for the CLI and stdio, an HTTP token's name):
every operation given a caller answers only for that caller's jobs, as if the others did not exist; the
CLI passes none and sees all.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import anyio
from anyio.abc import TaskGroup

from conclave.backends.llama_server import LocalServers
from conclave.config.models import SandboxSpec, Team
from conclave.coordination.check_pool import CheckPool
from conclave.errors import InputError, JobFinished, QueueUnavailable
from conclave.files.job_folder import JobFolder
from conclave.jobs.admission.access import Access
from conclave.jobs.admission.admit import Admission
from conclave.jobs.context.steering import Steering, checked_note, delivered
from conclave.jobs.environment import JobEnvironment
from conclave.jobs.lookup import JobLookup
from conclave.jobs.queue import JobQueue
from conclave.jobs.read.views import JobView
from conclave.jobs.request import JobRequest
from conclave.jobs.run.job_thread import JobThread
from conclave.jobs.run.lifecycle import Lifecycle, runnable_here
from conclave.jobs.store.async_store import AsyncStore
from conclave.jobs.store.owners import QUEUE_OWNER, process_alive
from conclave.jobs.store.sql import Store
from conclave.jobs.upkeep.maintenance import prune_old_jobs, sweep_leftovers, watch
from conclave.jobs.upkeep.readiness import Readiness, readiness
from conclave.jobs.upkeep.takeover import take_over
from conclave.sandbox.container import container_user
from conclave.settings import MAX_WAIT_S, Settings

POLL_S = 0.2  # a job another process runs: how often its waiters here look at the store
# A job this process runs wakes its waiters at every write (jobs/store/async_store.py); this is only a
# backstop for a write made around AsyncStore (directly through `store.sync`).
OWN_POLL_S = 1.0
LOCAL = "local"  # the caller name of the local user (the CLI, stdio); HTTP callers are named by their tokens

ProgressCallback = Callable[[JobView], Awaitable[None]]


class JobService:
    """Submit, watch, cancel and read jobs."""

    def __init__(
        self,
        jobs: JobEnvironment,
        store: AsyncStore,
        thread: JobThread,
        lifecycle: Lifecycle,
        owner_id: str,
        access: Access | None = None,
        queue: JobQueue | None = None,
    ) -> None:
        settings, environ = jobs.settings, jobs.environ
        self.settings, self.store = settings, store
        self.access = access or Access.local(settings, environ)
        self._environ = environ
        self._owner_id = owner_id
        self._thread, self._jobs = thread, lifecycle  # the jobs run on the thread's loop, never on ours
        self.queue = queue  # a front's: the jobs it admits wait there for a worker
        # a front's jobs wait owned by the queue, and its callers' lines are the queue's, every front's
        admitter = QUEUE_OWNER if queue is not None else owner_id
        self._admission = Admission(jobs, store, self.access, admitter, runs_jobs=queue is None)
        # every read (a view, a file, the teams), the job-id check and the caller's rules: callers read
        # through it (`service.lookup.view(...)`), the service has no second door for them
        self.lookup = JobLookup(settings, store, environ)
        self.web_links = self.lookup.web_links  # job pages: this server's web view, else `conclave web`'s

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        settings: Settings,
        *,
        access: Access | None = None,
        check_pool: bool = False,
    ) -> AsyncIterator[JobService]:
        """The service of production's job environment (jobs/environment.py `JobEnvironment.of`, from this
        process's variables), for the body's life: `serve`."""
        jobs = JobEnvironment.of(settings, os.environ)
        async with cls.serve(jobs, access=access, check_pool=check_pool) as service:
            yield service

    @classmethod
    @asynccontextmanager
    async def serve(
        cls, jobs: JobEnvironment, *, access: Access | None = None, check_pool: bool = False
    ) -> AsyncIterator[JobService]:
        """The service, for the body's life, its jobs sharing `jobs`. `check_pool`: keep check containers
        started ahead of jobs (coordination/check_pool.py), for a server that serves many; a one-job CLI
        run starts none."""
        settings = jobs.settings
        sync_store = await anyio.to_thread.run_sync(Store.of, settings)
        owner_id = uuid.uuid4().hex
        try:
            body_error: Exception | None = None
            async with AsyncExitStack() as stack:
                queue: JobQueue | None = None
                if settings.queue_url is not None:  # a front: workers run the jobs
                    queue = await stack.enter_async_context(
                        JobQueue.open(settings.queue_url, settings.queue_private)
                    )
                store = await stack.enter_async_context(AsyncStore.open(sync_store))
                tg = await stack.enter_async_context(anyio.create_task_group())
                wake = waker(store)
                pool = check_pool and queue is None  # a front runs no checks: its workers do
                side = JobsSide(jobs, sync_store, wake, pool)
                async with JobThread.open(side.open) as (thread, lifecycle):
                    service = cls(jobs, store, thread, lifecycle, owner_id, access, queue)
                    # the jobs of servers that died, before we serve; a front leaves them to the workers
                    adopt = adopter(settings, owner_id, thread, lifecycle) if queue is None else _no_adopt
                    await thread.call(adopt)
                    start_upkeep(settings, owner_id, thread, lifecycle, adopt, tg)
                    try:
                        yield service
                    except Exception as exc:  # the caller's error: re-raised below as itself, not in a group
                        body_error = exc
                    finally:
                        tg.cancel_scope.cancel()
                # leaving the thread: running jobs ended `interrupted`, answers kept
            if body_error is not None:
                raise body_error
        finally:
            sync_store.close()

    # The tools' operations -----------------------------------------------------------------------
    async def submit(self, request: JobRequest, caller: str | None = None) -> JobView:
        """Check and queue a job; it starts (and copies its context paths) as soon as a slot is free.

        With `request.follow_up`, the job continues that earlier one (follow_ups.py says what carries
        over). `caller`: whose job it is (LOCAL when None)."""
        follow_up = request.follow_up
        earlier = await self.lookup.row(follow_up, caller, "follow_up") if follow_up is not None else None
        job = await self._admission.admit(request, caller or LOCAL, earlier)
        if self.queue is not None:
            try:
                await self.queue.put(job.id)  # a worker takes it (jobs/worker.py)
            except QueueUnavailable:
                # no message: it would wait for another job's; the caller is told to ask again
                await self.store.cancel_queued(job.id, "not queued: Redis did not take it")
                raise
        else:
            self._thread.start(
                self._jobs.run, job.id, job.task, job.team, job.caller
            )  # cancellable from now on
        return await self.lookup.view(job.id)

    async def wait(
        self,
        job_id: str,
        wait_seconds: float,
        on_progress: ProgressCallback | None = None,
        caller: str | None = None,
    ) -> JobView:
        """Long-poll: return when the job is done or `wait_seconds` pass, reporting every change."""
        _check_wait(wait_seconds)
        view = await self.lookup.view(job_id, caller)
        if view.done or wait_seconds == 0:
            return view
        # the view again, after the revision: a write landing between the first view and the revision
        # (another process's job ending) would otherwise be in the revision but not in the view
        rev = await self.store.rev(job_id)
        view = await self.lookup.view(job_id)
        shown = view.model_dump(exclude={"elapsed_s"})
        with anyio.move_on_after(wait_seconds):
            while not view.done:
                await self._changed(job_id)
                now = await self.store.rev(job_id)
                if now != rev:
                    fresh, rev = await self.lookup.view(job_id), now
                    # a write landing between the revision read and the view read shows up twice
                    if (seen := fresh.model_dump(exclude={"elapsed_s"})) == shown:
                        continue
                    view, shown = fresh, seen
                    if on_progress is not None:
                        await on_progress(view)
        return await self.lookup.view(job_id)

    async def _changed(self, job_id: str) -> None:
        """Until the job may have changed: woken by our own write to it, else polled (another process's)."""
        changed = self.store.changed(job_id)
        with anyio.move_on_after(OWN_POLL_S if job_id in self._jobs.scopes else POLL_S):
            await changed.wait()

    async def cancel(self, job_id: str, caller: str | None = None) -> JobView:
        """Cancel a job here or, through the store, in whichever server process runs it."""
        view = await self.lookup.view(job_id, caller)
        if view.done:
            return view
        if await self.store.cancel_queued(job_id):  # still waiting on the queue: no worker has it
            return await self.lookup.view(job_id)
        if not await self._thread.call(self._jobs.cancel, job_id):  # not ours: its server takes it
            await self.store.request_cancel(job_id)
        with anyio.move_on_after(10):
            while not (view := await self.lookup.view(job_id)).done:
                await self._changed(job_id)
        return view

    async def steer(self, job_id: str, message: str, caller: str | None = None) -> JobView:
        """Leave a note for a running job's agents; it reaches them here or in the process that runs it."""
        text = checked_note(message, self.settings.max_task_chars)
        view = await self.lookup.view(job_id, caller)
        if view.done:
            raise JobFinished(job_id, view.state)
        count = len(view.notes) + 1
        await self.store.add_note(view.job_id, text)
        # a job of ours takes it now; another process's watch loop does
        await self._thread.call(self._jobs.steering.deliver, view.job_id)
        with anyio.move_on_after(5 if view.state != "queued" else 0):
            while (
                not await self.store.read(delivered, self.store.sync, view.job_id, count)
                and not (await self.lookup.view(job_id)).done
            ):
                await anyio.sleep(POLL_S)
        return await self.lookup.view(job_id)

    def job_folder(self, job_id: str) -> JobFolder:
        return self._jobs.job_folder(job_id)

    async def readiness(self) -> Readiness:
        """Whether this server can take jobs now: its store and, if configured, its engine and its
        queue answer."""
        return await readiness(self.store, self._environ, self.queue)


@dataclass(frozen=True)
class JobsSide:
    """What the jobs' loop builds and owns (jobs/run/job_thread.py enters `open` there): their store, waking
    the serving loop's waiters; the local model servers (one per model file, shared by the jobs that
    use it; closing the pool stops any still running, so none outlives the service); the check pool's
    upkeep; the lifecycle."""

    jobs: JobEnvironment
    sync_store: Store
    wake: Callable[[str], None]
    check_pool: bool
    # a worker's jobs were admitted by a front, which could not check keys and servers: check them here;
    # a server that admits its own jobs checked them at admission, in this process
    admitted_elsewhere: bool = False

    async def _runnable(self, team: Team) -> None:
        await runnable_here(team, self.jobs)

    @asynccontextmanager
    async def open(self) -> AsyncIterator[Lifecycle]:
        pool = _check_pool(self.jobs.settings, self.check_pool)
        async with (
            AsyncStore.open(self.sync_store, on_change=self.wake) as jobs_store,
            LocalServers() as local_servers,
            anyio.create_task_group() as pool_tg,
        ):
            # the check pool lives on the jobs' loop, where the checks take from it
            pool_tg.start_soon(pool.keep, SandboxSpec(), lambda pid: not process_alive(pid))
            factory = self.jobs.agents.factory(local_servers)
            steering = Steering(jobs_store)
            try:
                yield Lifecycle(
                    self.jobs,
                    jobs_store,
                    factory,
                    steering,
                    pool,
                    runnable=self._runnable if self.admitted_elsewhere else None,
                )
            finally:
                pool_tg.cancel_scope.cancel()


def _check_pool(settings: Settings, enabled: bool) -> CheckPool:
    """Check containers started ahead of jobs (coordination/check_pool.py): none unless `enabled`."""
    size = settings.verify_concurrency if settings.check_pool is None else settings.check_pool
    return CheckPool(settings.home, container_user(), size if enabled else 0)


def waker(store: AsyncStore) -> Callable[[str], None]:
    """Wakes `store`'s waiters, on the loop calling this (the serving one), from the jobs' loop."""
    serving = asyncio.get_running_loop()

    def wake(job_id: str) -> None:
        serving.call_soon_threadsafe(store.wake, job_id)

    return wake


def adopter(
    settings: Settings, owner_id: str, thread: JobThread, lifecycle: Lifecycle
) -> Callable[[], Awaitable[list[str]]]:
    """Take over the jobs of servers that died (jobs/upkeep/takeover.py), on the jobs' loop: each resumes
    there, in a slot of its caller's line like any job."""

    def resume(job_id: str, task: str, team: Team, caller: str) -> None:
        thread.start(lifecycle.run, job_id, task, team, caller, True)

    async def adopt() -> list[str]:
        return await take_over(lifecycle.store, settings, owner_id, resume)

    return adopt


async def _no_adopt() -> list[str]:
    """A front's takeovers: none (the workers take over each other's jobs, jobs/worker.py)."""
    return []


def start_upkeep(
    settings: Settings,
    owner_id: str,
    thread: JobThread,
    lifecycle: Lifecycle,
    adopt: Callable[[], Awaitable[list[str]]],
    tg: TaskGroup,
) -> None:
    """What a server does beside its jobs (jobs/upkeep/maintenance.py): the watch loop on the jobs' loop
    (heartbeats, other processes' cancels and notes, takeovers), the sweep of dead servers' containers
    and the pruning on ours."""
    upkeep = (lifecycle.scopes, lifecycle.steering, adopt, lifecycle.abandon)
    thread.start(watch, lifecycle.store, settings, owner_id, *upkeep)
    tg.start_soon(sweep_leftovers)
    if settings.gc_auto:
        tg.start_soon(prune_old_jobs, settings)


def _check_wait(wait_seconds: float) -> None:
    if not 0 <= wait_seconds <= MAX_WAIT_S:
        raise InputError("wait_seconds", wait_seconds, f"use a number from 0 to {MAX_WAIT_S:g}")
