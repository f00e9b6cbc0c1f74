"""`read_workspace`: page through a job's answers, transcript and final answer."""

from __future__ import annotations

from typing import Annotated

from fastmcp import Context
from pydantic import Field

from conclave.jobs.reader import MAX_LIMIT
from conclave.tools._deps import result, service
from conclave.jobs.reader import WorkspacePage


async def read_workspace(
    job_id: Annotated[str, Field(description="The job_id that ask_team returned.")],
    ctx: Context,
    path: Annotated[
        str,
        Field(
            description='What to read: "" lists what there is; "transcript"; "answers/<label>" '
            '(e.g. "answers/B2"); "final".'
        ),
    ] = "",
    source: Annotated[
        str | None,
        Field(description='An answer label like "B2" reads that answer; "final" (for workspaces, later).'),
    ] = None,
    offset: Annotated[int, Field(ge=0, description="Start at this character (or entry, for a listing).")] = 0,
    limit: Annotated[
        int, Field(ge=1, le=MAX_LIMIT, description="At most this many characters (or entries) per page.")
    ] = 20_000,
) -> WorkspacePage:
    """Read what a job produced: every agent's answers, the transcript of turns and votes, the final answer.

    Start with path "" to list what can be read. Long texts come in pages: when `next_offset` is not
    null, call again with offset=next_offset. Works for running, finished and interrupted jobs.
    """
    return result(await service(ctx).read(job_id, path, source, offset, limit))
