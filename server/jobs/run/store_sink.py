"""The orchestrator's sink for one job: its reports written to the store (coordination/reports.py), and
its protocol journal (coordination/journal.py)."""

from __future__ import annotations

from conclave.coordination.journal import encode
from conclave.coordination.protocol_events import ProtocolEvent
from conclave.coordination.reports import JobEvent, Progress
from conclave.jobs.read.views import phase_of
from conclave.jobs.store.async_store import AsyncStore


class StoreSink:
    """The orchestrator's reports, written to the store."""

    def __init__(self, store: AsyncStore, job_id: str) -> None:
        self._store, self._job_id = store, job_id

    async def record(self, event: JobEvent, progress: Progress) -> None:
        await self._store.record(self._job_id, event, progress, phase_of(event))
        if event.kind == "presenting":
            await self._store.set_state(self._job_id, "presenting")


class StoreJournal:
    """The job's protocol events, appended to the store in the order the protocol took them."""

    def __init__(self, store: AsyncStore, job_id: str) -> None:
        self._store, self._job_id = store, job_id

    async def append(self, event: ProtocolEvent) -> None:
        await self._store.journal(self._job_id, encode(event))
