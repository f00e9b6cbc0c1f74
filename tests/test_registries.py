"""One place per tool: the list the rest of the code reads (tools/catalog.py), and nothing else in the
package that spells it out again."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastmcp import Client

from conclave.app.server import create_app
from conclave.cli import install_claude, install_entries
from conclave.jobs.service import JobService
from conclave.settings import Settings
from conclave.tools.catalog import TOOLS, tool_names

ROOT = Path(__file__).resolve().parents[1]
SKILL = ROOT / "skills" / "conclave" / "SKILL.md"
CATALOG = ROOT / "tools" / "catalog.py"
CODE_SPAN = re.compile(r"`([a-z][a-z_]*)\b[^`]*`")


def package_modules() -> Iterator[Path]:
    for folder in ("server", "tools"):
        yield from sorted((ROOT / folder).rglob("*.py"))


def named(item: ast.expr) -> object:
    """What an item of a literal names: a string, a name (a function), or a call's first argument."""
    if isinstance(item, ast.Call) and item.args:
        item = item.args[0]
    if isinstance(item, ast.Constant):
        return item.value
    return item.id if isinstance(item, ast.Name) else None


def literals_naming(path: Path, names: set[str], at_least: int) -> Iterator[str]:
    """Each tuple, list, set or dict literal (dict keys) in `path` holding `at_least` of `names`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [key for key in node.keys if key is not None]
        else:
            continue
        found = {name for item in items if (name := named(item)) in names}
        if len(found) >= at_least:
            yield f"{path.relative_to(ROOT)}:{node.lineno} {sorted(found)}"


def test_every_tool_module_is_in_the_one_list_and_the_list_names_only_tool_modules() -> None:
    modules = {
        path.stem
        for path in (ROOT / "tools").glob("*.py")
        if not path.stem.startswith("_") and path != CATALOG
    }
    assert set(tool_names()) == modules
    assert len(set(tool_names())) == len(TOOLS)


def test_the_skill_names_exactly_the_tools_in_the_list() -> None:
    """A code span opening with a tool module's name is the skill naming that tool (`get_status {...}`)."""
    modules = {path.stem for path in (ROOT / "tools").glob("*.py") if not path.stem.startswith("_")}
    named = {word for word in CODE_SPAN.findall(SKILL.read_text(encoding="utf-8")) if word in modules}
    assert named == set(tool_names())


def test_no_module_but_the_catalog_lists_tool_names() -> None:
    """A second hand-kept list of tools (the server's, an installer's) drifts from the first."""
    names = set(tool_names())
    found = [hit for path in package_modules() if path != CATALOG for hit in literals_naming(path, names, 2)]
    assert found == []


@pytest.mark.anyio
async def test_the_server_and_the_installers_publish_and_approve_what_the_list_holds(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    async with (
        JobService.open(settings, environ={}) as service,
        Client(create_app(service, settings)) as client,
    ):
        listed = {tool.name: tool for tool in await client.list_tools()}
    assert list(listed) == list(tool_names())
    for tool in TOOLS:
        hints = listed[tool.name].annotations
        assert hints is not None and listed[tool.name].title == tool.title
        assert (
            hints.read_only_hint,
            hints.idempotent_hint,
            hints.open_world_hint,
            hints.destructive_hint,
        ) == (
            tool.read_only,
            tool.idempotent,
            tool.open_world,
            tool.destructive,
        )
    allowed = install_claude.claude_settings("project")[("permissions", "allow")]
    assert allowed == [f"mcp__conclave__{name}" for name in tool_names()]
    assert tuple(tool.name for tool in TOOLS if tool.approvable) == install_entries.CODEX_APPROVED
    assert set(install_entries.CODEX_APPROVED) == {"ask_team", "cancel_job", "steer_job"}
