"""`cancel_job`: stop a job; its answers so far stay readable."""

from __future__ import annotations

from typing import Annotated

from fastmcp import Context
from pydantic import Field

from conclave.jobs.read.views import JobView
from conclave.tools._deps import caller, result, service


async def cancel_job(
    job_id: Annotated[str, Field(description="The job_id that ask_team returned.")],
    ctx: Context,
) -> JobView:
    """Cancel a queued or running job. Answers posted so far stay readable with read_workspace.

    Cancelling a job that already ended changes nothing and returns it as it is.
    """
    return result(await service(ctx).cancel(job_id, caller=caller(ctx)))
