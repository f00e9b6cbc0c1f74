"""The job queue on Redis, when CONCLAVE_QUEUE_URL names one: fronts (`conclave serve`) put a message on
it for every job they admit, workers (`conclave worker`, jobs/worker.py) take the messages.

A message says "a job waits", not which job runs: the job itself waits in the store, owned by the
queue (`QUEUE_OWNER`), and the worker that takes a message takes the fairest waiting job from the
store (`Store.take_queued`: the caller that runs the fewest jobs goes first), so one caller's burst
on the queue never holds another caller's job behind it. The store, not the queue, is what decides
who owns a job: a lost or doubled message loses or doubles no job, and a worker's death is the lease's
business (jobs/upkeep/takeover.py), not the queue's.

A message is data, never code: its one field is a job id in plain text, and a worker reads nothing
else (whatever else it finds is refused, logged and dropped); `conclave doctor` counts messages
without reading them. That is why this is a Redis stream of our own rather than Docket (the engine
under FastMCP's background tasks, which this used to be): Docket 0.27 pickles every task's arguments
and every strike, and loads them, before any code of ours runs, in every worker, in every process
that opens it (its strike list) and in its snapshot (what `doctor` listed), with no way to give it
another format; so whoever could write to its Redis ran code in all of them.

The stream (`STREAM`) has one consumer group of workers; a worker that takes a message keeps renewing
its claim while it runs the message, and a claim a dead worker left is taken by another after
`REDELIVERY`. A message put back for later waits in a sorted set (`LATER`) by due time until a worker
moves it onto the stream.

The workers also list themselves here (id, host, engine, limits), renewed at every heartbeat, so
`conclave doctor` sees the live ones; and a drain request for a worker is a key here too.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup
from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError

from conclave.errors import QueueUnavailable
from conclave.jobs.store.postgres import scheme_of, scrubbed, shown_url  # masks a URL's password

if TYPE_CHECKING:
    from redis.asyncio import Redis

try:  # the `queue` extra; JobQueue.open says how to install it
    from redis.exceptions import RedisError

    REDIS_ERRORS: tuple[type[Exception], ...] = (RedisError,)
except ImportError:  # pragma: no cover
    REDIS_ERRORS = ()  # no client: no Redis error can be raised

logger = logging.getLogger(__name__)

SETTING = "CONCLAVE_QUEUE_URL"
PRIVATE = "CONCLAVE_QUEUE_PRIVATE"
SCHEMES = ("redis", "rediss", "unix")
CONNECT_S = 10.0  # how long opening the queue waits for Redis to answer
# A message a dead worker took is given to another worker after this long (a live worker renews its
# claims). It only starts waiting jobs: the dead worker's own job is taken over by its lease
# (jobs/upkeep/takeover.py), so this need not be short.
REDELIVERY = timedelta(seconds=60)
RETRY_S = 1.0  # how long a worker waits after Redis failed it before it reads again
POLL_S = 0.25  # how long a worker's read waits for a message before it looks at its later ones again
PREFIX = "conclave"  # every key of ours in Redis begins with it (the names Docket's keys had)
STREAM = f"{PREFIX}:stream"  # the messages: one field, `job`, a job id
LATER = f"{PREFIX}:queue"  # messages put back for later: "JOB_ID~N" members scored by due time (epoch s)
GROUP = "conclave-workers"  # the workers' consumer group on STREAM
WORKERS = f"{PREFIX}:conclave-workers"  # the hash of live workers, by id
DRAIN = f"{PREFIX}:conclave-drain"  # the set of workers asked to drain
FIELD = b"job"
JOB_ID = re.compile(r"cj-[0-9a-f]{12}")  # jobs/admission/admit.py new_job_id's shape, and nothing else
LATER_MEMBER = re.compile(r"(cj-[0-9a-f]{12})~[0-9]{1,9}")
MOVE_BATCH = 100  # due later messages moved onto the stream per look

MessageHandler = Callable[[str], Awaitable[None]]


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

    def __init__(self, redis: Redis, shown: str, url: SecretStr | None = None) -> None:
        self.redis, self.shown = redis, shown
        self._url = url if url is not None else SecretStr("")  # to mask its password in Redis's errors

    @classmethod
    @asynccontextmanager
    async def open(cls, url: SecretStr, private: bool = False) -> AsyncIterator[JobQueue]:
        """The queue at `url`, once Redis answers; a QueueUnavailable naming the setting otherwise. A URL
        that gives no password is refused unless `private` (CONCLAVE_QUEUE_PRIVATE)."""
        shown = shown_url(url)
        scheme = scheme_of(url)
        if scheme not in SCHEMES:
            named = f"it names a {scheme!r} service" if scheme else "it is not a URL (no scheme://)"
            raise QueueUnavailable(
                SETTING,
                shown,
                f"{named}; give a Redis URL (redis://:PASSWORD@HOST:6379/0,"
                f" rediss://..., unix://:PASSWORD@/path/redis.sock), or unset {SETTING} to run jobs in"
                " this process",
            )
        try:
            from redis.asyncio import Redis
            from redis.asyncio.connection import parse_url
        except ImportError as exc:
            raise QueueUnavailable(
                SETTING,
                shown,
                "it names a Redis queue, whose client is not installed: pip install 'conclave-mcp[queue]'"
                f" (redis), or unset {SETTING} to run jobs in this process",
            ) from exc
        try:
            given = parse_url(url.get_secret_value())
        except ValueError as exc:  # its message can quote the URL: not shown
            raise QueueUnavailable(
                SETTING, shown, "it does not read as a Redis URL: redis://:PASSWORD@HOST:6379/0"
            ) from exc
        if not given.get("password") and not private:
            raise QueueUnavailable(
                SETTING,
                shown,
                "it gives no password, and whoever can write to the queue's Redis can start and stall"
                " jobs: give Redis a password (requirepass) and put it in the URL"
                f" (redis://:PASSWORD@HOST:6379/0), or set {PRIVATE}=1 if only Conclave's fronts and"
                " workers can reach this Redis (a private socket or network: docs/deploy.md)",
            )
        redis = Redis.from_url(url.get_secret_value(), socket_connect_timeout=CONNECT_S)
        try:
            queue = cls(redis, shown, url)
            await queue.ping()
            yield queue
        finally:
            with anyio.CancelScope(shield=True):
                await redis.aclose()

    async def ping(self) -> None:
        """Redis answers within CONNECT_S, or a QueueUnavailable naming the setting."""
        try:
            with anyio.fail_after(CONNECT_S):
                await self.redis.ping()
        except Exception as exc:  # redis-py's errors, a timeout: the URL is wrong or Redis is down
            raise QueueUnavailable(
                SETTING,
                self.shown,
                f"Redis could not be reached there ({scrubbed(_first_line(exc), self._url)}); check that"
                " redis-server runs and that the URL's host, port, password and database are right, or"
                f" unset {SETTING} to run jobs in this process",
            ) from None  # the client's own error may quote the URL: its line is above, masked

    async def put(self, job_id: str) -> None:
        """Tell the workers a job waits (its row is `queued`, owned by the queue); a QueueUnavailable
        naming the setting when Redis does not take the message."""
        try:
            with anyio.fail_after(CONNECT_S):
                await self.redis.xadd(STREAM, {FIELD: job_id.encode()})
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
        await self.redis.zadd(LATER, {f"{job_id}~{attempt}": time.time() + delay_s})

    @asynccontextmanager
    async def work(self, name: str, concurrency: int, handle: MessageHandler) -> AsyncIterator[None]:
        """Take messages as consumer `name`, at most `concurrency` at once, each run by `handle`, for the
        body's life. Leaving stops it gracefully: it takes no more messages and waits for those it runs
        (their jobs) to end, acknowledging each."""
        await self._ensure_group()
        taker = _Taker(self, name, concurrency, handle)
        async with anyio.create_task_group() as tg:
            tg.start_soon(taker.run)
            try:
                yield
            finally:
                taker.stop.set()

    async def depth(self) -> QueueDepth:
        """How many messages wait for a worker and how many are being run: counted, never read."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xlen(STREAM)
            pipe.zcard(LATER)
            in_stream, later = await pipe.execute()
        running = 0
        if in_stream:
            groups = await self.redis.xinfo_groups(STREAM)
            running = sum(int(g["pending"]) for g in groups if _text(g["name"]) == GROUP)
        return QueueDepth(waiting=in_stream - running + later, running=running)

    async def _ensure_group(self) -> None:
        """The workers' group on the stream, reading from its first message (those put before any
        worker started wait for one)."""
        from redis.exceptions import ResponseError

        try:
            await self.redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    # The workers' list --------------------------------------------------------------------------
    async def register(self, info: WorkerInfo) -> None:
        await self.redis.hset(WORKERS, info.id, info.model_dump_json())

    async def unregister(self, worker_id: str) -> None:
        await self.redis.hdel(WORKERS, worker_id)
        await self.redis.srem(DRAIN, worker_id)

    async def workers(self, stale_after_s: float) -> list[WorkerInfo]:
        """The workers that listed themselves within `stale_after_s`, by host then id; the others are
        struck off (a worker that was only stalled lists itself again at its next heartbeat)."""
        listed: dict[Any, Any] = await self.redis.hgetall(WORKERS)
        now = time.time()
        workers: list[WorkerInfo] = []
        unreadable: list[Any] = []
        for key, value in listed.items():
            try:
                workers.append(WorkerInfo.model_validate_json(value))
            except ValidationError:  # not a worker's listing (JSON, never loaded as code): struck off
                unreadable.append(key)
        if unreadable:
            logger.warning("refused %d entries on %s: not a worker's listing", len(unreadable), WORKERS)
            await self.redis.hdel(WORKERS, *unreadable)
        gone = [w.id for w in workers if now - w.seen > stale_after_s]
        if gone:
            await self.redis.hdel(WORKERS, *gone)
        live = (w for w in workers if w.id not in gone)
        return sorted(live, key=lambda w: (w.host, w.id))

    async def ask_drain(self, worker_ids: list[str]) -> None:
        """Ask workers to drain: each finishes what it runs, takes nothing new and exits."""
        if worker_ids:
            await self.redis.sadd(DRAIN, *worker_ids)

    async def drain_asked(self, worker_id: str) -> bool:
        asked: set[Any] = await self.redis.smembers(DRAIN)
        return worker_id.encode() in asked or worker_id in asked


class _Taker:
    """One worker's consumer on the stream: takes messages while it has a free slot, runs each, keeps
    its claims on them renewed, and moves due later messages onto the stream."""

    def __init__(self, queue: JobQueue, name: str, concurrency: int, handle: MessageHandler) -> None:
        self.queue, self.name, self.concurrency, self.handle = queue, name, concurrency, handle
        self.stop = anyio.Event()  # set: take no more messages; those running finish
        self.running: set[bytes] = set()  # the stream ids of the messages being run
        self._freed = anyio.Event()  # set when a message's run ends (a fresh one after each wait)
        self._next_sweep = 0.0  # when to look next for messages a dead worker left

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._renew)
            while not self.stop.is_set():
                try:
                    await self._take_some(tg)
                except REDIS_ERRORS as exc:  # Redis away for a moment: the jobs it runs go on meanwhile
                    logger.warning("the queue's Redis failed (%s); trying again", _first_line(exc))
                    await _sleep_until(self.stop, RETRY_S)
            while self.running:  # the renewal goes on until the last message's job ends
                self._freed = anyio.Event()
                await self._freed.wait()
            tg.cancel_scope.cancel()
        with suppress(*REDIS_ERRORS):  # its name stays listed in the group: harmless
            if not await self._left_pending():
                await self.queue.redis.xgroup_delconsumer(STREAM, GROUP, self.name)

    async def _take_some(self, tg: TaskGroup) -> None:
        await self._move_due()
        free = self.concurrency - len(self.running)
        if free <= 0:
            self._freed = anyio.Event()
            await _first(self._freed, self.stop)  # a slot frees when a message's jobs end
            return
        for message_id, fields in await self._take(free):
            job_id = _job_of(fields)
            if job_id is None:
                await self._refuse(message_id, fields)
                continue
            self.running.add(message_id)
            tg.start_soon(self._run_one, message_id, job_id)

    async def _take(self, free: int) -> list[tuple[bytes, dict[bytes, bytes]]]:
        """Messages a dead worker left (looked for every REDELIVERY/4), else new ones (waiting POLL_S)."""
        redis = self.queue.redis
        if time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + REDELIVERY.total_seconds() / 4
            idle_ms = int(REDELIVERY.total_seconds() * 1000)
            claimed = await redis.xautoclaim(STREAM, GROUP, self.name, idle_ms, "0-0", count=free)
            if claimed[1]:
                return [(mid, fields) for mid, fields in claimed[1] if fields is not None]
        read: Any = await redis.xreadgroup(
            GROUP, self.name, {STREAM: ">"}, count=free, block=int(POLL_S * 1000)
        )
        return [message for _stream, messages in read or [] for message in messages]

    async def _run_one(self, message_id: bytes, job_id: str) -> None:
        try:
            await self.handle(job_id)
        except Exception:  # a bug in running it: said, and the message is done (its job is the store's)
            logger.exception("the queue's message for job %s failed", job_id)
        try:
            await self._done(message_id)
        except REDIS_ERRORS as exc:  # left pending: redelivered later, it only starts waiting jobs
            logger.warning("the queue's Redis failed (%s) acknowledging a message", _first_line(exc))
        finally:
            self.running.discard(message_id)
            self._freed.set()

    async def _done(self, message_id: bytes) -> None:
        async with self.queue.redis.pipeline(transaction=True) as pipe:
            pipe.xack(STREAM, GROUP, message_id)
            pipe.xdel(STREAM, message_id)
            await pipe.execute()

    async def _refuse(self, message_id: bytes, fields: dict[bytes, bytes]) -> None:
        names = ", ".join(sorted(_text(name)[:40] for name in fields))
        logger.warning(
            "refused a message on %s (id %s, fields %s): not a job id, and a message carries a job id and"
            " nothing else; dropped unread (who else writes to this Redis?)",
            STREAM,
            _text(message_id),
            names,
        )
        await self._done(message_id)

    async def _move_due(self) -> None:
        """Move the later messages that are due onto the stream (two workers may both move one: a
        doubled message doubles no job)."""
        redis = self.queue.redis
        due: Any = await redis.zrangebyscore(LATER, "-inf", time.time(), start=0, num=MOVE_BATCH)
        for member in due:
            found = LATER_MEMBER.fullmatch(member.decode("ascii", "replace"))
            if found is None:
                logger.warning(
                    "refused a message on %s (%r): not a job id; dropped unread", LATER, member[:60]
                )
                await redis.zrem(LATER, member)
                continue
            async with redis.pipeline(transaction=True) as pipe:
                pipe.zrem(LATER, member)
                pipe.xadd(STREAM, {FIELD: found.group(1).encode()})
                await pipe.execute()

    async def _renew(self) -> None:
        """Keep this worker's claims on the messages it runs fresh, so none is redelivered while its
        job runs."""
        while True:
            await anyio.sleep(REDELIVERY.total_seconds() / 4)
            if self.running:
                with suppress(*REDIS_ERRORS):  # Redis away for a moment: the next renewal comes in time
                    mine: list[Any] = list(self.running)
                    await self.queue.redis.xclaim(STREAM, GROUP, self.name, 0, mine, justid=True)

    async def _left_pending(self) -> bool:
        pending = await self.queue.redis.xpending_range(STREAM, GROUP, "-", "+", 1, consumername=self.name)
        return bool(pending)


def _job_of(fields: dict[bytes, bytes]) -> str | None:
    """The job id a message carries, or None: one field, `job`, whose text is a job id."""
    if set(fields) != {FIELD}:
        return None
    text = fields[FIELD].decode("ascii", "replace")
    return text if JOB_ID.fullmatch(text) else None


async def _first(*events: anyio.Event) -> None:
    """Wait until any of `events` is set."""
    async with anyio.create_task_group() as tg:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        for event in events:
            tg.start_soon(wait, event)


async def _sleep_until(event: anyio.Event, seconds: float) -> None:
    with anyio.move_on_after(seconds):
        await event.wait()


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
