"""What `ask_team` checks before a job is queued, and the job it then stores.

Only checks and a quick store write, so ask_team returns at once: what the caller may name (access.py),
the queue's bounds (the caller's own line: jobs/run/fair_share.py), the team's keys and sandbox and its
own servers answering (team_shape.py, reach.py), verify and budgets shaped into the team, the context
paths' review (jobs/context/files.py) and an estimate of what the job may use (estimate.py). The context
paths are copied when the job gets its slot (jobs/run/lifecycle.py). A follow-up carries what
follow_ups.py says.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping

from conclave.config.destinations import Allowed
from conclave.config.presets import resolve_team
from conclave.errors import InputError, QueueFull, term
from conclave.files.contexts import parse_context_paths
from conclave.jobs.admission.access import Access
from conclave.jobs.admission.estimate import estimate
from conclave.jobs.admission.reach import check_reachable
from conclave.jobs.admission.team_shape import Ceilings, check_runnable, shape_team
from conclave.jobs.context.files import admit
from conclave.jobs.context.follow_ups import carried
from conclave.jobs.derived import JobOptions
from conclave.jobs.environment import JobEnvironment
from conclave.jobs.request import JobRequest
from conclave.jobs.store.async_store import AsyncStore
from conclave.jobs.store.new_job import NewJob
from conclave.jobs.store.sql import JobRow
from conclave.settings import Settings


def check_line(queued: Mapping[str, int], caller: str, settings: Settings) -> None:
    """Refuse a job whose caller's line is full, or, when the server's queue is, whose caller holds the
    longest line: a caller with fewer jobs waiting is admitted, so one caller's burst refuses no other."""
    mine = queued.get(caller, 0)
    if mine >= settings.max_queued_per_caller:
        raise QueueFull(mine, settings.max_queued_per_caller, caller)
    total = sum(queued.values())
    if total >= settings.max_queued and mine >= max(queued.values(), default=0):
        raise QueueFull(total, settings.max_queued)


def new_job_id() -> str:
    return "cj-" + secrets.token_hex(6)


class Admission:
    """The checks a job passes before it is queued, and the queued job's row."""

    def __init__(
        self, jobs: JobEnvironment, store: AsyncStore, access: Access, owner_id: str, *, runs_jobs: bool
    ) -> None:
        self.settings, self.store, self.access, self._environ = jobs.settings, store, access, jobs.environ
        self._owner_id = owner_id
        self._ceilings = Ceilings.of(jobs.settings)
        # refuse a team whose own server is down, when the agents call the servers a team names
        self._probe = jobs.agents.probes
        # a front (jobs run on workers) holds no provider key and may not reach the providers: what
        # needs them is checked where the job runs (jobs/run/lifecycle.py)
        self._runs_jobs = runs_jobs

    async def admit(self, request: JobRequest, caller: str, earlier: JobRow | None = None) -> NewJob:
        """Check `caller`'s request (with `earlier`: the job it follows up) and store it as a queued job."""
        task, apply = request.task, request.apply
        text = task.strip() if isinstance(task, str) else ""
        if not text:
            raise InputError("task", task, "give the team a non-empty task")
        if len(task) > self.settings.max_task_chars:
            raise InputError(
                "task",
                f"<{len(task)} characters>",
                f"keep the task under {self.settings.max_task_chars} characters; put large material in files",
            )
        if apply not in (False, True, "force"):
            raise InputError("apply", apply, 'use true (apply only with consensus), "force" or false')
        stored = None
        if earlier is not None:
            stored, request = carried(earlier, request)
        sources = parse_context_paths(request.context_paths or [], self.access.kept)
        for index, source in enumerate(sources):
            self.access.check_folder(f"context_paths[{index}].path", source.path, caller)
        if apply and not any(source.permission == "write" for source in sources):
            raise InputError("apply", apply, f"applying needs {term('context_write')}")
        check_line(await self.store.queued_by_caller(self._owner_id), caller, self.settings)
        self.access.check_team(request.team)
        allowed = Allowed.of(self.settings.key_destinations, self.settings.egress_allow)
        resolved = stored if stored is not None else resolve_team(request.team, self._environ, allowed)
        if self._runs_jobs:
            check_runnable(resolved, self._environ, self.settings.sandbox_network)
            if self._probe:
                await check_reachable(resolved)
        resolved = shape_team(resolved, request, has_context=bool(sources), ceilings=self._ceilings)
        options = await admit(sources, resolved) if sources else JobOptions()
        options.estimate = estimate(resolved, await self.store.team_usage(resolved.name))
        job = NewJob(
            new_job_id(),
            task,
            resolved,
            caller,
            request,
            options,
            follow_up=earlier.id if earlier is not None else None,
        )
        # the line counted again as the job is stored: the count above was read before the awaits since
        await self.store.create_job(
            job, os.getpid(), self._owner_id, admit=lambda queued: check_line(queued, caller, self.settings)
        )
        return job
