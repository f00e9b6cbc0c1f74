"""The store's thread lanes (jobs/store/lanes.py): a cancelled read is left to end alone, a cancelled
write's caller waits until the write is done, and both run off the event loop's thread."""

from __future__ import annotations

import threading

import anyio
import pytest

from conclave.jobs.store.lanes import Lane

pytestmark = pytest.mark.anyio


async def test_a_cancelled_read_returns_at_once_and_a_cancelled_write_finishes() -> None:
    lane = Lane(2, "test-lane")
    release, ran = threading.Event(), threading.Event()
    loop_thread, threads = threading.get_ident(), []

    def blocked() -> str:
        threads.append(threading.get_ident())
        assert release.wait(30)
        ran.set()
        return "done"

    try:
        with anyio.fail_after(20):  # a bound on the test, not a timing assertion
            with anyio.move_on_after(0.05) as reading:
                await lane.run(blocked)  # abandoned: the caller goes on while the call still waits
            assert reading.cancelled_caught and not ran.is_set()
            release.set()
            with anyio.move_on_after(1):
                while not ran.is_set():
                    await anyio.sleep(0.01)
            release.clear()
            ran.clear()
            finished: list[str] = []
            with anyio.CancelScope() as writing:
                writing.cancel()  # cancelled before it even starts: it still runs to its end
                threading.Timer(0.05, release.set).start()  # whenever it comes, the caller waits for it
                finished.append(await lane.run(blocked, finish=True))
            assert finished == ["done"] and ran.is_set()
    finally:
        release.set()
        await lane.close()
    assert threads and loop_thread not in threads
