"""What a command gave back (container.py): each output stream capped, and the result.

Of a stream the first and last halves are kept, the middle counted and cut.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from conclave.files.settling import Settled
from conclave.sandbox.disk_watch import Watched


class _Capped:
    """One output stream: the first and last halves of `cap` bytes kept, the middle counted and cut."""

    def __init__(self, cap: int, listener: Callable[[bytes], None] | None = None) -> None:
        self.cap, self.total, self.listener = cap, 0, listener  # `listener` hears every chunk, uncut
        self.head, self.tail = bytearray(), bytearray()

    def add(self, chunk: bytes | None) -> None:
        if not chunk:
            return
        if self.listener is not None:
            self.listener(chunk)
        self.total += len(chunk)
        room = self.cap // 2 - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        del self.tail[: max(0, len(self.tail) - self.cap // 2)]

    @property
    def cut(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def text(self) -> str:
        head, tail = self.head.decode(errors="replace"), self.tail.decode(errors="replace")
        if not self.cut:
            return head + tail
        return f"{head}\n[... {self.cut:,} bytes cut ...]\n{tail}"

    def note(self, stream: str) -> str | None:
        if not self.cut:
            return None
        kept = self.cap // 2
        return f"{stream}: {self.total:,} bytes, the middle {self.cut:,} cut (first and last {kept:,} kept)"


@dataclass(frozen=True)
class CommandResult:
    """What a command did; stdout and stderr are kept apart and capped."""

    exit_code: int | None  # None: the exec itself overran and the sandbox was restarted
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float
    notes: tuple[str, ...] = ()  # what was cut, what was killed
    workspace_bytes: int | None = None  # the workspace's size after the command (for the disk budget)

    def as_text(self) -> str:
        """A compact rendering for a model: exit code, notes, then both streams."""
        status = "timed out" if self.timed_out else f"exit code {self.exit_code}"
        parts = [f"[{status} after {self.duration_s:.1f} s]", *(f"[{note}]" for note in self.notes)]
        if self.stdout:
            parts += ["--- stdout ---", self.stdout.rstrip("\n")]
        if self.stderr:
            parts += ["--- stderr ---", self.stderr.rstrip("\n")]
        return "\n".join(parts)


def described(
    raw: tuple[int | None, _Capped, _Capped, Settled, Watched],
    duration: float,
    timeout_s: float,
    max_bytes: int | None,
) -> CommandResult:
    """A finished command's result, with notes on what killed it, what was cut and what was cleared."""
    exit_code, out, err, settled, watched = raw
    timed_out = exit_code == 137 and duration >= timeout_s * 0.95 and watched.reason is None
    notes = [note for note in (out.note("stdout"), err.note("stderr")) if note]
    if watched.reason is not None:
        notes.insert(
            0,
            f"killed: {watched.reason} (the job's disk budget, CONCLAVE_JOB_DISK_MB); "
            "the sandbox was restarted (/workspace kept, /tmp emptied); "
            "delete files you do not need",
        )
    elif max_bytes is not None and (exit_code == 153 or settled.total_bytes >= max_bytes):
        notes.insert(
            0,
            f"the workspace reached the {max_bytes / 2**20:,.1f} MB the job's disk budget "
            "leaves it (CONCLAVE_JOB_DISK_MB): a file was stopped there (SIGXFSZ); "
            "delete files you do not need",
        )
    elif timed_out:
        notes.insert(0, f"killed after {timeout_s:g} s (the timeout), with every process it started")
    elif exit_code == 137:
        notes.insert(0, "killed by SIGKILL: most likely out of memory (the sandbox's memory limit)")
    if settled.stripped:
        notes.append(f"setuid, setgid and world-write bits cleared on {settled.stripped} workspace entries")
    return CommandResult(
        exit_code, out.text(), err.text(), timed_out, duration, tuple(notes), settled.total_bytes
    )
