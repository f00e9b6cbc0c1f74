"""Check containers started before the jobs that use them: a server's pool, handed out at a job's start.

A job's own warm check container (coordination/verification.py) starts beside its first turns, so an
answer that comes at once waited for the container (about 0.4-0.8 s here). The pool keeps `size`
containers per check spec started ahead (CONCLAVE_CHECK_POOL, by default as many as checks may run at
once, for the default sandbox from the server's start and for any other spec once a job has used it).
A job's Verifier takes what it would warm when it starts (`take`); from then on those containers are
the job's alone and are removed with the job, and the pool starts others in the background, a second
later (`TOP_UP_AFTER_S`). Each is started exactly as
the Verifier starts its own (`Sandbox.start` with the check spec: network none, the team's limits, a
non-root user), on an empty folder of its own, `<home>/check-pool/<pid>-<owner id>/slot-<n>`, that each
check refills in place (files/check_slots.py) as for the job's own containers. Containers are labelled
with the server's owner like every sandbox, so a server that dies leaves them to engine.py's sweep; its
folder is removed by the next server's pool (`reap_folders`), and by `close` on shutdown with every idle
container.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.to_thread

from conclave.config.models import SandboxSpec
from conclave.files.check_slots import make_slot
from conclave.files.removal import remove_tree
from conclave.files.safe import UidGid
from conclave.sandbox.container import Sandbox
from conclave.sandbox.engine import PROCESS_OWNER

logger = logging.getLogger(__name__)
JOB_LABEL = "check-pool"  # a pooled container's `conclave.job` label: it was started before any job
# How long after a `take` the pool waits before starting the next container: a container start takes
# the CPU the taker's first check needs (bench/bench_checks.py saw the first check's p50 1.5x with it).
TOP_UP_AFTER_S = 1.0


@dataclass(frozen=True)
class Box:
    """A warm check container and the folder it mounts at /workspace (`pooled`: the pool's folder, which
    the job that took it removes)."""

    sandbox: Sandbox
    slot: Path
    pooled: bool = False


def check_spec(spec: SandboxSpec) -> SandboxSpec:
    """The spec a check runs with: the team's sandbox, never the network."""
    return spec.model_copy(update={"network": "none"})


@dataclass
class _Shelf:
    """One spec's containers: ready ones, and how many are starting (`changed` is set when that moves)."""

    spec: SandboxSpec
    ready: list[Box] = field(default_factory=list)
    starting: int = 0
    changed: anyio.Event = field(default_factory=anyio.Event)

    def moved(self) -> None:
        """Wake whoever waits for a container of this shelf."""
        self.changed.set()
        self.changed = anyio.Event()


class CheckPool:
    """Keeps `size` check containers started per check spec; `keep` runs for the server's life."""

    def __init__(self, home: Path, owner: UidGid | None, size: int) -> None:
        self.size, self._owner = size, owner
        self.parent = home / "check-pool"
        self.root = self.parent / f"{PROCESS_OWNER.pid}-{PROCESS_OWNER.id}"
        self._shelves: dict[str, _Shelf] = {}
        self._starting: set[Box] = set()  # being started: removed on close too
        self._number = 0
        self._put, self._requests = anyio.create_memory_object_stream[tuple[str, bool]](math.inf)

    async def keep(
        self, default: SandboxSpec | None = None, is_dead: Callable[[int], bool] | None = None
    ) -> None:
        """Fill the pool (with `default` first) and top it up after each `take`, until cancelled; then
        remove every container it still holds. `is_dead(pid)` judges other servers' folders."""
        try:
            if is_dead is not None:
                await anyio.to_thread.run_sync(reap_folders, self.parent, is_dead)
            if self.size > 0 and default is not None:
                self._request(check_spec(default), taken=False)
            async with self._requests:
                async for key, taken in self._requests:
                    if taken:
                        await anyio.sleep(TOP_UP_AFTER_S)
                    await self._fill(self._shelves[key])
        finally:
            with anyio.CancelScope(shield=True):
                await self.close()

    async def take(self, spec: SandboxSpec) -> Box | None:
        """A started container for this check spec, now the caller's (it removes it and its folder), or
        None; one the pool is still starting is waited for (it started before the caller's job, which
        asks at its very start: coordination/verification.py `warm`). Either way the pool tops up for
        this spec in the background."""
        if self.size <= 0:
            return None
        wanted = check_spec(spec)
        shelf = self._shelves.get(wanted.model_dump_json())
        while shelf is not None and not shelf.ready and shelf.starting > 0:
            await shelf.changed.wait()
        box = shelf.ready.pop(0) if shelf is not None and shelf.ready else None
        self._request(wanted)
        return box

    def ready(self, spec: SandboxSpec) -> int:
        """How many containers for this check spec are started and waiting."""
        shelf = self._shelves.get(check_spec(spec).model_dump_json())
        return len(shelf.ready) if shelf is not None else 0

    async def close(self) -> None:
        """Remove every container the pool holds and its folder (safe to call twice)."""
        boxes = [box for shelf in self._shelves.values() for box in shelf.ready] + list(self._starting)
        for shelf in self._shelves.values():
            shelf.ready.clear()
            shelf.starting = 0  # what was starting goes too: no taker waits for it
            shelf.moved()
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for box in boxes:
                    tg.start_soon(box.sandbox.stop)
            await anyio.to_thread.run_sync(remove_tree, self.root)

    def _request(self, spec: SandboxSpec, *, taken: bool = True) -> None:
        key = spec.model_dump_json()
        self._shelves.setdefault(key, _Shelf(spec))
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):  # the server stops
            self._put.send_nowait((key, taken))

    async def _fill(self, shelf: _Shelf) -> None:
        """Start containers one after another until the shelf holds `size`; a failure ends this round
        (logged: the job's Verifier then starts its own, and says why if it cannot)."""
        while len(shelf.ready) + shelf.starting < self.size:
            self._number += 1
            slot = await anyio.to_thread.run_sync(make_slot, self.root, self._number, self._owner)
            box = Box(Sandbox(), slot, pooled=True)
            shelf.starting += 1
            self._starting.add(box)
            try:
                await box.sandbox.start(slot, {}, JOB_LABEL, f"pool-{self._number}", shelf.spec)
            except Exception:
                logger.info("a pooled check container did not start", exc_info=True)
                shelf.starting -= 1
                shelf.moved()
                self._starting.discard(box)
                with anyio.CancelScope(shield=True):
                    await box.sandbox.stop()
                    await anyio.to_thread.run_sync(remove_tree, slot)
                return
            # (cancelled while starting, the box stays in `_starting`, which `close` removes)
            shelf.starting -= 1
            self._starting.discard(box)
            shelf.ready.append(box)
            shelf.moved()


def reap_folders(parent: Path, is_dead: Callable[[int], bool]) -> list[str]:
    """Remove the pool folders of servers that are gone (their containers go by engine.py's sweep)."""
    removed = []
    for folder in parent.iterdir() if parent.is_dir() else ():
        pid = folder.name.split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and is_dead(int(pid)):
            remove_tree(folder)
            removed.append(folder.name)
    return removed
