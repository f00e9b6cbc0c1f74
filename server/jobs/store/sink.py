"""The orchestrator's sink for one job: its reports written to the store (coordination/reports.py)."""

from __future__ import annotations

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
