"""What every tool needs from the running server: the job service.

`conclave.app.create_app` puts it in the FastMCP lifespan context; the service itself is opened
outside the app (it owns the task group jobs run in) and only lent to it, so the lifespan never owns
anything and in-memory clients may come and go (notes/mcp_api.md §9).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastmcp import Context
from fastmcp.tools import ToolResult
from mcp.types import TextContent

if TYPE_CHECKING:
    from conclave.jobs import JobService
    from conclave.views import JobView, TeamList, WorkspacePage

DEPS_KEY = "conclave"
MAX_WAIT_S = 50  # DESIGN "The MCP surface": client time limits are short (Codex: 60 s per call)


def service(ctx: Context) -> JobService:
    """The JobService the app was created with."""
    found = ctx.lifespan_context.get(DEPS_KEY)
    if found is None:
        raise RuntimeError("conclave tools must be registered by conclave.app.create_app")
    return found  # type: ignore[no-any-return]


def result(view: JobView | TeamList | WorkspacePage) -> Any:
    """The readable text block plus the structured view.

    Tools keep their view model as the return annotation, so FastMCP derives the output schema from
    it (notes §1); what they actually return is this ToolResult, hence `Any`.
    """
    from conclave.job_resources import links
    from conclave.views import JobView

    content: list[Any] = [TextContent(type="text", text=view.text())]
    if isinstance(view, JobView):
        content += links(view)
    return ToolResult(content=content, structured_content=view)
