"""`get_status`: a job's state, optionally waiting for it to finish."""

from __future__ import annotations

from typing import Annotated

from fastmcp import Context
from pydantic import Field

from conclave.jobs.read.views import JobView
from conclave.settings import MAX_WAIT_S
from conclave.tools._deps import caller, result, service
from conclave.tools._progress import ProgressReporter


async def get_status(
    job_id: Annotated[str, Field(description="The job_id that ask_team returned.")],
    ctx: Context,
    wait_seconds: Annotated[
        float,
        Field(
            ge=0,
            le=MAX_WAIT_S,
            description=f"Wait up to this long for the job to finish (0-{MAX_WAIT_S}); 0 returns at once.",
        ),
    ] = 0,
) -> JobView:
    """Show a job: its state, each agent's answers and votes, the tally, and when done the final answer.
    While it runs, `progress.leading` is the answer that would win if it stopped now (label, votes, check).

    With `wait_seconds` it returns as soon as the job finishes, or when the time is up, sending progress
    notifications as agents post and vote. While the job runs, call again (e.g. with wait_seconds=45);
    when it is done, read `result.answer`, and use `read_workspace` for the other answers and the transcript.
    """
    jobs, who = service(ctx), caller(ctx)
    if wait_seconds <= 0:
        return result(await jobs.lookup.view(job_id, caller=who))
    progress = ProgressReporter(ctx)
    await progress.start(await jobs.lookup.view(job_id, caller=who))
    return result(await jobs.wait(job_id, wait_seconds, progress, caller=who))
