"""The caller's files' runs kept across jobs: a check's `Baseline` made once per set of files, not per job.

Every verdict waits for the check command's run on the caller's files as they were (verdicts.py), and that run
costs what an answer's check costs: an answer that comes at once waits for it, or for the check slot it holds
(bench/bench_checks.py). What the run reports is decided by what it runs on and how: the files
(Workspaces.base_digest: every folder, path, mode and content, and the layout), the command, its time limit,
the check's confinement (the team's sandbox spec), the image the container runs (the engine's ID, not a name a
pull may move), the user the command runs as, the runner's environment (verification.py's CLEAN and
RUNNER_ENV) and this version's reading of summaries. A later job with all of those the same (another task on
the same project, a follow-up whose earlier winner was not applied) takes the kept run and says so in its
checks' output; looking it up at the job's start takes no check slot, as nothing runs. What a verdict takes
from it is how many tests ran (failed or not) and whether a module was missing, not which passed, so a flaky
test's outcome does not carry over. A run that timed out is never kept: a loaded machine is no property of the
files. Kept under the server's home (`<home>/check-baselines/<key>.json`, written by the server only, the
newest `KEEP`); a file that cannot be read is a miss, never an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from conclave import __version__
from conclave.config.models import SandboxSpec
from conclave.coordination.verdicts import Baseline, RunCounts

logger = logging.getLogger(__name__)
KEEP = 512  # files of a few hundred bytes each
FOLDER = "check-baselines"


class KeptRun(BaseModel):
    """A kept run on disk: what a verdict reads of it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    counts: RunCounts | None
    blocked: str | None = None  # why the command cannot run on those files (blocked_runs.py)


def baseline_key(
    *, files: str, command: str, timeout_s: float, spec: SandboxSpec, image_id: str, runner: str
) -> str:
    """The key of a run: everything that decides what the command reports on those files."""
    parts = {
        "version": __version__,
        "files": files,
        "command": command,
        "timeout_s": timeout_s,
        "spec": spec.model_dump(mode="json"),
        "image_id": image_id,
        "runner": runner,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


class KeptBaselines:
    """The server's kept runs, one JSON file each in `folder` (blocking: call on a worker thread)."""

    def __init__(self, folder: Path, keep: int = KEEP) -> None:
        self.folder, self.keep = folder, keep

    def get(self, key: str) -> Baseline | None:
        """The kept run for `key`, marked `reused`; None when there is none or it cannot be read."""
        try:
            kept = KeptRun.model_validate_json(self._path(key).read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValidationError, ValueError):
            logger.info("a kept baseline %s could not be read: the run is made again", key, exc_info=True)
            return None
        return Baseline(kept.counts, blocked=kept.blocked, reused=True)

    def put(self, key: str, baseline: Baseline) -> None:
        """Keep `baseline` for `key` (not one that timed out), then drop the oldest beyond `keep`."""
        if baseline.timed_out:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        kept = KeptRun(counts=baseline.counts, blocked=baseline.blocked)
        partial = self.folder / f".{key}.{os.getpid()}.tmp"
        partial.write_text(kept.model_dump_json())
        os.replace(partial, self._path(key))  # whole or absent, for a server reading it at once
        self._prune()

    def _prune(self) -> None:
        found = []
        for entry in os.scandir(self.folder):
            if entry.name.endswith(".json"):
                try:
                    found.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.path))
                except FileNotFoundError:  # pruned by another server at once
                    continue
        for _, path in sorted(found)[: max(0, len(found) - self.keep)]:
            Path(path).unlink(missing_ok=True)

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.json"
