"""The failing test to fix that the verify, follow-up and CLI-member tests hand their teams."""

from collections.abc import Mapping
from pathlib import Path

CALC = "def add(a, b):\n    return a - b\n"
TESTS = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
TASK = "Fix add() in calc.py so that the tests in test_calc.py pass."


def calc_project(parent: Path, more: Mapping[str, str] = {}) -> Path:
    """`parent/proj` with calc.py and its failing test, and `more` files (name: text) beside them."""
    root = parent / "proj"
    root.mkdir()
    for name, text in {"calc.py": CALC, "test_calc.py": TESTS, **more}.items():
        (root / name).write_text(text)
    return root
