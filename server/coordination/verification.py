"""Verification: the caller's check command (ask_team's `verify`) run on one answer's files.

A check runs the patch the caller reviews, not the answer's whole workspace: its fresh copy is the
caller's files at job start plus exactly what apply would write of the answer (files/check_copy.py;
what apply holds back, binaries and artefacts, is left out and named), with the caller's protected
files put back (files/protect.py, the team's `verify_protect`; the check names what it put back, to
voters and in the result). The command runs as in the user's terminal in the project folder, Python's
import path included (`RUNNER_ENV`: only the user site folder, which HOME=/workspace would put in the
project, is off): what could shadow the runner's own modules is protect.py's to put back, not the
import path's. It passes only on the runner's own summary
reporting at least the tests the caller's files' run reported, none failed (verdicts.py): that run,
the `Baseline`, is made once per job on the caller's files, from the job's start (`warm`, beside its
set-up and first turns), or taken as kept from an earlier job on the same files (baselines.py), and a
check waits for it only to give its verdict. When that run shows the command cannot run on the caller's
files at all (blocked_runs.py), `blocked` says why at once, for the job to report. It runs in a
warm check container of the job's, with run_command's confinement (sandbox/container.py: no network
whatever the team says, limits, a non-root user, processes reaped, output capped): the job's first
one is taken from the server's pool, started before the job (coordination/check_pool.py), else started
beside the first turns (`warm`) like the others it warms; another only when checks overlap; each is
removed with the job (`close`, also on cancel or failure). A container runs one check at a time, on
its own folder refilled in place with the check's copy (files/check_slots.py), its /tmp and /dev/shm
emptied first: nothing of one check reaches the next. With one context path the project folder is
/workspace; with several, /workspace holds one folder each. Checks run beside the team's turns (tasks
of the orchestrator's task group), at most `CONCLAVE_VERIFY_CONCURRENCY` at once on the server, each
within `CONCLAVE_VERIFY_TIMEOUT_S`. bench/bench_checks.py measures what a check costs beyond its
command.
"""

from __future__ import annotations

import json
import logging
import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread

from conclave.config.models import SandboxSpec
from conclave.coordination.baselines import KeptBaselines, baseline_key
from conclave.coordination.blocked_runs import project_modules
from conclave.coordination.check_pool import Box, CheckPool, check_spec
from conclave.coordination.reports import LINE_CHARS, TAIL_LINES, Check
from conclave.coordination.verdicts import Baseline, read_summary, shortfall
from conclave.errors import ConclaveError
from conclave.files.check_slots import make_slot, refill
from conclave.files.protect import DEFAULT_PROTECT, Protection, restore
from conclave.files.removal import remove_tree
from conclave.files.workspaces import CheckCopy, Workspaces
from conclave.sandbox.container import Sandbox
from conclave.sandbox.output import CommandResult

logger = logging.getLogger(__name__)
# Before each check, as the command's user: what an earlier check left where the container keeps it.
CLEAN = (
    "rm -rf /tmp/* /tmp/.[!.]* /tmp/..?* /dev/shm/* /dev/shm/.[!.]* /dev/shm/..?* 2>/dev/null; exec sh -c "
)
# Python as the check runs it: as in the user's terminal (a script imports the modules beside it,
# `python3 -m pytest` and `python3 -m unittest <module>` the project folder's), with no user site
# folder: HOME is /workspace, so its site folder would be a project folder whose .pth files run at every
# start-up, which a terminal's never is. A project module that would shadow the runner's own, in any
# folder Python or pytest puts on sys.path, is files/protect.py's to put back before the command runs.
RUNNER_ENV = {"PYTHONNOUSERSITE": "1"}


@dataclass(frozen=True)
class CheckRun:
    """A finished check, and its whole output (capped) for read_workspace's `verify/<label>`."""

    check: Check
    output: str


class Verifier:
    """Runs one job's check command on answers' snapshots, in the job's warm check containers."""

    def __init__(
        self,
        job_id: str,
        command: str,
        workspaces: Workspaces,
        spec: SandboxSpec,
        *,
        timeout_s: float,
        limiter: anyio.CapacityLimiter,
        protect: Sequence[str] | None = None,
        pool: CheckPool | None = None,
        kept: KeptBaselines | None = None,
    ) -> None:
        self.job_id, self.command, self.workspaces = job_id, command, workspaces
        self.spec = check_spec(spec)  # a check never gets the network
        self._pool = pool
        self.timeout_s, self._limiter = timeout_s, limiter
        # the protected paths' patterns, compiled once for the job's checks
        self._protection = Protection(DEFAULT_PROTECT if protect is None else protect, command=command)
        self._boxes: list[Box] = []  # every container started, for `close`
        # idle containers, and None for one `warm` could not start (its waiter then starts its own)
        self._put, self._idle = anyio.create_memory_object_stream[Box | None](math.inf)
        self._coming = self._waiting = self._started = 0  # being warmed; checks waiting for one; numbers
        self._baseline: Baseline | None = None  # the command's run on the caller's files, once made
        self._baseline_lock = anyio.Lock()
        self._kept = kept  # runs on the same files kept from earlier jobs (coordination/baselines.py)

    @property
    def concurrency(self) -> int:
        """How many checks may run at once on the server (CONCLAVE_VERIFY_CONCURRENCY)."""
        return int(self._limiter.total_tokens)

    async def warm(self, count: int = 1) -> None:
        """From the job's start (a task beside its set-up and first turns): start `count` check
        containers, as many as checks may run at once, so none waits for a container to start, and
        the caller's files' run (`baseline`) that every verdict needs. A failure is only logged: a
        check then starts its own container, or makes the run, and reports why it cannot."""
        while count > 0 and self._pool is not None:
            taken = await self._pool.take(self.spec)
            if taken is None:
                break
            self._boxes.append(taken)  # started before the job was (check_pool.py)
            self._put.send_nowait(taken)
            count -= 1
        self._coming += count
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._first_baseline)  # on a container already started when there is one
            for _ in range(count):
                tg.start_soon(self._warm_one)

    async def _first_baseline(self) -> None:
        try:
            async with self._baseline_lock:  # a kept run takes no check slot: nothing runs
                started = next((box for box in self._boxes if box.sandbox.container is not None), None)
                if self._baseline is None and self._kept is not None and started is not None:
                    _, self._baseline = await anyio.to_thread.run_sync(self._look_up, self._kept, started)
            if self._baseline is None:
                async with self._limiter:
                    await self.baseline()
        except Exception:
            logger.info(
                "the baseline check of %s failed; the first check tries again", self.job_id, exc_info=True
            )

    async def _warm_one(self) -> None:
        box = None
        try:
            box = await self._start()
        except Exception:
            logger.info("a check container of %s did not start ahead", self.job_id, exc_info=True)
        finally:
            self._coming -= 1
            self._put.send_nowait(box)

    async def close(self) -> None:
        """Remove every check container of the job (safe to call twice)."""
        boxes, self._boxes = self._boxes, []
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for box in boxes:
                    tg.start_soon(box.sandbox.stop)
            for box in boxes:  # the job's own slots go with its checks/ folder; a pooled one's here
                if box.pooled:
                    await anyio.to_thread.run_sync(remove_tree, box.slot)

    async def run(self, label: str) -> CheckRun:
        """Check answer `label`; a check that cannot run is an `error` check, never an exception."""
        async with self._limiter:
            try:
                result, copy, protected, baseline = await self._run(label)
            except ConclaveError as exc:
                return CheckRun(Check(status="error", error=str(exc)), f"the check could not run: {exc}")
            except Exception as exc:  # e.g. the disk filled while copying: this check fails, never the job
                logger.warning("the check of %s failed", label, exc_info=True)
                error = f"{type(exc).__name__}: {exc}"
                return CheckRun(Check(status="error", error=error), f"the check could not run: {error}")
        check = summarize(result, baseline).model_copy(update={"protected": protected, "held": copy.held})
        notes = [f"[{baseline.text()}]"]
        if copy.held:
            notes.append(f"[not in the check, as apply holds them back: {', '.join(copy.held)}]")
        if protected:
            notes.append(f"[put back before the check: {', '.join(protected)}]")
        return CheckRun(
            check, f"$ {self.command}\n" + "".join(f"{note}\n" for note in notes) + result.as_text()
        )

    async def baseline(self) -> Baseline:
        """The command's run on the caller's files as they were, made once (the caller holds a token
        of the limiter: the run counts as its own)."""
        async with self._baseline_lock:
            if self._baseline is None:
                self._baseline = await self._make_baseline()
            return self._baseline

    async def _make_baseline(self) -> Baseline:
        """The kept run on the same files (baselines.py) if there is one, else the run, then kept."""
        kept, key = self._kept, None
        box = await self._take()  # the key names the image its container runs
        if kept is not None:
            try:
                key, found = await anyio.to_thread.run_sync(self._look_up, kept, box)
            except BaseException:
                self._put.send_nowait(box)  # nothing ran in it
                raise
            if found is not None:
                self._put.send_nowait(box)
                return found
        result = (await self._exec(None, box))[0]
        baseline = Baseline.of(result, self.command, await anyio.to_thread.run_sync(self._modules))
        if kept is not None and key is not None:
            try:
                await anyio.to_thread.run_sync(kept.put, key, baseline)
            except OSError:  # e.g. the disk is full: this job has its run all the same
                logger.warning("the baseline of %s could not be kept", self.job_id, exc_info=True)
        return baseline

    @property
    def blocked(self) -> str | None:
        """Why the command cannot run on the caller's files (blocked_runs.py), once their run is made."""
        return self._baseline.blocked if self._baseline is not None else None

    def _modules(self) -> dict[str, str]:
        """The top-level modules of the caller's files, as the command sees the folders (blocking)."""
        modules: dict[str, str] = {}
        for context in self.workspaces.manifest().contexts:
            found = project_modules(self.workspaces.base_listing(context.name).files)
            if self.workspaces.root_name():
                modules |= found
            else:  # /workspace holds one folder per context path
                modules |= {name: f"{context.name}/{folder}".rstrip("/") for name, folder in found.items()}
        return modules

    def _look_up(self, kept: KeptBaselines, box: Box) -> tuple[str, Baseline | None]:
        """The key of the baseline run in `box`'s container (baselines.py: its image, its user), and the
        run kept for it if any (blocking: one worker thread trip for both)."""
        key = baseline_key(
            files=self.workspaces.base_digest(),
            command=self.command,
            timeout_s=self.timeout_s,
            spec=self.spec,
            image_id=box.sandbox.image_id,
            runner=f"{box.sandbox.uid}:{box.sandbox.gid} {CLEAN} {json.dumps(RUNNER_ENV, sort_keys=True)}",
        )
        return key, kept.get(key)

    async def _run(self, label: str) -> tuple[CommandResult, CheckCopy, list[str], Baseline]:
        # the answer's run first, beside the caller's files' run if that is still going (warm started
        # it with the job): only the verdict waits for the baseline, so a first answer that comes at
        # once costs one run, not two in a row
        result, copy, protected = await self._exec(label, await self._take())
        return result, copy, protected, await self.baseline()

    async def _exec(self, label: str | None, box: Box) -> tuple[CommandResult, CheckCopy, list[str]]:
        """Run the command in `box` on the check copy of answer `label` (the caller's files for None, as
        they were: nothing put back), made and moved into the container's folder first."""
        kept = False
        try:
            try:  # one worker thread trip for the copy and the move: under load each trip costs
                copy, protected = await anyio.to_thread.run_sync(
                    self._fill, box.slot, label, abandon_on_cancel=True
                )
            except Exception:
                kept = True  # nothing ran in it, and the next check's move empties its folder first
                raise
            command = CLEAN + shlex.quote(self.command)
            result = await box.sandbox.exec(command, self.timeout_s, environment=RUNNER_ENV)
            kept = True
            return result, copy, protected
        finally:
            if kept:
                self._put.send_nowait(box)
            else:  # cancelled or failed part way: this container is not trusted with another check
                with anyio.CancelScope(shield=True):
                    await box.sandbox.stop()

    async def _take(self) -> Box:
        """An idle container; else one `warm` is starting, if one is left for this check; else a new one."""
        try:
            box = self._idle.receive_nowait()
        except anyio.WouldBlock:
            box = None
            if self._coming > self._waiting:
                self._waiting += 1
                try:
                    box = await self._idle.receive()
                finally:
                    self._waiting -= 1
        return box if box is not None else await self._start()

    async def _start(self) -> Box:
        self._started += 1
        number = self._started  # taken before any await: checks may start containers at once
        checks, owner = self.workspaces.folder.checks, self.workspaces.agent_owner
        slot = await anyio.to_thread.run_sync(make_slot, checks, number, owner)
        box = Box(Sandbox(), slot)
        self._boxes.append(box)
        await box.sandbox.start(slot, {}, self.job_id, f"check-{number}", self.spec)
        return box

    def _fill(self, slot: Path, label: str | None) -> tuple[CheckCopy, list[str]]:
        """Make the check copy of `label` (workspaces.py), put the protected files back in an answer's,
        then move it into the container's folder `slot` (blocking)."""
        copy = self.workspaces.check_copy(label)
        try:
            protected = self._protect(copy) if label is not None else []
        except BaseException:
            remove_tree(copy.path)
            raise
        refill(slot, copy.path, self.workspaces.rooted(copy.path))
        return copy, protected

    def _protect(self, copy: CheckCopy) -> list[str]:
        """Put the caller's protected files back in the check copy, per context folder (files/protect.py)."""
        changed = []
        for context in self.workspaces.manifest().contexts:
            base, mine = self.workspaces.base / context.name, copy.path / context.name
            prefix = "" if self.workspaces.root_name() else f"{context.name}/"
            owner, written = self.workspaces.agent_owner, copy.written[context.name]
            listed = self.workspaces.base_listing(context.name)
            found = restore(
                mine, base, self._protection, owner, written=written, listed=listed, prefix=prefix
            )
            changed += [prefix + rel for rel in found]
        return changed


def summarize(result: CommandResult, baseline: Baseline) -> Check:
    """A command's result as a check (verdicts.py): passed on exit code 0 within the time limit and the
    runner's summary of at least the tests the caller's files' run reported, none failed; on the exit
    code alone only when that run printed no summary recognised."""
    counts, required = read_summary(result.stdout, result.stderr), baseline.required
    exited = result.exit_code == 0 and not result.timed_out
    reason = shortfall(counts, required) if exited and required is not None else None
    lines = [line.strip() for line in f"{result.stdout}\n{result.stderr}".splitlines() if line.strip()]
    tail = [
        line if len(line) <= LINE_CHARS else line[: LINE_CHARS - 3] + "..." for line in lines[-TAIL_LINES:]
    ]
    return Check(
        status="passed" if exited and reason is None else "failed",
        exit_code=result.exit_code,
        duration_s=round(result.duration_s, 2),
        timed_out=result.timed_out,
        tail=tail,
        tests=counts,
        required=required,
        verdict="exit_code" if required is None else "tests",
        reason=reason,
    )
