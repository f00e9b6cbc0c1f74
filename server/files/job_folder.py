"""A job's folder, `<jobs root>/<job_id>/`, and the name of everything in it; nothing else names them.

What each entry holds, and how it is made, is files/workspaces.py's docstring. Every tree here (base/,
start/, an agent's copy, a snapshot, final/, a check's copy) holds one folder per context path, by the
context's name: that is what a tree holds, not where it lies, so the trees' owners name it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["JobFolder"]


@dataclass(frozen=True)
class JobFolder:
    """The folder of job `job_id` under `jobs_root` (settings.jobs_root); names only, no I/O."""

    jobs_root: Path
    job_id: str

    @property
    def root(self) -> Path:
        return self.jobs_root / self.job_id

    @property
    def manifest(self) -> Path:
        """What the copy of the context paths recorded (a copy cut short leaves none)."""
        return self.root / "manifest.json"

    @property
    def base(self) -> Path:
        """The context paths as they were when the job started."""
        return self.root / "base"

    @property
    def start(self) -> Path:
        """A follow-up's first files: the earlier answer over base/ (files/carry.py)."""
        return self.root / "start"

    @property
    def agents(self) -> Path:
        return self.root / "agents"

    def agent(self, letter: str) -> Path:
        """Agent `letter`'s working copy."""
        return self.agents / letter

    @property
    def snapshots(self) -> Path:
        return self.root / "snapshots"

    def snapshot(self, label: str) -> Path:
        """The author's files at answer `label` (`B2`)."""
        return self.snapshots / label

    @property
    def peers(self) -> Path:
        return self.root / "peers"

    def peer(self, letter: str) -> Path:
        """What the other agents' containers mount read-only at /peers/<letter>."""
        return self.peers / letter

    @property
    def checks(self) -> Path:
        """Checks' copies and the folders their containers mount (files/check_slots.py)."""
        return self.root / "checks"

    def check(self, name: str) -> Path:
        return self.checks / name

    @property
    def final(self) -> Path:
        return self.root / "final"

    @property
    def patch(self) -> Path:
        """The winner's patch, written when the job ends."""
        return self.root / "diff.patch"

    @property
    def meta(self) -> Path:
        return self.root / "meta"

    def record(self, name: str) -> Path:
        """meta/<name>: when a tree was captured, or what a snapshot left out or hashed."""
        return self.meta / name

    @property
    def working(self) -> tuple[Path, ...]:
        """What goes when the job ends: the agents' copies, the peers' views, the checks' copies."""
        return (self.agents, self.peers, self.checks)
