"""`conclave worker`: a process that runs the jobs fronts put on the queue (CONCLAVE_QUEUE_URL,
jobs/queue.py), with the same lifecycle the single-process server runs them with (jobs/run/lifecycle.py).

A worker is a server without callers: the jobs' loop and thread (jobs/run/job_thread.py), the upkeep
(jobs/upkeep/maintenance.py: it heartbeats the leases of the jobs it runs, takes the cancels and notes
fronts leave in the store, and takes over the jobs of workers that died: jobs/upkeep/takeover.py), and a
consumer taking the queue's messages, at most CONCLAVE_MAX_JOBS at once. Each message runs
`Worker`: it takes the fairest waiting job from the store (`Store.take_queued`), runs it to its
end, and takes the next while jobs wait; when it could take none (its caller's share here is full),
it puts the message back for another worker.

Draining (SIGTERM, SIGINT, or `conclave worker --drain ID` through the queue): the worker takes no
new message and claims no other worker's job, finishes what it runs, leaves the queue's list and
exits. A worker killed outright leaves its jobs to the others: their leases run out and one takes
each over.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup
from pydantic import BaseModel, SecretStr, ValidationError

from conclave.config.models import Team
from conclave.errors import InputError, QueueUnavailable
from conclave.jobs.environment import JobEnvironment
from conclave.jobs.queue import SETTING, JobQueue, QueueDepth, WorkerInfo
from conclave.jobs.run.job_thread import JobThread
from conclave.jobs.run.lifecycle import Lifecycle
from conclave.jobs.service import JobsSide, adopter, start_upkeep, waker
from conclave.jobs.store.async_store import AsyncStore
from conclave.jobs.store.owners import QUEUE_OWNER
from conclave.jobs.store.sql import Store
from conclave.sandbox.endpoint import choose_endpoint
from conclave.settings import Settings

RETRY_S = 1.0  # a message this worker could not start a job for goes back on the queue this much later
IDLE_S = 0.5  # draining: how often it looks whether its last jobs (taken-over ones too) have ended


class Worker:
    """This worker: what the queue's messages run on it (on the serving loop; the jobs run on theirs)."""

    def __init__(
        self, settings: Settings, queue: JobQueue, thread: JobThread, lifecycle: Lifecycle, owner_id: str
    ) -> None:
        self.settings, self.queue, self._thread, self._lifecycle = settings, queue, thread, lifecycle
        self.owner_id = owner_id
        self.drain = anyio.Event()  # set: take nothing new
        self._retries = 0

    async def __call__(self, job_id: str) -> None:
        """One message (naming `job_id`): run waiting jobs, the fairest first, while any waits for us."""
        while not self.drain.is_set():
            taken = await self._thread.call(self._take)
            if taken is None:
                break
            await self._thread.call(self._lifecycle.run, *taken)
        if await self._thread.call(self._still_queued, job_id):
            # nobody took the job this message named: another worker may (this one is full or draining)
            self._retries += 1
            await self.queue.put_later(job_id, RETRY_S, self._retries)

    async def _still_queued(self, job_id: str) -> bool:
        row = await self._lifecycle.store.job(job_id)
        return row is not None and row.state == "queued" and row.owner_id == QUEUE_OWNER

    async def _take(self) -> tuple[str, str, Team, str] | None:
        """On the jobs' loop: take the fairest waiting job this worker may run now; None if none."""
        store, share = self._lifecycle.store, self._lifecycle.share
        if sum(share.running.values()) >= share.total:
            return None  # full (a job taken over holds a slot): the message goes back
        while True:
            job_id = await store.take_queued(
                self.owner_id,
                os.getpid(),
                self.settings.stale_after_s,
                dict(share.running),
                self.settings.max_jobs_per_caller,
            )
            if job_id is None:
                return None
            row = await store.job(job_id)
            if row is None:
                continue
            try:
                team = Team.model_validate_json(row.team_json)
            except ValidationError:  # stored by another Conclave version that this one cannot read
                await store.set_state(
                    job_id, "failed", "failed: its stored team does not read here", error="team unreadable"
                )
                continue
            return job_id, row.task, team, row.caller

    async def idle(self) -> bool:
        """Whether this worker runs no job any more (on the jobs' loop's word)."""
        return not await self._thread.call(self._any_running)

    async def _any_running(self) -> bool:
        return bool(self._lifecycle.scopes)

    async def keep_listed(self, info: WorkerInfo) -> None:
        """List this worker on the queue at every heartbeat (`conclave doctor` shows it), and drain when
        asked to through the queue."""
        while True:
            info = info.model_copy(update={"seen": time.time(), "draining": self.drain.is_set()})
            with suppress(Exception):  # Redis away for a moment: the next heartbeat lists it again
                await self.queue.register(info)
                if await self.queue.drain_asked(self.owner_id):
                    self.start_draining("asked through the queue")
            await anyio.sleep(self.settings.heartbeat_s)

    def start_draining(self, why: str) -> None:
        if not self.drain.is_set():
            why = f"conclave worker: draining ({why}): finishing its jobs, taking no new ones"
            print(why, file=sys.stderr, flush=True)
            self.drain.set()


async def run_worker(jobs: JobEnvironment) -> None:
    """Run queued jobs until drained (see the module docstring), in `jobs`' environment (production's:
    `JobEnvironment.of(settings, os.environ)`)."""
    settings, env = jobs.settings, jobs.environ
    url = _queue_url(settings)
    sync_store = await anyio.to_thread.run_sync(Store.of, settings)
    owner_id = uuid.uuid4().hex
    try:
        async with (
            JobQueue.open(url, settings.queue_private) as queue,
            AsyncStore.open(sync_store) as store,
            anyio.create_task_group() as tg,
        ):
            side = JobsSide(jobs, sync_store, waker(store), True, admitted_elsewhere=True)
            async with JobThread.open(side.open, name="conclave-worker-jobs") as (thread, lifecycle):
                worker = Worker(settings, queue, thread, lifecycle, owner_id)
                began = time.perf_counter()
                loaded = await thread.call(lifecycle.preload)  # before it takes a job
                warm = f"provider SDKs loaded in {time.perf_counter() - began:.1f} s: {', '.join(loaded)}"
                adopt = _unless_draining(adopter(settings, owner_id, thread, lifecycle), worker)
                await thread.call(adopt)  # the jobs of workers that died, before taking new ones
                start_upkeep(settings, owner_id, thread, lifecycle, adopt, tg)
                await _work(settings, queue, worker, env, tg, warm)
                tg.cancel_scope.cancel()
    finally:
        sync_store.close()


async def _work(
    settings: Settings,
    queue: JobQueue,
    worker: Worker,
    environ: Mapping[str, str],
    tg: TaskGroup,
    warm: str,
) -> None:
    """Take the queue's messages until drained, then wait for this worker's last jobs to end; `warm`
    says what it loaded before (shown as it starts taking them)."""
    host = socket.gethostname()
    info = WorkerInfo(
        id=worker.owner_id,
        host=host,
        pid=os.getpid(),
        engine=choose_endpoint(environ).chosen_by,
        max_jobs=settings.max_jobs,
        seen=time.time(),
    )
    tg.start_soon(_drain_on_signals, worker)
    # listed before it says it takes jobs: `conclave doctor` run after that line shows it (the heartbeat's
    # first listing, in a task of its own, came after the line on a slow machine)
    await worker.queue.register(info)
    tg.start_soon(worker.keep_listed, info)
    name = f"{host}#{os.getpid()}#{worker.owner_id[:8]}"
    try:
        async with queue.work(name, settings.max_jobs, worker):
            print(
                f"conclave worker {worker.owner_id} on {host}: taking up to {settings.max_jobs} jobs"
                f" at once from {queue.shown} ({warm})",
                file=sys.stderr,
                flush=True,
            )
            await worker.drain.wait()
        # the queue's consumer took no more messages and waited for the ones it ran: their jobs have ended
        while not await worker.idle():  # jobs taken over run beside the messages
            await anyio.sleep(IDLE_S)
    finally:
        with anyio.CancelScope(shield=True), suppress(Exception):
            await queue.unregister(worker.owner_id)
    print(f"conclave worker {worker.owner_id}: drained, exiting", file=sys.stderr, flush=True)


async def _drain_on_signals(worker: Worker) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            worker.start_draining(signal.Signals(signum).name)


def _queue_url(settings: Settings) -> SecretStr:
    if settings.queue_url is None:
        raise QueueUnavailable(
            SETTING,
            "(unset)",
            "workers take their jobs from the queue the fronts put them on: set it to that Redis URL"
            " (redis://HOST:6379/0), as the fronts have it",
        )
    return settings.queue_url


def _unless_draining(
    adopt: Callable[[], Awaitable[list[str]]], worker: Worker
) -> Callable[[], Awaitable[list[str]]]:
    """A draining worker claims no other worker's job."""

    async def maybe() -> list[str]:
        return [] if worker.drain.is_set() else await adopt()

    return maybe


async def drain_workers(settings: Settings, worker_ids: list[str]) -> list[str]:
    """Ask the live workers named (or `all`) to drain, through the queue; the ids asked. An id no live
    worker has is an InputError naming the live ones."""
    async with JobQueue.open(_queue_url(settings), settings.queue_private) as queue:
        live = [worker.id for worker in await queue.workers(settings.stale_after_s)]
        wanted = live if "all" in worker_ids else worker_ids
        for worker_id in wanted:
            if worker_id not in live:
                raise InputError(
                    "--drain", worker_id, f"give a live worker's id ({', '.join(live) or 'none runs'}) or all"
                )
        await queue.ask_drain(wanted)
        return wanted


class LiveWorker(BaseModel):
    """A live worker as `conclave doctor` shows it: how it listed itself, and the jobs it holds now."""

    info: WorkerInfo
    running: int


class QueueReport(BaseModel):
    """The queue at a glance: where it is, its messages, the jobs waiting for a worker, the live workers."""

    where: str
    depth: QueueDepth
    waiting_jobs: int
    workers: list[LiveWorker]


async def queue_report(settings: Settings) -> QueueReport:
    """What `conclave doctor` shows of the queue and its workers."""
    async with JobQueue.open(_queue_url(settings), settings.queue_private) as queue:
        depth = await queue.depth()  # counted: no message is read
        live = await queue.workers(settings.stale_after_s)

    def held() -> dict[str, int]:
        store = Store.of(settings)
        try:
            return store.running_by_owner()
        finally:
            store.close()

    holding = await anyio.to_thread.run_sync(held)
    return QueueReport(
        where=queue.shown,
        depth=depth,
        waiting_jobs=holding.get(QUEUE_OWNER, 0),
        workers=[LiveWorker(info=info, running=holding.get(info.id, 0)) for info in live],
    )
