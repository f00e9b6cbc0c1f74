"""The architecture holds in the code: calls point one way, no import cycles, modules stay small.

The layers, from the callers down (docs/ARCHITECTURE.md draws them):
    cli, app -> tools -> jobs -> coordination -> backends, files, sandbox
and every module may use the plain modules at the top (config, settings, errors). The protocol
imports nothing of ours.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"server": "conclave", "tools": "conclave.tools"}
MAX_LINES = 400
# A part may import the parts listed for it (and itself); the top-level modules are open to all.
ALLOWED: dict[str, set[str]] = {
    "cli": {"app", "web", "tools", "jobs", "coordination", "backends", "files", "sandbox", "members"},
    "app": {"web", "tools", "jobs"},
    "web": {"jobs"},  # the web view sits beside app and reads through jobs/
    "tools": {"jobs", "files"},
    "jobs": {"coordination", "backends", "files", "sandbox", "members"},
    "coordination": {"backends", "files", "sandbox", "members"},
    "members": {"backends", "sandbox"},  # coding-agent CLIs as members, run in the agent's sandbox
    "backends": set(),
    "files": {"backends"},  # the work tools describe themselves as backends.base.ToolSpec
    "sandbox": {"files"},  # the workspace is settled after each command through files/safe.py
}
SHARED = {"config", "settings", "errors", "__init__", "__main__"}


def modules() -> Iterator[tuple[str, Path]]:
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            yield ".".join([package, *parts]), path


def imports(path: Path, *, runtime_only: bool) -> set[str]:
    """The conclave modules `path` imports (with runtime_only, leaving out `if TYPE_CHECKING:` blocks)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped: set[int] = set()
    if runtime_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped |= {id(child) for stmt in node.body for child in ast.walk(stmt)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("conclave"):
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("conclave")}
    return found


def part(module: str) -> str:
    """The architectural part of a module: its subpackage under conclave, or its own name at the top."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "__init__"


def test_calls_point_one_way() -> None:
    known = dict(modules())
    wrong = []
    for module, path in known.items():
        mine = part(module)
        if mine == "__main__":
            continue  # `python -m conclave` runs the CLI
        for target in imports(path, runtime_only=False):
            if target not in known:
                continue  # a name imported from a module, not a module
            theirs = part(target)
            if theirs == mine or theirs in SHARED:
                continue
            if theirs not in ALLOWED.get(mine, set()):
                wrong.append(f"{module} imports {target}")
    assert not wrong, "imports against the direction of calls:\n" + "\n".join(wrong)


# the state, its events and per-agent records, and who wins
PROTOCOL = {"conclave.coordination.protocol", "conclave.coordination.protocol_events",
            "conclave.coordination.protocol_state", "conclave.coordination.tally"}


def test_the_protocol_imports_nothing_of_ours() -> None:
    known = dict(modules())
    for module in PROTOCOL:
        found = {
            name
            for name in imports(known[module], runtime_only=False)
            if not name.startswith(tuple(PROTOCOL))
        }
        assert found == set(), f"{module} imports {found}: the protocol must stay pure"


def test_no_import_cycles() -> None:
    known = dict(modules())
    graph = {m: {t for t in imports(p, runtime_only=True) if t in known and t != m} for m, p in known.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_modules_stay_under_the_line_budget() -> None:
    long = {m: n for m, p in modules() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"split these by responsibility (over {MAX_LINES} lines): {long}"


def test_every_subpackage_says_what_it_holds_in_its_first_line() -> None:
    for init in sorted([*(ROOT / "server").glob("*/__init__.py"), ROOT / "tools" / "__init__.py"]):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        first = doc.strip().splitlines()[0] if doc.strip() else ""
        assert first.endswith("."), (
            f"{init.relative_to(ROOT)} needs a docstring whose first line says what it holds"
        )
