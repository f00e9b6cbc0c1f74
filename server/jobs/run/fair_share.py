"""Fair share of a server's job slots: each caller waits in a line of its own, and a freed slot goes to
the lines in turn (round-robin), so one caller's burst never holds another caller's job behind it.

A job takes a slot at once when one is free, its caller runs fewer than `per_caller` jobs and nobody of
that caller waits before it. Otherwise it joins its caller's line; when a slot frees, it goes to the
waiting caller that runs the fewest jobs (among equals, the one whose job took a slot longest ago). So
a caller's job waits for the first slot that frees, not for another caller's whole burst.

Everything here lives on the jobs' loop (jobs/run/job_thread.py): no locks, one task at a time.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from conclave.jobs.store.sql import LinePlace
from conclave.settings import Settings


class FairShare:
    """At most `total` jobs at once, at most `per_caller` of one caller's, callers served in turn."""

    def __init__(self, total: int, per_caller: int) -> None:
        self.total, self.per_caller = total, per_caller
        self.running: Counter[str] = Counter()
        # when each caller with jobs running or waiting last took a slot (a count of grants), so among
        # callers running as many jobs the one served longest ago goes first
        self._served: dict[str, int] = {}
        self._grants = 0
        # callers with jobs waiting, each line oldest first
        self._lines: dict[str, deque[anyio.Event]] = {}

    @asynccontextmanager
    async def slot(self, caller: str) -> AsyncIterator[None]:
        """Hold one of the slots for `caller`'s job for the body's life."""
        if not self._lines.get(caller) and self._may_run(caller):
            self._take(caller)
        else:
            await self._wait(caller)
        try:
            yield
        finally:
            self._release(caller)

    def waiting(self, caller: str) -> int:
        """How many of `caller`'s jobs wait in its line."""
        return len(self._lines.get(caller, ()))

    def _may_run(self, caller: str) -> bool:
        return sum(self.running.values()) < self.total and self.running[caller] < self.per_caller

    async def _wait(self, caller: str) -> None:
        granted = anyio.Event()
        self._lines.setdefault(caller, deque()).append(granted)
        try:
            await granted.wait()
        except BaseException:
            if granted.is_set():  # granted as it was cancelled: hand the slot on
                self._release(caller)
            else:
                line = self._lines[caller]
                line.remove(granted)
                if not line:
                    del self._lines[caller]
                    if caller not in self.running:
                        self._served.pop(caller, None)
            raise

    def _take(self, caller: str) -> None:
        self.running[caller] += 1
        self._grants += 1
        self._served[caller] = self._grants

    def _release(self, caller: str) -> None:
        self.running[caller] -= 1
        if self.running[caller] <= 0:
            del self.running[caller]
            if caller not in self._lines:
                del self._served[caller]
        self._grant()

    def _grant(self) -> None:
        """Give free slots to the waiting lines in turn, skipping callers at their own share."""
        while sum(self.running.values()) < self.total:
            # the caller running the fewest jobs; among equals, the one served longest ago
            ready = [c for c in self._lines if self.running[c] < self.per_caller]
            if not ready:
                return
            caller = min(ready, key=lambda c: (self.running[c], self._served.get(c, 0)))
            line = self._lines[caller]
            line.popleft().set()
            self._take(caller)
            if not line:
                del self._lines[caller]


def queued_phase(place: LinePlace, caller: str, settings: Settings) -> str:
    """Why a queued job waits, and where it stands in its caller's line (get_status's `phase`)."""
    ahead = place.position - 1
    where = f"{ahead} of {caller}'s jobs ahead of it" if ahead else f"next in {caller}'s line"
    if settings.queue_url is not None:  # a front's job: the workers take the callers' lines in turn
        return (
            f"queued, {where}: waiting for a worker ({place.running} jobs running on the workers, "
            f"{place.caller_running} of them {caller}'s; the callers' lines are served in turn; its "
            "keys and its team's servers are checked where it runs)"
        )
    if place.caller_running >= settings.max_jobs_per_caller:
        why = (
            f"{caller} runs {place.caller_running} jobs, its share "
            f"(CONCLAVE_MAX_JOBS_PER_CALLER={settings.max_jobs_per_caller})"
        )
    elif place.running >= settings.max_jobs:
        why = (
            f"every slot is taken ({place.running} running, CONCLAVE_MAX_JOBS={settings.max_jobs}); "
            "freed slots go to the callers' lines in turn"
        )
    else:
        why = "a slot is free: starting"
    return f"queued, {where}: {why}"
