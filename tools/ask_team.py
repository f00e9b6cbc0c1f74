"""`ask_team`: hand a task to a team of agents; returns the job, finished or still running."""

from __future__ import annotations

from typing import Annotated, Literal

from fastmcp import Context
from pydantic import BaseModel, ConfigDict, Field

from conclave.errors import InputError
from conclave.tools._deps import MAX_WAIT_S, result, service
from conclave.tools._progress import ProgressReporter
from conclave.views import JobView


class ContextPath(BaseModel):
    """A folder of the caller's project to copy into every agent's workspace."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="an absolute folder path on the machine running the server")
    permission: Literal["read", "write"] = Field(
        default="read", description="write: the winning changes may be applied back with apply=true"
    )


async def ask_team(
    task: Annotated[
        str,
        Field(description="The whole task, self-contained: the team sees nothing else (no chat history)."),
    ],
    ctx: Context,
    team: Annotated[
        str | None,
        Field(description="A preset name (see list_teams) or a team YAML file path; omit for the default."),
    ] = None,
    context_paths: Annotated[
        list[ContextPath] | None,
        Field(description="Project folders to give the agents (not available in this version; leave empty)."),
    ] = None,
    wait_seconds: Annotated[
        float,
        Field(ge=0, le=MAX_WAIT_S, description=f"Seconds to wait for the result (at most {MAX_WAIT_S})."),
    ] = 45,
    apply: Annotated[
        bool,
        Field(description="Apply the winner's changes to write-permission context_paths (not available yet)"),
    ] = False,
) -> JobView:
    """Ask a team of LLM agents (different models) to solve a task: each writes an answer, they read
    each other's anonymously, improve or vote, and the winner writes the final answer.

    Returns the job. If `state` is `completed`, `answer` holds the final answer. If it is still
    `queued`, `running` or `presenting`, call `get_status` with the `job_id` (it waits up to
    `wait_seconds` for the job to finish); `read_workspace` shows every answer and the transcript.
    """
    if context_paths:
        raise InputError("context_paths", [p.path for p in context_paths],
                         "workspaces are not available in this version; leave context_paths empty")
    if apply:
        raise InputError("apply", apply, "workspaces are not available in this version; leave apply false")
    jobs = service(ctx)
    # task length and emptiness, the team and its keys are checked by submit (the CLI shares it)
    view = await jobs.submit(task, team)
    progress = ProgressReporter(ctx)
    await progress.start(view)
    if wait_seconds > 0 and not view.done:
        view = await jobs.wait(view.job_id, wait_seconds, progress)
    return result(view)
