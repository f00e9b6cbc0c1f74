"""The job queue on Redis, through Docket (the engine under FastMCP's background tasks), when
CONCLAVE_QUEUE_URL names one: fronts (`conclave serve`) put a message on it for every job they admit,
workers (`conclave worker`, jobs/worker.py) run Docket workers that take the messages.

A message says "a job waits", not which job runs: the job itself waits in the store, owned by the
queue (`QUEUE_OWNER`), and the worker that takes a message takes the fairest waiting job from the
store (`Store.take_queued`: the caller that runs the fewest jobs goes first), so one caller's burst
on the queue never holds another caller's job behind it. The store, not the queue, is what decides
who owns a job: a lost or doubled message loses or doubles no job, and a worker's death is the lease's
business (jobs/takeover.py), not the queue's.

The workers also list themselves here (id, host, engine, limits), renewed at every heartbeat, so
`conclave doctor` sees the live ones; and a drain request for a worker is a key here too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio
from pydantic import BaseModel, ConfigDict, SecretStr

from conclave.errors import QueueUnavailable
from conclave.jobs.store.postgres import scheme_of, scrubbed, shown_url  # masks a URL's password

if TYPE_CHECKING:
    from docket import Docket

logger = logging.getLogger(__name__)

SETTING = "CONCLAVE_QUEUE_URL"
DOCKET = "conclave"  # the Docket's name: its keys in Redis begin with it
SCHEMES = ("redis", "rediss", "unix", "redis+sentinel")
CONNECT_S = 10.0  # how long opening the queue waits for Redis to answer
# A message a dead worker took is given to another worker after this long (Docket's redelivery; a live
# worker renews its messages). It only starts waiting jobs: the dead worker's own job is taken over by
# its lease (jobs/takeover.py), so this need not be short.
REDELIVERY = timedelta(seconds=60)
WORKERS = "conclave-workers"  # the hash of live workers, by id
DRAIN = "conclave-drain"  # the set of workers asked to drain

MessageRunner = Callable[[str], Awaitable[None]]
# The worker's runner, set for the life of `JobQueue.work` (jobs/worker.py): Docket runs tasks by name,
# so the task is one module-level function, and what runs the jobs reaches it like Docket's own
# current worker does, through a context variable.
_runner: ContextVar[MessageRunner | None] = ContextVar("conclave_queue_runner", default=None)


async def conclave_job(job_id: str) -> None:
    """The queue's one task: a worker starts waiting jobs (the one the message names, or a fairer one)."""
    runner = _runner.get()
    if runner is None:
        raise RuntimeError("the conclave_job task runs only in `conclave worker` (jobs/worker.py)")
    await runner(job_id)


class WorkerInfo(BaseModel):
    """A live worker as it lists itself on the queue."""

    model_config = ConfigDict(extra="forbid")

    id: str  # its owner id in the store: the jobs it runs are the ones with this owner
    host: str
    pid: int
    engine: str  # the Docker engine its jobs' containers run on
    max_jobs: int
    draining: bool = False
    seen: float  # its last heartbeat (epoch seconds)


class QueueDepth(BaseModel):
    """The queue's messages: waiting for a worker, and being run by one."""

    waiting: int
    running: int


class JobQueue:
    """The queue of one Conclave deployment: put a job on it, work it, list its workers."""

    def __init__(self, docket: Docket, shown: str, url: SecretStr | None = None) -> None:
        self.docket, self.shown = docket, shown
        self._url = url if url is not None else SecretStr("")  # to mask its password in Redis's errors

    @classmethod
    @asynccontextmanager
    async def open(cls, url: SecretStr) -> AsyncIterator[JobQueue]:
        """The queue at `url`, once Redis answers; a QueueUnavailable naming the setting otherwise."""
        shown = shown_url(url)
        scheme = scheme_of(url)
        if scheme not in SCHEMES:
            named = f"it names a {scheme!r} service" if scheme else "it is not a URL (no scheme://)"
            raise QueueUnavailable(
                SETTING,
                shown,
                f"{named}; give a Redis URL (redis://HOST:6379/0, rediss://...,"
                f" unix:///path/redis.sock), or unset {SETTING} to run jobs in this process",
            )
        try:
            from docket import Docket
        except ImportError as exc:
            raise QueueUnavailable(
                SETTING,
                shown,
                "it names a Redis queue, whose client is not installed: pip install 'conclave-mcp[queue]'"
                f" (pydocket), or unset {SETTING} to run jobs in this process",
            ) from exc
        async with Docket(name=DOCKET, url=url.get_secret_value()) as docket:
            docket.register(conclave_job)
            queue = cls(docket, shown, url)
            await queue.ping()
            yield queue

    async def ping(self) -> None:
        """Redis answers within CONNECT_S, or a QueueUnavailable naming the setting."""
        try:
            with anyio.fail_after(CONNECT_S):
                async with self.docket.redis() as redis:
                    await redis.info()  # any command: Docket's client types no PING
        except Exception as exc:  # redis-py's errors, a timeout: the URL is wrong or Redis is down
            raise QueueUnavailable(
                SETTING,
                self.shown,
                f"Redis could not be reached there ({scrubbed(_first_line(exc), self._url)}); check that"
                " redis-server runs and"
                f" that the URL's host, port, password and database are right, or unset {SETTING} to run"
                " jobs in this process",
            ) from None  # the client's own error may quote the URL: its line, masked, is above

    async def put(self, job_id: str) -> None:
        """Tell the workers a job waits (its row is `queued`, owned by the queue); a QueueUnavailable
        naming the setting when Redis does not take the message."""
        try:
            with anyio.fail_after(CONNECT_S):
                await self.docket.add(conclave_job, key=job_id)(job_id)
        except Exception as exc:  # redis-py's errors, a timeout
            raise QueueUnavailable(
                SETTING,
                self.shown,
                f"Redis did not take the job ({scrubbed(_first_line(exc), self._url)}); nothing was queued:"
                " check that redis-server runs and answers there, then ask again",
            ) from exc

    async def put_later(self, job_id: str, delay_s: float, attempt: int) -> None:
        """Put a job's message back for another worker, `delay_s` from now (the one that took it could
        not start a job: jobs/worker.py)."""
        when = datetime.now(UTC) + timedelta(seconds=delay_s)
        await self.docket.add(conclave_job, when=when, key=f"{job_id}~{attempt}")(job_id)

    @asynccontextmanager
    async def work(self, name: str, concurrency: int, runner: MessageRunner) -> AsyncIterator[None]:
        """A Docket worker taking messages, at most `concurrency` at once, each run by `runner`, for the
        body's life. Leaving stops it as Docket stops gracefully: it takes no more messages and waits
        for those it runs (their jobs) to end, acknowledging each."""
        from docket import Worker

        token = _runner.set(runner)
        try:
            async with (
                anyio.create_task_group() as tg,
                Worker(
                    self.docket, name=name, concurrency=concurrency, redelivery_timeout=REDELIVERY
                ) as worker,
            ):
                tg.start_soon(worker.run_forever)
                yield
        finally:
            _runner.reset(token)

    async def depth(self) -> QueueDepth:
        """How many messages wait for a worker and how many are being run."""
        snapshot = await self.docket.snapshot()
        return QueueDepth(waiting=len(snapshot.future), running=len(snapshot.running))

    # The workers' list --------------------------------------------------------------------------
    async def register(self, info: WorkerInfo) -> None:
        async with self.docket.redis() as redis:
            await redis.hset(self.docket.key(WORKERS), info.id, info.model_dump_json())

    async def unregister(self, worker_id: str) -> None:
        async with self.docket.redis() as redis:
            await redis.hdel(self.docket.key(WORKERS), worker_id)
            await redis.srem(self.docket.key(DRAIN), worker_id)

    async def workers(self, stale_after_s: float) -> list[WorkerInfo]:
        """The workers that listed themselves within `stale_after_s`, by host then id; the others are
        struck off (a worker that was only stalled lists itself again at its next heartbeat)."""
        async with self.docket.redis() as redis:
            listed: dict[Any, Any] = await redis.hgetall(self.docket.key(WORKERS))
            now = time.time()
            workers = [WorkerInfo.model_validate_json(value) for value in listed.values()]
            gone = [w.id for w in workers if now - w.seen > stale_after_s]
            if gone:
                await redis.hdel(self.docket.key(WORKERS), *gone)
        live = (w for w in workers if w.id not in gone)
        return sorted(live, key=lambda w: (w.host, w.id))

    async def ask_drain(self, worker_ids: list[str]) -> None:
        """Ask workers to drain: each finishes what it runs, takes nothing new and exits."""
        if worker_ids:
            async with self.docket.redis() as redis:
                await redis.sadd(self.docket.key(DRAIN), *worker_ids)

    async def drain_asked(self, worker_id: str) -> bool:
        async with self.docket.redis() as redis:
            asked: set[Any] = await redis.smembers(self.docket.key(DRAIN))
        return worker_id.encode() in asked or worker_id in asked


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
