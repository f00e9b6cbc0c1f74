"""The tests stay honest about time: what tests/test_orchestrator.py and tests/test_jobs.py were fixed for
(issue 19) cannot come back.

- No sleep orders a test's events: a sleep outside a polling `while` loop is allowed only with a
  `# sleep-ok: why` comment on its line (a gate orders events: tests/fakes/script.py's `Reply.gate`,
  or the import gate of tests/test_stdio_front.py).
- Every `while ... done` wait sits inside `anyio.fail_after`/`move_on_after`, so a hung job fails its test
  instead of hanging CI.
- No assert reads the clock (speed goes in bench/); a bound that is the behaviour under test (a wait that
  must last its `wait_seconds`) says so with `# wall-time: why` on the assert's line.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SLEEPS = {"time.sleep", "anyio.sleep", "asyncio.sleep", "trio.sleep"}
CLOCKS = ("monotonic(", "perf_counter(", "time.time(")
BOUNDS = ("fail_after", "move_on_after")


def sources() -> Iterator[tuple[Path, str, ast.Module]]:
    for path in sorted(TESTS.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        yield path, text, ast.parse(text)


def parents(tree: ast.Module) -> dict[int, ast.AST]:
    return {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def enclosing(node: ast.AST, up: dict[int, ast.AST]) -> Iterator[ast.AST]:
    while id(node) in up:
        node = up[id(node)]
        yield node


def where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(TESTS.parent)}:{getattr(node, 'lineno', '?')}"


def marked(text: str, node: ast.AST, marker: str) -> bool:
    """The marker is on the node's lines or on the comment line just above it."""
    lines = text.splitlines()[node.lineno - 2 : (node.end_lineno or node.lineno)]  # type: ignore[attr-defined]
    return any(marker in line for line in lines)


def test_no_sleep_orders_a_test() -> None:
    found = []
    for path, text, tree in sources():
        if path.parent.name == "fakes":
            continue  # a fake provider's scripted delay is its latency, not a test's ordering
        up = parents(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and ast.unparse(node.func) in SLEEPS):
                continue
            loop = next(
                (n for n in enclosing(node, up) if isinstance(n, (ast.While, ast.For, ast.AsyncFor))), None
            )
            polling = isinstance(loop, ast.While)
            if not polling and not marked(text, node, "# sleep-ok:"):
                found.append(f"{where(path, node)}: {ast.unparse(node)}")
    assert not found, (
        "sleeps that order events (open a gate instead, or say why with # sleep-ok:):\n" + "\n".join(found)
    )


def test_every_wait_for_a_job_is_bounded() -> None:
    found = []
    for path, _text, tree in sources():
        up = parents(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.While) and "done" in ast.unparse(node.test)):
                continue
            bounded = any(
                isinstance(outer, (ast.With, ast.AsyncWith))
                and any(bound in ast.unparse(item.context_expr) for item in outer.items for bound in BOUNDS)
                for outer in enclosing(node, up)
            )
            if not bounded:
                found.append(f"{where(path, node)}: while {ast.unparse(node.test)}")
    assert not found, "waits with no time limit (wrap them in anyio.fail_after):\n" + "\n".join(found)


def test_no_assert_reads_the_clock() -> None:
    found = []
    for path, text, tree in sources():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Assert)
                and any(clock in ast.unparse(node) for clock in CLOCKS)
                and not marked(text, node, "# wall-time:")
            ):
                found.append(f"{where(path, node)}: {ast.unparse(node)}")
    assert not found, "wall-time asserts (measure in bench/ instead):\n" + "\n".join(found)


def test_the_checks_see_what_they_look_for() -> None:
    """Each rule catches its own example: an empty report means clean tests, not a blind check."""
    sample = (
        "import anyio, time\n"
        "async def test_x(view):\n"
        "    await anyio.sleep(0.5)\n"
        "    while not view.done:\n"
        "        view = await view.wait()\n"
        "    started = time.monotonic()\n"
        "    assert time.monotonic() - started < 1\n"
    )
    tree = ast.parse(sample)
    up = parents(tree)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) in SLEEPS]
    assert calls and not any(isinstance(n, ast.While) for c in calls for n in enclosing(c, up))
    loops = [n for n in ast.walk(tree) if isinstance(n, ast.While) and "done" in ast.unparse(n.test)]
    assert loops and not any(isinstance(n, ast.With) for n in enclosing(loops[0], up))
    asserts = [n for n in ast.walk(tree) if isinstance(n, ast.Assert)]
    assert any(clock in ast.unparse(asserts[0]) for clock in CLOCKS)
