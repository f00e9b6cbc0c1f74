"""A job's disk budget: the bytes all its agents' workspaces may hold together.

Host-side writes (`write_file`, `edit_file`) are checked before they happen and refused with a tool error
that says what to do. A command is given the room the budget leaves its workspace (`AgentDisk.room`) and
stopped as soon as it outgrows it (sandbox/disk_watch.py); the workspace is measured again after each
command and, once over, every further write is refused until files are deleted.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

MB = 1024 * 1024
FIX = "delete files you no longer need (keep scratch files in /tmp, which is not counted)"


class OverBudget(Exception):
    """A write would take the job's workspaces over their disk budget; the message says what to do."""


@dataclass
class DiskBudget:
    """Bytes per agent's workspace against one limit for the whole job (thread-safe: tools run in threads)."""

    limit: int
    used: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def total(self) -> int:
        with self._lock:
            return sum(self.used.values())

    def agent(self, letter: str) -> AgentDisk:
        return AgentDisk(self, letter)

    def measured(self, letter: str, size: int) -> None:
        with self._lock:
            self.used[letter] = size

    def check(self, old: int, new: int) -> None:
        """Refuse (OverBudget) a file of `old` bytes becoming `new` bytes when that ends over the limit."""
        after = self.total() - old + new
        if new > old and after > self.limit:
            raise OverBudget(
                f"this write would bring the job's workspaces to {after / MB:,.1f} MB, over the job's disk "
                f"budget of {self.limit / MB:,.0f} MB (CONCLAVE_JOB_DISK_MB); {FIX}"
            )

    def change(self, letter: str, old: int, new: int) -> None:
        with self._lock:
            self.used[letter] = self.used.get(letter, 0) - old + new

    def over(self) -> str | None:
        """A note for a model when the job is over budget (after a command), else None."""
        total = self.total()
        if total <= self.limit:
            return None
        return (
            f"the job's workspaces now hold {total / MB:,.1f} MB, "
            f"over its disk budget of {self.limit / MB:,.0f} MB "
            f"(CONCLAVE_JOB_DISK_MB): further writes are refused; {FIX}"
        )


@dataclass(frozen=True)
class AgentDisk:
    """One agent's view of its job's budget."""

    budget: DiskBudget
    letter: str

    def check(self, old: int, new: int) -> None:
        self.budget.check(old, new)

    def wrote(self, old: int, new: int) -> None:
        self.budget.change(self.letter, old, new)

    def measured(self, size: int) -> None:
        self.budget.measured(self.letter, size)

    def room(self) -> int:
        """The bytes this agent's workspace may hold now: the limit less what the other workspaces hold."""
        with self.budget._lock:
            others = sum(size for letter, size in self.budget.used.items() if letter != self.letter)
        return max(self.budget.limit - others, 0)
