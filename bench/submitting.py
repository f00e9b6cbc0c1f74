"""Submitting a job through whichever server a bench imports: today's `submit(JobRequest)`, or a commit's
from before the request was one type (`submit(task, team, context_paths, verify=...)`), which the benches'
`--before` runs import in its place."""

from __future__ import annotations

from typing import Any


async def submit(service: Any, task: str, team: str, **fields: Any) -> Any:
    """`service.submit` of `task` for `team`, with the request's other `fields` (context_paths, verify...)."""
    try:
        from conclave.jobs.request import JobRequest
    except ImportError:
        return await service.submit(task, team, **fields)
    return await service.submit(JobRequest(task=task, team=team, **fields))
