"""What a starting server tidies, beside the jobs: old finished jobs, and containers of servers that died.

Both run once in the service's task group (jobs/service.py) and never touch a live server's jobs;
`conclave gc` prunes through `prune_jobs` too.
"""

from __future__ import annotations

import logging

import anyio
import anyio.to_thread

from conclave.errors import ConclaveError
from conclave.files.budget import MB
from conclave.jobs.gc import GcReport, prune
from conclave.jobs.owners import process_alive
from conclave.jobs.store import Store
from conclave.sandbox.engine import sweep
from conclave.settings import Settings

logger = logging.getLogger(__name__)


async def prune_old_jobs(settings: Settings) -> None:
    """Prune old finished jobs once at start (CONCLAVE_GC_AUTO; `conclave gc` does it by hand)."""
    report = await prune_jobs(settings)
    if report.removed:
        logger.info("pruned old jobs: %s", report.text())


async def prune_jobs(
    settings: Settings, keep_days: float | None = None, max_mb: int | None = None, dry_run: bool = False
) -> GcReport:
    """Prune finished jobs (jobs/gc.py) by the settings' limits, or the ones given, in a worker thread."""

    def run() -> GcReport:
        store = Store(settings.db_path)  # its own connection: a transaction in a thread stays its own
        try:
            return prune(
                store, settings.home / "jobs",
                keep_days=settings.gc_keep_days if keep_days is None else keep_days,
                max_bytes=(settings.gc_max_mb if max_mb is None else max_mb) * MB, dry_run=dry_run,
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
