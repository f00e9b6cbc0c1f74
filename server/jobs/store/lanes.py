"""Worker threads for the store's calls, awaited in two turns of the event loop rather than four.

anyio's `to_thread.run_sync` costs four turns of the loop a call (its checkpoint, its limiter's, the
result's hand-back, the caller's wake-up). A loop busy with many jobs takes tens of milliseconds a turn,
and get_status waits for every one of them (bench/bench_store.py). asyncio's `run_in_executor` takes two
(the hand-back, the wake-up), and a pool of N threads is its own limiter. On an anyio backend without an
asyncio loop, calls go through anyio's threads as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import anyio
import anyio.to_thread

T = TypeVar("T")


class Lane:
    """`threads` worker threads that run store calls, each with its own reader connection
    (jobs/store/connections.py); `close` ends them."""

    def __init__(self, threads: int, name: str) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=name)
        self._limiter = anyio.CapacityLimiter(threads)

    async def run(self, call: Callable[[], T], *, finish: bool = False) -> T:
        """`call()` in one of the lane's threads. With `finish`, a cancel waits for it to end (a write
        is finished, never abandoned); without, a cancelled caller leaves it to end alone."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # another anyio backend
            return await anyio.to_thread.run_sync(call, limiter=self._limiter, abandon_on_cancel=not finish)
        if finish:
            with anyio.CancelScope(shield=True):
                return await loop.run_in_executor(self._pool, call)
        return await loop.run_in_executor(self._pool, call)

    async def close(self) -> None:
        """End the threads once their calls are done (an abandoned read may still be running)."""
        await anyio.to_thread.run_sync(self._pool.shutdown)
