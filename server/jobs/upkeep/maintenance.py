"""What a server does beside running jobs: on start, it prunes old finished jobs and removes containers
left by dead servers; while it serves, it heartbeats its own jobs (renewing their leases), takes the
cancel requests and steering notes other processes left for them, and takes over the jobs of servers
that died (jobs/upkeep/takeover.py).

All of it runs in the service's task group (jobs/service.py), but the watch loop, which runs on the
jobs' own loop beside them (jobs/run/job_thread.py); none of it touches a live server's jobs. `conclave gc`
prunes through `prune_jobs` too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping

import anyio
import anyio.to_thread

from conclave.errors import ConclaveError
from conclave.files.disk_budget import MB
from conclave.jobs.context.steering import Steering
from conclave.jobs.store.async_store import AsyncStore
from conclave.jobs.store.owners import process_alive
from conclave.jobs.store.sql import Store
from conclave.jobs.upkeep.pruning import GcReport, prune
from conclave.sandbox.engine import sweep
from conclave.settings import Settings

logger = logging.getLogger(__name__)
WATCH_S = 0.5  # how often the watch loop looks for other processes' cancel requests and notes


async def watch(
    store: AsyncStore,
    settings: Settings,
    owner_id: str,
    scopes: Mapping[str, anyio.CancelScope],
    steering: Steering,
    adopt: Callable[[], Awaitable[object]],
    abandon: Callable[[str], Awaitable[object]],
) -> None:
    """Heartbeat our jobs (renewing their leases), honour the cancel requests and notes other processes
    left in the store, take over the jobs of servers that died (`adopt`: jobs/upkeep/takeover.py) and drop
    ours that another server took over (`abandon`)."""
    last_beat = 0.0
    while True:
        for job_id in await store.cancel_requests(owner_id):
            if job_id in scopes:
                scopes[job_id].cancel()
        await steering.deliver_all()  # notes other processes left for our jobs
        if time.monotonic() - last_beat >= settings.heartbeat_s:
            await store.heartbeat(owner_id, settings.stale_after_s)
            last_beat = time.monotonic()
            # a job another server claimed while our lease had run out (we were stalled): it runs there
            for job_id in await store.lost(owner_id, list(scopes)):
                await abandon(job_id)
            await adopt()
        await anyio.sleep(WATCH_S)


async def prune_old_jobs(settings: Settings) -> None:
    """Prune old finished jobs once at start (CONCLAVE_GC_AUTO; `conclave gc` does it by hand)."""
    report = await prune_jobs(settings)
    if report.removed:
        logger.info("pruned old jobs: %s", report.text())


async def prune_jobs(
    settings: Settings, keep_days: float | None = None, max_mb: int | None = None, dry_run: bool = False
) -> GcReport:
    """Prune finished jobs (jobs/upkeep/pruning.py) by the settings' limits, or the ones given, in a worker
    thread."""

    def run() -> GcReport:
        store = Store.of(settings)  # its own connection: a transaction in a thread stays its own
        try:
            return prune(
                store,
                settings.jobs_root,
                keep_days=settings.gc_keep_days if keep_days is None else keep_days,
                max_bytes=(settings.gc_max_mb if max_mb is None else max_mb) * MB,
                dry_run=dry_run,
            )
        finally:
            store.close()

    return await anyio.to_thread.run_sync(run, abandon_on_cancel=True)


async def sweep_leftovers() -> None:
    """Remove sandbox containers left by servers that died (never a live server's)."""
    try:
        removed = await sweep(lambda _owner, pid: not process_alive(pid))
    except ConclaveError:
        return  # no Docker engine: nothing to sweep
    if removed:
        logger.info("removed %d leftover sandbox container(s): %s", len(removed), ", ".join(removed))
