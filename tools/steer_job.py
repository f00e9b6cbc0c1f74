"""`steer_job`: leave a note for a running job's agents."""

from __future__ import annotations

from typing import Annotated

from fastmcp import Context
from pydantic import Field

from conclave.jobs.read.views import JobView
from conclave.tools._deps import caller, result, service


async def steer_job(
    job_id: Annotated[str, Field(description="The job_id of a running job (from ask_team).")],
    message: Annotated[
        str,
        Field(
            description="The note, self-contained, e.g. 'keep the public API unchanged' or 'stop "
            "exploring the caching idea'."
        ),
    ],
    ctx: Context,
) -> JobView:
    """Steer a running job: every agent sees the note from its next turn, and the votes cast so far are
    cleared (the picture changed); a turn that has only been thinking restarts with it.

    Returns the job; `notes` shows each note and whether the agents have it. A finished job cannot be
    steered: continue it with ask_team(follow_up=job_id, task=your note) instead.
    """
    return result(await service(ctx).steer(job_id, message, caller=caller(ctx)))
