"""Pruning old jobs: `conclave gc`, and at server start when CONCLAVE_GC_AUTO is on.

Only jobs that are over are pruned (never a queued, running or presenting one, whoever owns it): first
every one that finished more than `keep_days` ago, then the oldest while all job folders together hold
more than `max_bytes`. A pruned job loses its folder under jobs/ and its rows in the store.
"""

from __future__ import annotations

import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from conclave.errors import TreeTooLarge
from conclave.files.job_folder import JobFolder
from conclave.files.removal import remove_tree
from conclave.files.walking import walk
from conclave.jobs.read.views import plural
from conclave.jobs.store.sql import Store


@dataclass
class GcReport:
    """What a pruning pass removed (or, with dry_run, would remove)."""

    removed: list[str] = field(default_factory=list)
    freed_bytes: int = 0
    kept: int = 0
    kept_bytes: int = 0

    def text(self) -> str:
        verb = "removed"
        return (
            f"{verb} {plural(len(self.removed), 'job')}, {self.freed_bytes / 1e6:,.1f} MB; "
            f"kept {plural(self.kept, 'finished job')}, {self.kept_bytes / 1e6:,.1f} MB"
        )


def folder_bytes(path: Path) -> int:
    """The bytes of the regular files under `path` (links not followed; hard links counted once)."""
    total, seen = 0, set()
    try:
        for _, _, listed in walk(path):  # iterative, capped: a tree a command nested deep cannot crash gc
            for entry in listed:
                info = entry.info
                if stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) not in seen:
                    seen.add((info.st_dev, info.st_ino))
                    total += info.st_size
    except (OSError, TreeTooLarge):
        pass  # gone, or past the walk's caps: what was seen so far
    return total


def prune(
    store: Store,
    jobs_root: Path,
    *,
    keep_days: float,
    max_bytes: int,
    dry_run: bool = False,
) -> GcReport:
    """Remove finished jobs older than `keep_days`, then the oldest while over `max_bytes` (blocking)."""
    now = time.time()
    finished = store.finished_jobs()  # oldest first
    folders = {job_id: JobFolder(jobs_root, job_id).root for job_id, _ in finished}
    sizes = {job_id: folder_bytes(folder) for job_id, folder in folders.items()}
    total = sum(sizes.values())
    report = GcReport()
    for job_id, finished_at in finished:
        too_old = now - finished_at > keep_days * 86400
        if not too_old and total <= max_bytes:
            report.kept += 1
            report.kept_bytes += sizes[job_id]
            continue
        if not dry_run:
            store.delete_job(job_id)
            remove_tree(folders[job_id])
        report.removed.append(job_id)
        report.freed_bytes += sizes[job_id]
        total -= sizes[job_id]
    return report
