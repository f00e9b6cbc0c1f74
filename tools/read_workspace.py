"""`read_workspace`: page through what a job produced.

Answers, transcript, the final answer, the diff, files.
"""

from __future__ import annotations

from typing import Annotated

from fastmcp import Context
from pydantic import Field

from conclave.jobs.read.reader import MAX_LIMIT, WorkspacePage
from conclave.tools._deps import caller, result, service


async def read_workspace(
    job_id: Annotated[str, Field(description="The job_id that ask_team returned.")],
    ctx: Context,
    path: Annotated[
        str,
        Field(
            description='What to read: "" lists it all; "final" (the final answer); "transcript"; '
            '"answers/<label>" (e.g. "answers/B2"); "verify/<label>" (the whole output of that answer\'s '
            'check, with verify); "@diff" (the winner\'s changes as a patch, for jobs given context_paths); '
            'or a file path such as "src/app.py" (from the final files by default).'
        ),
    ] = "",
    source: Annotated[
        str | None,
        Field(
            description='For a file path or a file listing: "final" (the default: the winner\'s files) or '
            'an answer label like "B2" (the files as that answer left them).'
        ),
    ] = None,
    offset: Annotated[
        int, Field(ge=0, description="Start at this character of a text, or this entry of a listing.")
    ] = 0,
    limit: Annotated[
        int, Field(ge=1, le=MAX_LIMIT, description="At most this many characters (entries, for a listing).")
    ] = 20_000,
) -> WorkspacePage:
    """Read what a job produced: the final answer, every agent's answers, the transcript of turns and
    votes, and for a job given context_paths the patch of the winner's changes (`@diff`) and any file of
    the final files or of an answer's snapshot.

    Start with path "" to list what can be read. Long texts come in pages: when `next_offset` is not
    null, call again with offset=next_offset. Works for running, finished and interrupted jobs.
    """
    return result(await service(ctx).lookup.read(job_id, path, source, offset, limit, caller=caller(ctx)))
