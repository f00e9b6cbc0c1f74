"""The job store as a server uses it: the same methods (names and arguments) as jobs/store/sql.py, awaited,
so the event loop never waits on SQLite.

One pattern: every Store method a server calls has its awaitable twin here, in its lane (a read in a
reader thread, a write by the writer), declared in one line (`StoreRead`, `StoreWrite`) that takes the Store
method's own signature; a function of several reads that takes the Store (a view's
parts, a transcript: jobs/read/view_read.py, jobs/read/reader.py) runs whole through `read`, one thread hop.
Only code already in a worker thread uses `sync`.

Writes go through one writer: a task that takes every write queued since its last turn and runs them
in its one thread as one transaction (a batch: 16 busy jobs commit together, not one by one), then
wakes what waited on them. Writes keep the order they were queued in, whoever queued them. A job's
events (`record`) are queued without waiting, so reporting never holds a job up, nor lets another
job's turn in between (the budget and the turns see the same order as with no store at all); every
other write returns once it is committed. Reads run in threads of their own (jobs/store/lanes.py),
each with its own connection, beside the writes (WAL readers never wait for a writer). Every write to a job
wakes this
process's waiters on that job (`changed`): a long-poll here is woken, not polling; a job run by
another process is still polled (jobs/service.py).

aiosqlite was the other way: one thread per connection, serving one call at a time, so reads would
queue behind writes unless we kept several connections, and batches would still be ours to make.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, cast

import anyio
import anyio.to_thread

from conclave.coordination.reports import JobEvent, Progress
from conclave.jobs.store.lanes import Lane
from conclave.jobs.store.sql import Store

logger = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")
READERS = 4  # reads at once: each holds a connection of its own (jobs/store/connections.py)


@dataclass
class _Write:
    call: Callable[[], Any]
    job_id: str | None
    done: anyio.Event | None  # None: queued without waiting (a job's events)
    result: Any = None
    error: Exception | None = field(default=None)


class StoreRead(Generic[P, T]):
    """An AsyncStore method that runs the Store method of the same name in a reader thread (`read`): the
    Store method's own signature, awaited, so mypy checks every call's arguments and result."""

    def __init__(self, method: Callable[Concatenate[Store, P], T]) -> None:
        self.name = method.__name__

    def __set_name__(self, owner: type, name: str) -> None:
        if name != self.name:  # a twin has its Store method's name, or callers would not find it
            raise TypeError(f"the AsyncStore twin of Store.{self.name} must be named {self.name}, not {name}")

    def __get__(self, store: AsyncStore, owner: type | None = None) -> Callable[P, Awaitable[T]]:
        method = getattr(store.sync, self.name)  # the instance's: what a caller sees on `sync`

        async def call(*args: P.args, **kwargs: P.kwargs) -> T:
            return cast(T, await store.read(partial(method, *args, **kwargs)))

        return call


class StoreWrite(StoreRead[P, T]):
    """An AsyncStore method that runs the Store method of the same name by the writer (`write`), and
    wakes what waits on the job it names (its first argument, `job_id`; `named` reads the id from another
    first argument) unless `wakes` is False."""

    def __init__(
        self,
        method: Callable[Concatenate[Store, P], T],
        *,
        wakes: bool = True,
        named: Callable[[Any], str] = str,
    ) -> None:
        super().__init__(method)
        self.wakes, self.named = wakes, named

    def __get__(self, store: AsyncStore, owner: type | None = None) -> Callable[P, Awaitable[T]]:
        method = getattr(store.sync, self.name)

        async def call(*args: P.args, **kwargs: P.kwargs) -> T:
            first = kwargs.get("job_id", args[0] if args else None)
            job_id = self.named(first) if self.wakes and first is not None else None
            # the call bound first: its arguments may be named as `write`'s own are (job_id)
            return cast(T, await store.write(job_id, partial(method, *args, **kwargs)))

        return call


class AsyncStore:
    """Awaitable access to a `Store`; `store.sync` is the Store itself, for code running in a thread.
    Open it with `AsyncStore.open(store)`: its writer runs in there."""

    def __init__(self, store: Store, on_change: Callable[[str], None] | None = None) -> None:
        self.sync = store
        self._on_change = on_change
        self._readers = Lane(READERS, "conclave-store-reader")
        self._writer_thread = Lane(1, "conclave-store-writer")
        self._changes: dict[str, anyio.Event] = {}
        self._queue: list[_Write] = []
        self._queued = anyio.Event()

    @classmethod
    @asynccontextmanager
    async def open(
        cls, store: Store, on_change: Callable[[str], None] | None = None
    ) -> AsyncIterator[AsyncStore]:
        """Run the writer while the body runs; every queued write is committed before it ends.
        `on_change(job_id)` hears every committed write to a job (the jobs' store tells the serving
        loop's: jobs/run/job_thread.py)."""
        self = cls(store, on_change)
        body_error: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._writer)
            try:
                yield self
            except Exception as exc:  # the caller's error: re-raised below as itself, not in a group
                body_error = exc
            finally:
                with anyio.CancelScope(shield=True):
                    await self.write(None, lambda: None)  # after every write queued before it
                    tg.cancel_scope.cancel()
                    await self._readers.close()
                    await self._writer_thread.close()
        if body_error is not None:
            raise body_error

    # The seam: any Store method, in the right lane --------------------------------------------------
    async def read(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args)` in a reader thread (a method of `self.sync` that only reads)."""
        return await self._readers.run(lambda: fn(*args, **kwargs))

    async def write(self, job_id: str | None, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args)` by the writer, after every write queued before it; returns once committed."""
        queued = _Write(lambda: fn(*args, **kwargs), job_id, anyio.Event())
        self._put(queued)
        assert queued.done is not None
        await queued.done.wait()
        if queued.error is not None:
            raise queued.error
        return cast(T, queued.result)

    def post(self, job_id: str | None, fn: Callable[P, Any], *args: P.args, **kwargs: P.kwargs) -> None:
        """`fn(*args)` by the writer, in order, without waiting for it (a failure is logged)."""
        self._put(_Write(lambda: fn(*args, **kwargs), job_id, None))

    def changed(self, job_id: str) -> anyio.Event:
        """An event set at the next write to `job_id` made through this object (take it before reading)."""
        event = self._changes.get(job_id)
        if event is None:
            event = self._changes[job_id] = anyio.Event()
        return event

    def wake(self, job_id: str) -> None:
        """Wake what waits on `job_id`'s next write (on this store's loop)."""
        event = self._changes.pop(job_id, None)
        if event is not None:
            event.set()

    def _put(self, write: _Write) -> None:
        self._queue.append(write)
        self._queued.set()

    async def _writer(self) -> None:
        while True:
            await self._queued.wait()
            self._queued = anyio.Event()
            batch, self._queue = self._queue, []
            await self._writer_thread.run(partial(self._commit, batch), finish=True)  # a write is finished
            for write in batch:
                if write.job_id is not None:
                    self.wake(write.job_id)
                    if self._on_change is not None:
                        self._on_change(write.job_id)
                if write.done is not None:
                    write.done.set()
                elif write.error is not None:
                    logger.error("a job's report could not be stored: %r", write.error)

    def _commit(self, batch: list[_Write]) -> None:
        """In the writer's thread: the batch in one transaction; if it fails, each write in its own, so a
        bad write fails alone."""
        try:
            with self.sync.transaction():
                for write in batch:
                    write.result = write.call()
            return
        except Exception:
            for job_id in {write.job_id for write in batch if write.job_id is not None}:
                self.sync.forget(job_id)  # what was remembered of the rolled-back writes is void
        for write in batch:
            try:
                write.result, write.error = write.call(), None
            except Exception as exc:
                write.error = exc

    # The twins: each a Store method of the same name and signature, in its lane ----------------------
    create_job = StoreWrite(Store.create_job, named=lambda job: job.id)  # the job it stores
    set_files = StoreWrite(Store.set_files)
    job = StoreRead(Store.job)
    recent_jobs = StoreRead(Store.recent_jobs)
    rev = StoreRead(Store.rev)
    set_state = StoreWrite(Store.set_state)
    request_cancel = StoreWrite(Store.request_cancel)
    cancel_requests = StoreRead(Store.cancel_requests)
    queued_by_caller = StoreRead(Store.queued_by_caller)
    # leases and takeovers (jobs/upkeep/takeover.py)
    heartbeat = StoreWrite(Store.heartbeat, wakes=False)
    orphans = StoreRead(Store.orphans)
    lost = StoreRead(Store.lost)
    claim = StoreWrite(Store.claim)
    # the queue's jobs (jobs/queue.py, jobs/worker.py)
    take_queued = StoreWrite(Store.take_queued, wakes=False)
    cancel_queued = StoreWrite(Store.cancel_queued)
    running_by_owner = StoreRead(Store.running_by_owner)
    journaled = StoreRead(Store.journaled)
    events = StoreRead(Store.events)
    team_usage = StoreRead(Store.team_usage)
    answers = StoreRead(Store.answers)
    # conversations: follow-ups and steering notes (jobs/store/conversations.py)
    add_note = StoreWrite(Store.add_note)
    notes_after = StoreRead(Store.notes_after)

    async def journal(self, job_id: str, event_json: str) -> None:
        """Queued like `record`, and before the reports of what the event caused (one writer, in order)."""
        self.post(None, self.sync.journal, job_id, event_json)

    # What a running job reports, and reading it -----------------------------------------------------
    async def record(self, job_id: str, event: JobEvent, progress: Progress, phase: str | None) -> None:
        """Queued, not awaited: a job's reporting never waits for the disk (nor yields to other tasks).
        Waiters wake only when the job's `rev` moves (an event with a phase), as before they looked:
        a usage report is no reason to read the job again."""
        self.post(job_id if phase is not None else None, self.sync.record, job_id, event, progress, phase)
