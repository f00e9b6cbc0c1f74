"""A peer reads of another agent's answer only what the sandbox user could read of it at /peers/<letter>:
a file the author kept private (a login file copied with its 0600) reaches
no peer, by the host-side tools (`read_file` and `search` with `peer`, whose results go to the peer's
provider) or by the peer view mounted into containers (server/files/peer_access.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conclave.files.agent_tools import AgentTools
from conclave.files.contexts import ContextPath
from conclave.files.job_folder import JobFolder
from conclave.files.workspaces import Workspaces

pytestmark = pytest.mark.anyio
TOKEN = "sk-ant-oat01-" + "privatetoken" * 4


async def answered(tmp_path: Path) -> Workspaces:
    """A job of agents A and B where B answered with a shared file and a private one."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    ws = Workspaces(JobFolder(tmp_path, "job"))
    await ws.prepare([ContextPath(path=str(project))])
    await ws.create(["A", "B"])
    mine = ws.rooted(ws.agent("B"))
    (mine / "notes.md").write_text("shared notes\n")
    (mine / "creds.json").write_text(f'{{"accessToken": "{TOKEN}"}}\n')
    (mine / "creds.json").chmod(0o600)
    await ws.snapshot("B", "B1")
    await ws.publish("B", "B1")
    return ws


async def call(tools: AgentTools, name: str, **arguments: object) -> str:
    return await tools.handlers()[name](dict(arguments))


async def test_read_file_refuses_a_peers_private_file(tmp_path: Path) -> None:
    ws = await answered(tmp_path)
    tools = AgentTools(workspace=ws.rooted(ws.agent("A")), peers=lambda: ws.peer_view("A"))
    assert "shared notes" in await call(tools, "read_file", path="notes.md", peer="B")
    private = await call(tools, "read_file", path="creds.json", peer="B")
    assert private.startswith("Error:") and "private" in private and TOKEN not in private
    found = await call(tools, "search", pattern="oat01|shared", peer="B")
    assert "notes.md" in found and TOKEN not in found and "creds.json" not in found
    # its author reads its own private file as ever
    author = AgentTools(workspace=ws.rooted(ws.agent("B")), peers=lambda: ws.peer_view("B"))
    assert TOKEN in await call(author, "read_file", path="creds.json")


async def test_the_peer_view_mounted_in_containers_leaves_private_files_out(tmp_path: Path) -> None:
    """Whoever the server runs as: under a root server the kernel refuses the sandbox user these files
    at /peers (they are root's, 0600); under the sandbox user's own uid it would not, so they are not
    there at all."""
    ws = await answered(tmp_path)
    mount = ws.peer_mount("B")
    assert (mount / "notes.md").read_text() == "shared notes\n"
    assert not (mount / "creds.json").exists()


async def test_the_changes_a_cli_decision_is_shown_leave_private_files_out(tmp_path: Path) -> None:
    """A CLI member's decision prompt shows each answer's diff (coordination/cli_turns.py): of B's
    answer, its shared file, never the private one or its token."""
    ws = await answered(tmp_path)
    changes = await ws.changes("B1")
    assert "+shared notes" in changes and "notes.md" in changes
    assert "creds.json" not in changes and TOKEN not in changes
