"""What every tool needs from the running server: the job service.

`conclave.app.server.create_app` puts it in the FastMCP lifespan context; the service itself is opened
outside the app (it owns the task group jobs run in) and only lent to it, so the lifespan never owns
anything and in-memory clients may come and go.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar, cast

from fastmcp import Context
from fastmcp.server.dependencies import get_access_token
from fastmcp.tools import ToolResult
from mcp.types import TextContent

from conclave.jobs.read.reader import WorkspacePage
from conclave.jobs.read.teams import TeamList
from conclave.jobs.read.views import JobView, structured
from conclave.tools._links import links

if TYPE_CHECKING:
    from conclave.jobs.service import JobService

DEPS_KEY = "conclave"
Shown = TypeVar("Shown", JobView, TeamList, WorkspacePage)


def service(ctx: Context) -> JobService:
    """The JobService the app was created with."""
    found = ctx.lifespan_context.get(DEPS_KEY)
    if found is None:
        raise RuntimeError("conclave tools must be registered by conclave.app.server.create_app")
    return found  # type: ignore[no-any-return]


def caller(ctx: Context) -> str:
    """Who is calling: an HTTP token's caller name, else the local user (stdio, in-memory). A caller sees
    only its own jobs (jobs/service.py); app/tokens.py names the callers."""
    from conclave.jobs.service import LOCAL

    token = get_access_token()
    return token.client_id if token is not None and token.client_id else LOCAL


def tool_result(view: JobView | TeamList | WorkspacePage) -> ToolResult:
    """The readable text block plus the structured view."""
    content: list[Any] = [TextContent(type="text", text=view.text())]
    if isinstance(view, JobView):
        return ToolResult(content=content + links(view), structured_content=structured(view))
    return ToolResult(content=content, structured_content=view)


def result(view: Shown) -> Shown:
    """`tool_result(view)`, typed as the view. Tools keep their view model as the return annotation, so
    FastMCP derives the output schema from it; what they return is the ToolResult, which FastMCP sends
    as it is: the one cast of the tools, here."""
    return cast(Shown, tool_result(view))
