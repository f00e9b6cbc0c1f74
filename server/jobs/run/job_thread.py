"""The jobs' own event loop, in a thread of its own, so an MCP call never waits behind the jobs' work.

One event loop runs a turn by running every callback that is ready. With 16 jobs running, a turn is
whatever the 16 have ready (the provider SDKs building requests and parsing streamed chunks), often
tens of milliseconds, and one MCP call takes about 19 turns of the loop that serves it (the in-memory
or stdio framing, the tool, the store's thread hop): get_status waited for the jobs' bursts whole
(bench/bench_store.py). With the jobs on a loop of their own, the serving loop's turns hold only the
MCP work, and the two threads share the interpreter by its switch interval (a few milliseconds).

Two loops share the interpreter: a thread that makes a blocking call (a socket's, a select) lets the
other run, and waits for the switch interval to have it back (5 ms by default). The jobs' loop makes
hundreds of such calls a second, so while the loops take turns it is given 1 ms (`SWITCH_S`; 16 jobs
took x1.47-1.49 of one at 5 ms, x1.29-1.30 at 1 ms, in alternate rounds of bench/bench_store.py).

What crosses between the loops goes through `start` and `call` (a job started, a cancel, a note handed
over), in the order they were made; the jobs write through an AsyncStore of their own (its writer wakes
the serving loop's waiters: jobs/store/async_store.py `on_change`). Everything of the jobs' side (the
lifecycle, its limiters, steering, the watch loop, the local model servers) is built and used on the
jobs' loop only.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.abc
import anyio.to_thread

T = TypeVar("T")
SWITCH_S = 0.001  # the interpreter's switch interval while the jobs' loop runs beside the serving one


@dataclass
class _Call:
    fn: Callable[[], Awaitable[Any]]
    done: concurrent.futures.Future[Any] | None  # None: started, nobody waits for it


class JobThread:
    """An event loop in a thread of its own, running what `start` and `call` hand it, in order."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox: collections.deque[_Call] = collections.deque()
        self._posted: anyio.Event | None = None
        self._stop: anyio.Event | None = None
        self._error: BaseException | None = None  # what ended the jobs' loop, re-raised when it closes

    @classmethod
    @asynccontextmanager
    async def open(
        cls, setup: Callable[[], AbstractAsyncContextManager[T]], name: str = "conclave-jobs"
    ) -> AsyncIterator[tuple[JobThread, T]]:
        """Start the thread and enter `setup()` on its loop: what it gives is the jobs' side. When the
        body ends, every task started there is cancelled and awaited (jobs end `interrupted`, their
        last writes committed), then `setup()` is left, on the jobs' loop too."""
        self = cls()
        ready: concurrent.futures.Future[T] = concurrent.futures.Future()
        thread = threading.Thread(target=self._main, args=(setup, ready), name=name, daemon=True)
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, SWITCH_S))
        thread.start()
        try:
            value = await asyncio.wrap_future(ready)
        except BaseException:
            await anyio.to_thread.run_sync(thread.join)
            sys.setswitchinterval(switch)
            raise
        try:
            yield self, value
        finally:
            with anyio.CancelScope(shield=True):
                loop, stop = self._loop, self._stop
                assert loop is not None and stop is not None
                with contextlib.suppress(RuntimeError):  # the loop has closed already (its error follows)
                    loop.call_soon_threadsafe(stop.set)
                await anyio.to_thread.run_sync(thread.join)
                sys.setswitchinterval(switch)
                if self._error is not None:
                    raise self._error

    def _main(
        self, setup: Callable[[], AbstractAsyncContextManager[T]], ready: concurrent.futures.Future[T]
    ) -> None:
        try:
            anyio.run(self._serve, setup, ready, backend="asyncio")
        except BaseException as exc:  # handed to the serving loop, which re-raises it
            if not ready.done():
                ready.set_exception(exc)
            else:
                self._error = exc

    async def _serve(
        self, setup: Callable[[], AbstractAsyncContextManager[T]], ready: concurrent.futures.Future[T]
    ) -> None:
        self._posted, self._stop = anyio.Event(), anyio.Event()
        self._loop = asyncio.get_running_loop()
        async with setup() as value, anyio.create_task_group() as tg:
            tg.start_soon(self._dispatch, tg)
            ready.set_result(value)
            await self._stop.wait()
            tg.cancel_scope.cancel()

    async def _dispatch(self, tg: anyio.abc.TaskGroup) -> None:
        while True:
            assert self._posted is not None
            await self._posted.wait()
            self._posted = anyio.Event()
            while self._inbox:
                tg.start_soon(_run, self._inbox.popleft())

    def _post(self, call: _Call) -> None:
        """From the serving loop: queue `call` on the jobs' loop, without waiting for it."""
        assert self._loop is not None

        def put() -> None:
            self._inbox.append(call)
            assert self._posted is not None
            self._posted.set()

        self._loop.call_soon_threadsafe(put)

    def start(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run `fn(*args)` on the jobs' loop, in its task group; returns at once."""
        self._post(_Call(lambda: fn(*args), None))

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """`fn(*args)` on the jobs' loop, after everything handed over before it; its result."""
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._post(_Call(lambda: fn(*args), done))
        return await asyncio.wrap_future(done)


async def _run(call: _Call) -> None:
    """One call on the jobs' loop. It runs even if its caller stopped waiting (a cancel asked for is
    carried out); a started job's errors are the task group's, a call's go back to its caller."""
    if call.done is None:
        await call.fn()
        return
    try:
        value = await call.fn()
    except Exception as exc:
        if not call.done.cancelled():
            call.done.set_exception(exc)
        return
    except BaseException:  # cancelled: the jobs' loop is closing
        call.done.cancel()
        raise
    if not call.done.cancelled():
        call.done.set_result(value)
