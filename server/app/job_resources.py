"""MCP resources for a job's long texts, so results can link to them instead of inlining them.

    conclave://jobs/{job_id}/diff             the winner's patch (text/x-diff)
    conclave://jobs/{job_id}/transcript       every event of the job
    conclave://jobs/{job_id}/answers/{label}  one answer, e.g. B2

Each is read whole; `read_workspace` pages through the same texts for clients with small budgets.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastmcp import Context

from conclave.tools._deps import caller, service
from conclave.tools._links import ROOT


async def _read(ctx: Context, job_id: str, path: str) -> str:
    """The whole text: a resource read is not paged (JobLookup.read_whole gathers the pages)."""
    return (await service(ctx).lookup.read_whole(job_id, path, caller=caller(ctx))).content


async def job_diff(job_id: str, ctx: Context) -> str:
    """The winner's changes as a git-style patch."""
    return await _read(ctx, job_id, "@diff")


async def job_transcript(job_id: str, ctx: Context) -> str:
    """The job's events: turns, answers, votes, the result."""
    return await _read(ctx, job_id, "transcript")


async def job_answer(job_id: str, label: str, ctx: Context) -> str:
    """One answer of the job by its label."""
    return await _read(ctx, job_id, f"answers/{label}")


TEMPLATES: tuple[tuple[str, Callable[..., Awaitable[str]], str], ...] = (
    (f"{ROOT}/{{job_id}}/diff", job_diff, "text/x-diff"),
    (f"{ROOT}/{{job_id}}/transcript", job_transcript, "text/plain"),
    (f"{ROOT}/{{job_id}}/answers/{{label}}", job_answer, "text/plain"),
)
