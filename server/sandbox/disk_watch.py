"""The job's disk budget held during a command, not after it: a watcher that stops the command at the cap.

A bind-mounted workspace cannot be given a size limit without privileges (no loop mount, no project
quota on this host's ext4, and Docker's `--storage-opt size` bounds only the container's own layer, which
is read-only here). So the budget is kept by two means while a command runs (sandbox/container.py):
- the command runs under `ulimit -f` set to the room left: one file can never grow past it (the writer
  gets SIGXFSZ), which bounds the common case, one big write, exactly;
- this watcher polls, in its own thread, the filesystem's free space (one `statvfs`, every few ms) and,
  when the filesystem grew by more than the room left since the last measure, or at least every
  `MEASURE_EVERY_S`, measures the workspace with safe.py's bounded walk. Over the room (or over the
  walk's entry or depth caps, or below the host's free-space floor), it calls `stop`, which kills the
  command at once: the command user's processes by SIGKILL from the host (`kill_user_processes`, through
  the container's cgroup), then the container through the engine. Writes between a poll and the kill
  are the overshoot: bench/bench_disk.py measures it (bench/results/disk.json).
Nothing here needs more of the engine than the shared folder: the walk and `statvfs` read this side of
it, and where this host cannot see the container's processes (an engine in a VM or on another machine:
no cgroup of the container here) `kill_user_processes` signals none and the engine's kill does it alone
(bench/results/disk-shared-nothing.json).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from conclave.errors import TreeTooLarge
from conclave.files.walking import walk

POLL_S = 0.005  # between two statvfs calls with a budget
FLOOR_POLL_S = 0.05  # without one, only the host's free space is watched
MEASURE_EVERY_S = 0.5  # a full measure at least this often (another process's deletes can hide growth)
FREE_FLOOR = 512 * 1024 * 1024  # never let a command take the host's filesystem below this much free space


@dataclass
class Watched:
    """What the watcher saw: why it stopped the command (None: it did not), and the last size measured."""

    reason: str | None = None
    measured: int = 0
    measures: int = 0


def measure(root: Path) -> int:
    """The bytes of the regular files under `root` (by size), through the bounded no-follow walk."""
    total = 0
    for _, _, listed in walk(root):
        total += sum(entry.info.st_size for entry in listed if _regular(entry.info.st_mode))
    return total


def _regular(mode: int) -> bool:
    return (mode & 0o170000) == 0o100000


def _used(root: Path) -> int:
    info = os.statvfs(root)
    return (info.f_blocks - info.f_bfree) * info.f_frsize


def _free(root: Path) -> int:
    info = os.statvfs(root)
    return info.f_bavail * info.f_frsize


def watch(
    root: Path, room: int | None, stop: Callable[[str], None], done: threading.Event, floor: int = FREE_FLOOR
) -> Watched:
    """Poll until `done` is set; call `stop(reason)` once when the workspace outgrows `room` bytes (or its
    size at the start when that is more: a command may delete files) (None: no budget, only the
    free-space floor), or the host's free space falls below `floor`."""
    seen = Watched()
    floor = min(floor, _free(root) // 2)  # a host already short of space still lets small commands run
    baseline, last = _used(root), time.monotonic()
    known = measure(root) if room is not None else 0
    if room is not None:
        room = max(room, known)  # already over (budget shared with others): it may shrink, never grow
    while not done.wait(POLL_S if room is not None else FLOOR_POLL_S):
        reason = None
        if _free(root) < floor:
            reason = f"the host's disk is nearly full (under {floor // (1024 * 1024)} MB free)"
        elif room is not None:
            grown = _used(root) - baseline
            if known + grown > room or time.monotonic() - last > MEASURE_EVERY_S:
                try:
                    known = measure(root)
                except TreeTooLarge as exc:
                    reason = f"the workspace grew past the walk's caps ({exc.found})"
                baseline, last = _used(root), time.monotonic()
                seen.measured, seen.measures = known, seen.measures + 1
                if reason is None and known > room:
                    reason = (
                        f"the workspace reached {known / 2**20:,.1f} MB, past the {room / 2**20:,.1f} MB left"
                    )
        if reason is not None:
            seen.reason = reason
            stop(reason)
            return seen
    return seen


# Where a container's processes are listed on the host (cgroup v1 and v2, cgroupfs and systemd drivers).
CGROUP_PROCS = (
    "/sys/fs/cgroup/pids/docker/{id}/cgroup.procs",
    "/sys/fs/cgroup/docker/{id}/cgroup.procs",
    "/sys/fs/cgroup/system.slice/docker-{id}.scope/cgroup.procs",
)


def kill_user_processes(container_id: str, uid: int, passes: int = 3) -> int:
    """SIGKILL, from the host, every process of the container owned by `uid` (the command's user, never
    the keeper): microseconds, where a call to the engine takes tens of milliseconds of writes. Returns
    how many were signalled; 0 when the host cannot see or signal them (the engine's kill then does)."""
    path = next(
        (Path(p.format(id=container_id)) for p in CGROUP_PROCS if Path(p.format(id=container_id)).exists()),
        None,
    )
    killed = 0
    for _ in range(passes if path is not None else 0):
        try:
            pids = [int(line) for line in path.read_text().split()]  # type: ignore[union-attr]
        except (OSError, ValueError):
            return killed
        for pid in pids:
            try:
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    os.kill(pid, 9)
                    killed += 1
            except (OSError, ProcessLookupError):
                continue  # gone already, or not ours to signal
    return killed


class Watcher:
    """`watch` in a daemon thread for the span of one command: `start()`, then `finish()`."""

    def __init__(self, root: Path, room: int | None, stop: Callable[[str], None]) -> None:
        self._done = threading.Event()
        self.result = Watched()

        def run() -> None:
            try:
                self.result = watch(root, room, stop, self._done)
            except OSError:
                pass  # the workspace went away with the job: nothing left to watch
            except TreeTooLarge as exc:  # past the walk's caps before the command even ran
                self.result = Watched(reason=f"the workspace is past the walk's caps ({exc.found})")
                stop(self.result.reason or "")

        self._thread = threading.Thread(target=run, name="conclave-disk-watch", daemon=True)

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def finish(self) -> Watched:
        self._done.set()
        self._thread.join(5)
        return self.result
