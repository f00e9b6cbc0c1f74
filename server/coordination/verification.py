"""Verification: the caller's check command (ask_team's `verify`) run on one answer's files.

Each check gets a fresh copy of the answer's snapshot (files/workspaces.py `check_copy`: the snapshot
stays immutable) and its own new container with run_command's confinement (sandbox/container.py: no
network whatever the team says, limits, a non-root user, processes reaped, output capped). With one
context path the project folder is /workspace; with several, /workspace holds one folder each. Checks
run beside the team's turns (a task of the orchestrator's task group), at most
`CONCLAVE_VERIFY_CONCURRENCY` at once on the server, each within `CONCLAVE_VERIFY_TIMEOUT_S`.
tests/test_verify.py runs them against a real Docker engine.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import anyio.to_thread

from conclave.config import Sandbox as SandboxSpec
from conclave.coordination.reports import LINE_CHARS, TAIL_LINES, Check
from conclave.errors import ConclaveError
from conclave.files.workspaces import Workspaces
from conclave.sandbox.container import CommandResult, Sandbox

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckRun:
    """A finished check, and its whole output (capped) for read_workspace's `verify/<label>`."""

    check: Check
    output: str


class Verifier:
    """Runs one job's check command on answers' snapshots."""

    def __init__(
        self,
        job_id: str,
        command: str,
        workspaces: Workspaces,
        spec: SandboxSpec,
        *,
        timeout_s: float,
        limiter: anyio.CapacityLimiter,
        sandbox_factory: Callable[[], Sandbox] = Sandbox,
    ) -> None:
        self.job_id, self.command, self.workspaces = job_id, command, workspaces
        self.spec = spec.model_copy(update={"network": "none"})  # a check never gets the network
        self.timeout_s, self._limiter, self._factory = timeout_s, limiter, sandbox_factory

    async def run(self, label: str) -> CheckRun:
        """Check answer `label`; a check that cannot run is an `error` check, never an exception."""
        async with self._limiter:
            try:
                result = await self._run(label)
            except ConclaveError as exc:
                return CheckRun(Check(status="error", error=str(exc)), f"the check could not run: {exc}")
            except Exception as exc:  # e.g. the disk filled while copying: this check fails, never the job
                logger.warning("the check of %s failed", label, exc_info=True)
                error = f"{type(exc).__name__}: {exc}"
                return CheckRun(Check(status="error", error=error), f"the check could not run: {error}")
        return CheckRun(summarize(result), f"$ {self.command}\n{result.as_text()}")

    async def _run(self, label: str) -> CommandResult:
        copy = await self.workspaces.check_copy(label)
        sandbox = self._factory()
        try:
            await sandbox.start(self.workspaces.rooted(copy), {}, self.job_id, f"check-{label}", self.spec)
            return await sandbox.exec(self.command, self.timeout_s)
        finally:
            with anyio.CancelScope(shield=True):
                await sandbox.stop()
                await anyio.to_thread.run_sync(shutil.rmtree, copy, True)


def summarize(result: CommandResult) -> Check:
    """A command's result as a check: passed only on exit code 0 within the time limit."""
    passed = result.exit_code == 0 and not result.timed_out
    lines = [line.strip() for line in f"{result.stdout}\n{result.stderr}".splitlines() if line.strip()]
    tail = [line if len(line) <= LINE_CHARS else line[: LINE_CHARS - 3] + "..." for line in lines[-TAIL_LINES:]]
    return Check(status="passed" if passed else "failed", exit_code=result.exit_code,
                 duration_s=round(result.duration_s, 2), timed_out=result.timed_out, tail=tail)
