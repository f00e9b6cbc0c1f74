"""The CLI members' end-to-end task: a failing test to fix (tests/members/)."""

CALC = "def add(a, b):\n    return a - b\n"
TESTS = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
TASK = "Fix add() in calc.py so that the tests in test_calc.py pass."
