"""The one list of the MCP tools Conclave publishes: each tool's name (its module and function), title and
hints. The server registers what it lists (app/server.py), the installers approve what it lists
(cli/install_claude.py, cli/install_entries.py), and the skill names what it lists.

Adding a tool: its module `tools/<name>.py` with an async function `<name>`, plus one `PublishedTool`
line below. Nothing here imports a tool's module, so the installers read the list without loading jobs/.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any


@dataclass(frozen=True)
class PublishedTool:
    """One MCP tool: `name` is both its module under conclave.tools and its function there. The hints are
    MCP's tool annotations (what a client may assume of a call)."""

    name: str
    title: str
    read_only: bool
    idempotent: bool
    open_world: bool = False
    destructive: bool = False

    @property
    def approvable(self) -> bool:
        """Whether a client asks before a call (Codex's approval, Claude Code's allow-list entry): every
        tool that changes something; a read-only one runs unasked."""
        return not self.read_only

    def function(self) -> Callable[..., Awaitable[Any]]:
        """The tool's function, its module imported now."""
        found: Callable[..., Awaitable[Any]] = getattr(
            import_module(f"conclave.tools.{self.name}"), self.name
        )
        return found


TOOLS = (
    PublishedTool("ask_team", "Ask a team of agents", read_only=False, idempotent=False, open_world=True),
    PublishedTool("get_status", "Get a job's status", read_only=True, idempotent=True),
    PublishedTool(
        "read_workspace", "Read a job's answers, transcript, diff and files", read_only=True, idempotent=True
    ),
    PublishedTool("cancel_job", "Cancel a job", read_only=False, idempotent=True),
    PublishedTool("list_teams", "List teams", read_only=True, idempotent=True),
    PublishedTool("steer_job", "Steer a running job", read_only=False, idempotent=False),
)


def tool_names() -> tuple[str, ...]:
    """Every published tool's name, in the list's order."""
    return tuple(tool.name for tool in TOOLS)
