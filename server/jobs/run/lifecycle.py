"""A job's life once admitted: it waits for a slot, copies its context paths, runs its orchestrator and
ends in one final state, whatever happens (cancelled, interrupted by the server stopping, a crash).

The service (jobs/service.py) starts `Lifecycle.run` on the jobs' loop (jobs/run/job_thread.py) for every
job it admits (jobs/admission/admit.py); everything here lives on that loop. The cancel scopes kept here are
how `cancel_job` and the watch loop (jobs/upkeep/maintenance.py) reach a job this process runs.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Awaitable, Callable

import anyio

from conclave.backends import preload
from conclave.config.models import Team
from conclave.coordination.agents import AgentFactory
from conclave.coordination.check_pool import CheckPool
from conclave.coordination.journal import decode
from conclave.coordination.limits import ProviderLimits
from conclave.coordination.orchestrator import Orchestrator, Resume, Shared
from conclave.coordination.protocol_events import Steer
from conclave.coordination.reports import CheckedEvent
from conclave.errors import ConclaveError
from conclave.files.job_folder import JobFolder
from conclave.jobs.admission.reach import check_reachable
from conclave.jobs.admission.team_shape import check_runnable
from conclave.jobs.context.files import JobFileSteps, job_files
from conclave.jobs.context.follow_ups import conversation_history
from conclave.jobs.context.steering import Steering
from conclave.jobs.environment import JobEnvironment
from conclave.jobs.run.fair_share import FairShare
from conclave.jobs.run.gc_freeze import Heap
from conclave.jobs.run.store_sink import StoreJournal, StoreSink
from conclave.jobs.store.async_store import AsyncStore
from conclave.jobs.store.sql import ACTIVE_STATES, JobRow, JobState

logger = logging.getLogger(__name__)


async def runnable_here(team: Team, jobs: JobEnvironment) -> None:
    """Refuse, before it runs, a job this process cannot run: a key, a CLI's login or image, the
    sandbox's network rule, and (when its agents call them) a team's own server that does not answer."""
    check_runnable(team, jobs.environ, jobs.settings.sandbox_network)
    if jobs.agents.probes:
        await check_reachable(team)


class Lifecycle:
    """Runs this process's jobs, each in its own cancel scope, at most `max_jobs` at once, shared fairly
    between callers (jobs/run/fair_share.py)."""

    def __init__(
        self,
        jobs: JobEnvironment,
        store: AsyncStore,
        factory: AgentFactory,
        steering: Steering,
        pool: CheckPool | None = None,
        *,
        runnable: Callable[[Team], Awaitable[None]] | None = None,
    ) -> None:
        """`factory`: `jobs.agents`' own, made on the jobs' loop (where the local model servers live)."""
        settings = jobs.settings
        self.jobs, self.settings, self.store = jobs, settings, store
        # what a team needs where its job runs (keys, engines, its servers): a front admitted it unchecked
        self._runnable = runnable
        self.steering = steering
        self.scopes: dict[str, anyio.CancelScope] = {}  # the jobs this process runs, by id
        self._abandoned: set[str] = set()  # ours until another server took them over
        self._files: dict[str, JobFileSteps] = {}  # the files of the jobs this process runs, by id
        # the slots, shared by the callers in turn, each waiting in its own line
        self.share = FairShare(settings.max_jobs, settings.max_jobs_per_caller)
        self._check_slots = anyio.CapacityLimiter(settings.verify_concurrency)  # verification containers
        self._check_pool = pool  # check containers started ahead of the jobs (coordination/check_pool.py)
        # how every job here makes its agents and retries, and the provider limits they all count against
        self._shared = Shared(factory, jobs.retry, ProviderLimits(settings.provider_concurrency))
        self._heap = Heap()  # a warm server's objects, kept out of the collector's walks

    def job_folder(self, job_id: str) -> JobFolder:
        return JobFolder(self.settings.jobs_root, job_id)

    async def preload(self) -> list[str]:
        """Load the hosted providers' SDKs before any job (backends/__init__.py `preload`), and keep what
        they made out of the collector's walks (jobs/run/gc_freeze.py); the providers loaded. A worker does it
        once before it takes jobs: its first jobs otherwise each wait seconds for the imports, on a busy
        machine, while every slot it has starts a job at once."""
        backends = await anyio.to_thread.run_sync(preload)
        for backend in backends:
            await backend.aclose()
        providers = [backend.provider for backend in backends]
        self._heap.settle(providers)
        return providers

    async def cancel(self, job_id: str) -> bool:
        """Cancel the job if this process runs it (on the jobs' loop); whether it did."""
        scope = self.scopes.get(job_id)
        if scope is not None:
            scope.cancel()
        return scope is not None

    async def abandon(self, job_id: str) -> None:
        """Stop running a job another server took over (its lease had run out: jobs/upkeep/takeover.py),
        writing nothing more of it: it is that server's now."""
        self._abandoned.add(job_id)
        files = self._files.get(job_id)
        if files is not None:  # that server rebuilds the job's working copies in the same folder
            files.release()
        await self.cancel(job_id)

    async def run(self, job_id: str, task: str, team: Team, caller: str, resume: bool = False) -> None:
        """The job from its queued state to its final one (started on the jobs' loop: jobs/run/job_thread.py).
        `resume`: a job this process took over from one that died (jobs/upkeep/takeover.py): its journal is
        replayed and only what was in flight runs again."""
        scope = self.scopes[job_id] = anyio.CancelScope()
        try:
            with scope:
                async with self.share.slot(caller):
                    await self._run(job_id, task, team, resume)
            if scope.cancelled_caught and job_id not in self._abandoned:
                with anyio.CancelScope(shield=True):
                    await self.store.set_state(job_id, "cancelled", "cancelled by the caller")
        except anyio.get_cancelled_exc_class():
            if job_id not in self._abandoned:
                with anyio.CancelScope(shield=True):
                    await self._end_if_active(job_id, "interrupted", "the server stopped while the job ran")
            raise
        except Exception as exc:  # a bug: fail this job, keep the server serving
            logger.exception("job %s crashed", job_id)
            await self._end_if_active(
                job_id, "failed", "failed: internal error", error=f"internal error: {exc!r}"
            )
        finally:
            self._abandoned.discard(job_id)
            self._files.pop(job_id, None)
            self.scopes.pop(job_id, None)
            self.steering.detach(job_id)
            self._heap.settle(agent.provider for agent in team.agents)

    async def _run(self, job_id: str, task: str, team: Team, resume: bool) -> None:
        first = await self._job(job_id)
        options = first.options
        timeout = team.coordination.timeout_s
        taken_over = await self._taken_over(first) if resume else None
        if taken_over is None and self._runnable is not None:
            try:
                await self._runnable(team)
            except ConclaveError as exc:
                await self._fail(job_id, f"checked where the job runs ({socket.gethostname()}): {exc}")
                return
        # the copy counts against the job's timeout; a resumed job's time so far too
        deadline = anyio.current_time() + timeout - (taken_over.elapsed if taken_over else 0.0)
        files = self._files[job_id] = job_files(self.job_folder(job_id), team, options, self.jobs)
        if not await self._copied(job_id, files, timeout):
            return
        row = await self._job(job_id)
        past, conversation_root = (
            await self.store.read(conversation_history, self.store.sync, row) if row.follow_up else ("", None)
        )
        try:
            await files.carry(self.store, row)
        except ConclaveError as exc:
            await self._fail(job_id, str(exc))
            return
        phase = "starting the agents" if taken_over is None else "resuming after its server stopped"
        await self.store.set_state(job_id, "running", phase)
        verifier = files.verifier(team, self._check_slots, self._check_pool)
        orchestrator = Orchestrator(
            job_id,
            task,
            team,
            StoreSink(self.store, job_id),
            self._shared,
            files=files.run_files,
            deadline=deadline,
            verifier=verifier,
            history=past,
            conversation_root=conversation_root,
            journal=StoreJournal(self.store, job_id),
            resume=taken_over,
        )
        taken = sum(isinstance(e, Steer) for e in taken_over.events) if taken_over else 0
        await self.steering.attach(job_id, orchestrator, taken)
        try:
            async with files.run_files.egress():
                result = await orchestrator.run()
            await files.collect(self.store, row, result.consensus)
        except ConclaveError as exc:
            await self._fail(job_id, str(exc))
        except ExceptionGroup as group:  # from the task groups that run the job, e.g. its sandboxes' starts
            errors = _messages(group)
            if errors is None:
                raise  # a bug among them: `run` fails the job as an internal error
            await self._fail(job_id, "; ".join(errors))
        else:
            state = "failed" if result.failed else "completed"
            await self.store.set_state(job_id, state, error="; ".join(result.errors.values()) or None)

    async def _taken_over(self, row: JobRow) -> Resume | None:
        """What a job taken over had done: its journal, each agent's usage and its time so far; None
        when it never started (it runs from the start)."""
        events = [decode(text) for text in await self.store.journaled(row.id)]
        if not events or row.started_at is None:
            return None
        usage = {agent.letter: agent.usage for agent in row.progress.agents} if row.progress else {}
        checked = await self.store.events(row.id, "checked")  # what each check found, as reported
        checks = {e.label: e.check for e in checked if isinstance(e, CheckedEvent)}
        return Resume(events, usage, max(0.0, time.time() - row.started_at), checks)

    async def _copied(self, job_id: str, files: JobFileSteps, timeout: float) -> bool:
        """Copy the context paths into the job folder, if any; False if that failed (the job says why)."""
        try:
            with anyio.move_on_after(timeout) as copying:
                await files.prepare(self.store)
        except ConclaveError as exc:
            await self._fail(job_id, str(exc))
            return False
        if copying.cancelled_caught:
            await self._fail(
                job_id,
                f"the job reached its timeout of {timeout:g} s while copying the context "
                "paths; give smaller folders or raise coordination.timeout_s",
            )
            return False
        return True

    async def _job(self, job_id: str) -> JobRow:
        row = await self.store.job(job_id)
        assert row is not None, job_id  # a job is deleted only once it is over (jobs/upkeep/pruning.py)
        return row

    async def _fail(self, job_id: str, error: str) -> None:
        await self.store.set_state(job_id, "failed", f"failed: {error}", error=error)

    async def _end_if_active(
        self, job_id: str, state: JobState, phase: str, error: str | None = None
    ) -> None:
        row = await self.store.job(job_id)
        if row is not None and row.state in ACTIVE_STATES:
            await self.store.set_state(job_id, state, phase, error=error)


def _messages(group: ExceptionGroup[Exception]) -> list[str] | None:
    """Each message of our errors in a task group's exceptions, once (every agent's sandbox may say the
    same); None when any of them is not ours."""
    ours, rest = group.split(ConclaveError)
    if ours is None or rest is not None:
        return None
    return list(dict.fromkeys(str(error) for error in _leaves(ours)))


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    return [
        leaf
        for error in group.exceptions
        for leaf in (_leaves(error) if isinstance(error, BaseExceptionGroup) else [error])
    ]
