"""The team agents' work tools: what each does, and that no path leaves its root."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from conclave.coordination.turns import parse_json_tool_call
from conclave.files.agent_tools import MAX_MATCHES, AgentTools

pytestmark = pytest.mark.anyio


class RecordingSandbox:
    def __init__(self) -> None:
        self.commands: list[tuple[str, float]] = []

    async def exec(self, command: str, timeout_s: float) -> Any:
        self.commands.append((command, timeout_s))

        class Result:
            def as_text(self) -> str:
                return f"[exit code 0]\n--- stdout ---\nran {command}"

        return Result()


@pytest.fixture
def tools(tmp_path: Path) -> AgentTools:
    workspace, peer = tmp_path / "ws", tmp_path / "peer-b"
    (workspace / "proj").mkdir(parents=True)
    (workspace / "proj" / "a.py").write_text("one\ntwo\nthree\ntwo\n")
    (workspace / "proj" / "blob.bin").write_bytes(b"\x00\x01\x02")
    peer.mkdir()
    (peer / "notes.md").write_text("peer B's notes\n")
    (tmp_path / "secret.txt").write_text("outside")
    os.symlink(tmp_path / "secret.txt", workspace / "proj" / "link.txt")
    os.symlink(tmp_path, workspace / "escape")
    return AgentTools(workspace, peers=lambda: {"B": peer}, sandbox=RecordingSandbox())


async def call(tools: AgentTools, name: str, **args: Any) -> str:
    return await tools.handlers()[name](args)


async def test_read_with_line_numbers_and_ranges(tools: AgentTools) -> None:
    assert (
        await call(tools, "read_file", path="proj/a.py", start_line=2, end_line=3)
        == "     2| two\n     3| three"
    )
    assert "outside" in await call(tools, "read_file", path="proj/a.py", start_line=9)
    assert "binary" in await call(tools, "read_file", path="proj/blob.bin")


async def test_write_then_edit(tools: AgentTools) -> None:
    assert "wrote 6 bytes" in await call(tools, "write_file", path="proj/new/b.py", content="x = 1\n")
    assert (tools.workspace / "proj/new/b.py").read_text() == "x = 1\n"
    assert "replaced 1 occurrence" in await call(
        tools, "edit_file", path="proj/new/b.py", old_text="1", new_text="2"
    )
    assert (tools.workspace / "proj/new/b.py").read_text() == "x = 2\n"


async def test_edit_refuses_missing_and_ambiguous_text(tools: AgentTools) -> None:
    missing = await call(tools, "edit_file", path="proj/a.py", old_text="four", new_text="4")
    assert "not found" in missing and "exact text" in missing
    ambiguous = await call(tools, "edit_file", path="proj/a.py", old_text="two", new_text="2")
    assert "appears 2 times" in ambiguous and "replace_all" in ambiguous
    assert (tools.workspace / "proj/a.py").read_text() == "one\ntwo\nthree\ntwo\n"
    await call(tools, "edit_file", path="proj/a.py", old_text="two", new_text="2", replace_all=True)
    assert (tools.workspace / "proj/a.py").read_text() == "one\n2\nthree\n2\n"


async def test_list_and_search(tools: AgentTools) -> None:
    listing = await call(tools, "list_files", path="proj")
    assert "a.py (18 bytes)" in listing and "link.txt" not in listing  # links are not listed
    assert (
        await call(tools, "search", pattern=r"^t\w+$")
        == "proj/a.py:2: two\nproj/a.py:3: three\nproj/a.py:4: two"
    )
    assert "not a valid regular expression" in await call(tools, "search", pattern="(")
    many = tools.workspace / "many.txt"
    many.write_text("hit\n" * (MAX_MATCHES + 5))
    assert f"stopped at {MAX_MATCHES}" in await call(tools, "search", pattern="hit")


async def test_peers_are_readable_and_not_writable(tools: AgentTools) -> None:
    assert "peer B's notes" in await call(tools, "read_file", path="notes.md", peer="B")
    assert "notes.md" in await call(tools, "list_files", peer="B")
    assert "peer 'C' has no snapshot" in await call(tools, "read_file", path="x", peer="C")
    # write tools have no `peer`: a peer argument cannot be smuggled in
    assert "peer" not in next(s for s in tools.specs() if s.name == "write_file").parameters["properties"]


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("read_file", {"path": "../secret.txt"}),
        ("read_file", {"path": "/etc/passwd"}),
        ("read_file", {"path": "proj/link.txt"}),
        ("read_file", {"path": "escape/secret.txt"}),
        ("read_file", {"path": "../../secret.txt", "peer": "B"}),
        ("list_files", {"path": "escape"}),
        ("list_files", {"path": ".."}),
        ("search", {"pattern": "outside", "path": "escape"}),
        ("write_file", {"path": "../planted.txt", "content": "x"}),
        ("write_file", {"path": "escape/planted.txt", "content": "x"}),
        ("write_file", {"path": "/tmp/planted.txt", "content": "x"}),
        ("edit_file", {"path": "escape/secret.txt", "old_text": "outside", "new_text": "inside"}),
    ],
)
async def test_every_tool_refuses_paths_that_leave_the_root(tools: AgentTools, name: str, args: dict) -> None:
    result = await call(tools, name, **args)
    assert result.startswith("Error:") and ("outside the root" in result or "not allowed" in result), result
    root = tools.workspace.parent
    assert (root / "secret.txt").read_text() == "outside"
    assert not (root / "planted.txt").exists() and not Path("/tmp/planted.txt").exists()


async def test_run_command_goes_to_the_sandbox_with_a_bounded_timeout(tools: AgentTools) -> None:
    assert "ran pytest -q" in await call(tools, "run_command", command="pytest -q", timeout_s=30)
    assert "timeout_s" in await call(tools, "run_command", command="sleep 1", timeout_s=10_000)
    assert tools.sandbox.commands == [("pytest -q", 30.0)]  # type: ignore[union-attr]


async def test_no_sandbox_means_no_command_tool(tmp_path: Path) -> None:
    plain = AgentTools(tmp_path, peers=dict)
    assert "run_command" not in {spec.name for spec in plain.specs()} | set(plain.handlers())


def test_json_mode_tool_calls_are_parsed() -> None:
    offered = ("read_file", "write_file")
    call = parse_json_tool_call(
        '{"action": "call_tool", "tool": "read_file", "arguments": {"path": "a"}}', offered
    )
    assert call is not None and call.name == "read_file" and call.arguments == {"path": "a"}
    broken = parse_json_tool_call('{"action": "call_tool", "tool": "read_file", "arguments": "a"}', offered)
    assert broken is not None and broken.error
    assert parse_json_tool_call('{"action": "vote", "answer": "A1"}', offered) is None
    assert parse_json_tool_call('{"action": "call_tool", "tool": "read_file"}', ()) is None  # steps used up


async def test_with_several_project_folders_writes_outside_them_are_refused(tmp_path: Path) -> None:
    for name in ("api", "web"):
        (tmp_path / name).mkdir()
    tools = AgentTools(tmp_path, peers=dict, folders=("api", "web"))
    refused = await call(tools, "write_file", path="notes.md", content="lost?\n")
    assert (
        refused.startswith("Error:") and "api/, web/" in refused and "outside the project folders" in refused
    )
    assert not (tmp_path / "notes.md").exists()
    refused = await call(
        tools, "write_file", path="docs/notes.md", content="x"
    )  # a new top folder: outside too
    assert "outside the project folders" in refused and not (tmp_path / "docs").exists()
    assert (await call(tools, "write_file", path="web/notes.md", content="kept\n")).startswith("wrote")
    assert (tmp_path / "web" / "notes.md").read_text() == "kept\n"
    # with one project folder the workspace IS that folder: anywhere goes
    alone = AgentTools(tmp_path / "api", peers=dict)
    assert (await call(alone, "write_file", path="notes.md", content="x")).startswith("wrote")
