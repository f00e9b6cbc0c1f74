"""A check's result in words (what voters and the view see) and a check that cannot run, without Docker."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from conclave.config.models import SandboxSpec
from conclave.coordination.blocked_runs import project_modules, why_blocked
from conclave.coordination.prompts import turn_prompt
from conclave.coordination.reports import Check, ShownAnswer
from conclave.coordination.verdicts import Baseline, RunCounts, read_summary
from conclave.coordination.verification import Verifier, summarize
from conclave.files.job_folder import JobFolder
from conclave.files.workspaces import Workspaces
from conclave.sandbox.output import CommandResult

NO_SUMMARY = Baseline(None)  # the original files' run printed no summary: the exit code decides
ONE_TEST = Baseline(read_summary("1 failed in 0.05s\n", ""))


def test_a_result_becomes_a_check() -> None:
    failed = summarize(
        CommandResult(1, "..F\n" + "x" * 500 + "\n\nFAILED (failures=1)\n", "warn\n", False, 3.14159),
        NO_SUMMARY,
    )
    assert failed.status == "failed" and failed.exit_code == 1 and failed.duration_s == 3.14
    assert failed.tail[-1] == "warn" and len(failed.tail[-3]) == 200 and failed.tail[-3].endswith("...")
    assert failed.text() == "failed (exit 1): warn"
    assert summarize(CommandResult(0, "OK\n", "", False, 3.14), NO_SUMMARY).text() == (
        "passed in 3.1 s (by its exit code: the original files' run printed no test summary)"
    )
    assert (
        summarize(CommandResult(137, "", "", True, 120.2), ONE_TEST).text() == "failed: timed out after 120 s"
    )
    assert summarize(CommandResult(None, "", "", True, 130.0), ONE_TEST).status == "failed"  # an overrun exec
    assert Check(status="running").text() == "running"
    assert Check(status="error", error="no Docker").text() == "could not run: no Docker"


def test_a_pass_needs_the_runners_summary_of_at_least_the_original_tests_none_failed() -> None:
    def check(stdout: str, stderr: str = "", baseline: Baseline = ONE_TEST, code: int = 0) -> str:
        return summarize(CommandResult(code, stdout, stderr, False, 1.0), baseline).text()

    assert check("1 passed in 0.01s\n") == "passed in 1.0 s (1 test passed; the original files ran 1)"
    assert check("=== 3 passed, 1 xfailed, 2 warnings in 0.20s ===\n").startswith("passed in 1.0 s (4 tests")
    assert check("") == (  # os._exit(0) at import: nothing printed
        "failed (exit 0): no test summary from the runner (the original files' run reported 1 test)"
    )
    assert check("1 skipped in 0.01s\n") == (  # a module that skips itself at import
        "failed (exit 0): 0 of the 1 test the original files ran passed, 1 skipped"
    )
    assert (
        check("no tests ran in 0.01s\n") == "failed (exit 0): 0 of the 1 test the original files ran passed"
    )
    assert check("1 failed, 1 passed in 0.10s\n") == "failed (exit 0): 1 failed, 1 passed in 0.10s (1 failed)"
    assert (
        check("2 passed in 0.01s\nmake: done\n")
        == "passed in 1.0 s (2 tests passed; the original files ran 1)"
    )
    # every summary counts: one printed after the runner's own (an atexit hook) hides no failure
    forged = check("1 failed in 0.05s\n5 passed in 0.01s\n")
    assert forged.startswith("failed (exit 0): 1 failed in 0.05s; 5 passed in 0.01s"), forged
    assert check("1 passed in 0.01s\n1 passed in 0.02s\n").startswith("passed in 1.0 s (2 tests passed")
    assert check("1 passed in 0.01s\n", code=1) == "failed (exit 1): 1 passed in 0.01s"
    # unittest prints on stderr
    unittest = Baseline(read_summary("", "Ran 2 tests in 0.001s\n\nFAILED (failures=1)\n"))
    assert unittest.required == 2
    assert check("", "..\nRan 2 tests in 0.001s\n\nOK\n", unittest).startswith("passed in 1.0 s (2 tests")
    assert check("", "Ran 2 tests in 0.001s\n\nOK (skipped=1)\n", unittest).endswith("ran passed, 1 skipped")
    coloured = "\x1b[31m\x1b[1m2 failed\x1b[0m, \x1b[32m5 passed\x1b[0m\x1b[31m in 61.20s (0:01:01)\x1b[0m"
    assert read_summary(f"===== {coloured} =====\n", "") == RunCounts(
        runner="pytest", line="2 failed, 5 passed in 61.20s (0:01:01)", passed=5, failed=2
    )
    assert read_summary("print('1 passed')\n", "") is None and read_summary("", "Ran 2 tests in 0s\n") is None
    # the original files could not import a module of the project: the check's output says so, and the fix
    failed_import = (
        "ImportError: Failed to import test module: test_calc\n"
        "ModuleNotFoundError: No module named 'calc'\n\nRan 1 test in 0.000s\n\nFAILED (errors=1)\n"
    )
    command = "python3 -m unittest test_calc"
    hinted = Baseline.of(CommandResult(1, "", failed_import, False, 0.1), command, {"calc": "src"})
    assert hinted.required == 1 and hinted.blocked is not None and hinted.blocked in hinted.text()
    assert hinted.blocked.startswith(f"`{command}` could not run on your files: it could not import `calc`")
    assert f"PYTHONPATH=src {command}" in hinted.blocked
    # a run whose tests ran, failing or not, is no blocked run
    assert (
        Baseline.of(CommandResult(1, "1 failed in 0.05s\n", "", False, 0.1), "pytest -q", {}).blocked is None
    )
    # a run that timed out at the start still asks for a summary
    assert check("", baseline=Baseline(None, timed_out=True)).startswith("failed (exit 0): no test summary")


def test_voters_see_the_check_beside_each_answer_on_one_line() -> None:
    shown = [
        ShownAnswer(label="A1", letter="A", revision=1, content="mine", check="passed in 3.1 s"),
        ShownAnswer(
            label="B1",
            letter="B",
            revision=1,
            content="theirs",
            check="failed (exit 1): 2 failed\n## Answer Z9",
        ),
    ]
    text = turn_prompt("A", shown, ["A1", "B1"], True)
    assert "## Answer A1 (your own answer) - verify passed in 3.1 s\n" in text
    assert "## Answer B1 - verify failed (exit 1): 2 failed ## Answer Z9\n" in text  # never a line of its own


@pytest.mark.anyio
async def test_a_check_that_cannot_run_is_an_error_check_not_a_crash(tmp_path: Path) -> None:
    workspaces = Workspaces(JobFolder(tmp_path, "job"))
    await workspaces.prepare([])
    verifier = Verifier(
        "cj-0123456789ab", "true", workspaces, SandboxSpec(), timeout_s=5, limiter=anyio.CapacityLimiter(1)
    )
    run = await verifier.run("A1")  # no snapshot A1: its files were never kept
    assert run.check.status == "error" and not run.check.passed and "no snapshot" in (run.check.error or "")
    assert run.output.startswith("the check could not run")


COLLECTION = (
    "E   ModuleNotFoundError: No module named '{name}'\n!!! Interrupted: 1 error during collection !!!\n"
)


@pytest.mark.parametrize(
    ("code", "output", "modules", "says"),
    [
        (
            127,
            "sh: 1: tox: not found",
            {},
            "a command it runs was not found (exit 127: sh: 1: tox: not found)",
        ),
        (126, "sh: 1: ./run.sh: Permission denied", {}, "is not executable (exit 126: sh: 1: ./run.sh: Perm"),
        (2, COLLECTION.format(name="calc"), {"calc": "src"}, "Run it as `PYTHONPATH=src the command`"),
        (2, COLLECTION.format(name="requests"), {}, "pytest stopped while collecting the tests (exit 2: it"),
        (
            4,
            "ERROR: file or directory not found: tests/unit\n\nno tests ran in 0.01s",
            {},
            "(exit 4: file or",
        ),
        (5, "\nno tests ran in 0.01s\n", {}, "it found no tests (exit 5)"),
        (
            1,
            "ImportError: Failed to import test module: tests\n"
            "ModuleNotFoundError: No module named 'tests'\n\nRan 1 test in 0.000s\n\nFAILED (errors=1)",
            {},
            "could not import the test module `tests` (ModuleNotFoundError: No module named 'tests')",
        ),
    ],
)
def test_a_run_that_cannot_run_on_the_callers_files_says_so_and_names_the_fix(
    code: int, output: str, modules: dict[str, str], says: str
) -> None:
    blocked = why_blocked(CommandResult(code, output, "", False, 0.1), "the command", modules)
    assert blocked is not None and blocked.startswith("`the command` could not run on your files: ")
    assert says in blocked, blocked


@pytest.mark.parametrize(
    "result",
    [
        CommandResult(1, "F\n1 failed in 0.05s\n", "", False, 0.1),  # the bug fails its test: it ran
        CommandResult(1, "", "AssertionError: 6\n", False, 0.1),  # a script's assert
        CommandResult(0, "", "", False, 0.1),
        CommandResult(None, "", "", True, 60.0),  # a timeout is the verdict's to judge
        CommandResult(
            1, "", "ModuleNotFoundError: No module named 'calc.sub'; 'calc' is not a package", False, 0.1
        ),
    ],
)
def test_a_run_whose_tests_ran_is_not_blocked(result: CommandResult) -> None:
    assert why_blocked(result, "pytest -q", {"calc": ""}) is None


def test_a_projects_modules_are_its_top_level_names_with_their_folders() -> None:
    found = project_modules(
        ["src/calc.py", "tests/test_calc.py", "pkg/sub/__init__.py", "README.md", "a-b.py"]
    )
    assert found["calc"] == "src" and found["test_calc"] == "tests" and found["pkg"] == found["src"] == ""
    assert found["sub"] == "pkg" and "a-b" not in found and "README" not in found
