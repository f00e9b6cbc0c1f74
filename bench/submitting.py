"""Opening the job service and submitting a job through whichever server a bench imports: today's
(`JobService.serve` of a jobs' environment, `submit(JobRequest)`), or a commit's from before
(`JobService.open` with the variables and the retry as its own keywords; `submit(task, team,
context_paths, verify=...)` before the request was one type), which the benches' `--before` runs import
in its place."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any


async def submit(service: Any, task: str, team: str, **fields: Any) -> Any:
    """`service.submit` of `task` for `team`, with the request's other `fields` (context_paths, verify...)."""
    try:
        from conclave.jobs.request import JobRequest
    except ImportError:
        return await service.submit(task, team, **fields)
    return await service.submit(JobRequest(task=task, team=team, **fields))


def open_service(
    settings: Any, environ: Mapping[str, str], retry: Any = None, **options: Any
) -> AbstractAsyncContextManager[Any]:
    """The job service for the body's life, keys read from `environ`, retrying as `retry` says when given;
    `options` are the service's own (access, check_pool)."""
    from conclave.jobs.service import JobService

    if "environ" in inspect.signature(JobService.open).parameters:  # before the jobs' environment took them
        return JobService.open(settings, environ=environ, **({"retry": retry} if retry else {}), **options)
    from tests.fakes.environment import environment_of

    return JobService.serve(environment_of(settings, environ, retry), **options)


def store_job(store: Any, job_id: str, task: str, options: Any = None) -> None:
    """Write `task` straight to `store` as a queued job of this process's (team "bench", one member): a
    `NewJob` where the tree has one, the loose columns before it."""
    import os

    try:
        from tests.fakes.new_jobs import new_job  # the tree's NewJob, which older trees lack
    except ImportError:
        store.create_job(job_id, task, "bench", "{}", os.getpid(), "bench", options)
        return
    store.create_job(new_job(job_id, task, team="bench", options=options), os.getpid(), "bench")
