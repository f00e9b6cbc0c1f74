"""The failing test to fix that the verify, follow-up and CLI-member tests hand their teams, the check that
tells a fix, and the scripted agents that fix it (each its own way) and vote."""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.team import decide, vote_labels

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


CHECK = "pytest -q"  # the sandbox image carries pytest, so the check a Python project names works as is
FIXES = {"ann": "return a + b", "bob": "return a * b"}  # bob's "fix" fails the test: 2 * 3 != 5


def label_of(request: RecordedRequest, author: str) -> str | None:
    """The current label whose answer names `author` (answers say who wrote them)."""
    for label in vote_labels(request):
        section = request.text().split(f"## Answer {label}", 1)[-1].split("## Answer", 1)[0]
        if f"({author})" in section:
            return label
    return None


def agent(favourite: str) -> Any:
    """Edits calc.py its own way (cy leaves it as it is), answers, then always votes for `favourite`'s."""

    def respond(request: RecordedRequest) -> Reply:
        me = request.agent
        if label_of(request, me) is None:
            if me in FIXES and "replaced 1 occurrence" not in request.text():
                edit = {"path": "calc.py", "old_text": "return a - b", "new_text": FIXES[me]}
                return Reply(tool_calls=[("edit_file", edit)])
            return decide("new_answer", {"content": f"add() fixed in calc.py ({me})."}, request)
        target = label_of(request, favourite) or label_of(request, me)
        return decide("vote", {"answer": target, "reason": "looks right"}, request)

    return respond
