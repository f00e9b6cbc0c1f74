"""`ask_team`: hand a task to a team of agents; returns the job, finished or still running.

Its parameters are `JobRequest`'s fields (jobs/request.py) and `wait_seconds`.
"""

from __future__ import annotations

from typing import Annotated

from fastmcp import Context
from pydantic import Field

from conclave.jobs.read.views import JobView
from conclave.jobs.request import JobRequest
from conclave.settings import MAX_WAIT_S
from conclave.tools._deps import caller, result, service
from conclave.tools._model_tool import takes_model
from conclave.tools._progress import ProgressReporter


class AskTeam(JobRequest):
    """ask_team's arguments: the job, and how long this call waits for it (not part of the job)."""

    wait_seconds: Annotated[
        float,
        Field(ge=0, le=MAX_WAIT_S, description=f"Seconds to wait for the result (at most {MAX_WAIT_S})."),
    ] = 45

    def job(self) -> JobRequest:
        """The request without the call's wait."""
        return JobRequest(**{name: getattr(self, name) for name in JobRequest.model_fields})


@takes_model(AskTeam)
async def ask_team(ctx: Context, call: AskTeam) -> JobView:
    """Ask a team of LLM agents (different models) to solve a task: each writes an answer, they read
    each other's anonymously, improve or vote, and the winner writes the final answer.

    Returns the job. If `state` is `completed`, `answer` holds the final answer. If it is still
    `queued`, `running` or `presenting`, call `get_status` with the `job_id` (it waits up to
    `wait_seconds` for the job to finish); `read_workspace` shows every answer and the transcript,
    and with context_paths the diff (`path="@diff"`) and every file the agents wrote. The first
    result carries an `estimate` of what the job may use. To go on from a finished job (its tests
    fail, a requirement changed), pass `follow_up=job_id`; to redirect a running one, use `steer_job`.
    """
    jobs = service(ctx)
    # everything is checked by submit (the CLI shares it): the task, the team and its keys, the context
    # paths, apply, verify (needs context paths and Docker) and the budgets (a cost budget needs prices)
    who = caller(ctx)
    view = await jobs.submit(call.job(), who)
    progress = ProgressReporter(ctx)
    await progress.start(view)
    if call.wait_seconds > 0 and not view.done:
        view = await jobs.wait(view.job_id, call.wait_seconds, progress, caller=who)
    return result(view)
