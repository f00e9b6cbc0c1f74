"""A check's result in words (what voters and the view see) and a check that cannot run, without Docker."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from conclave.config.models import SandboxSpec
from conclave.coordination.prompts import turn_prompt
from conclave.coordination.reports import Check, ShownAnswer
from conclave.coordination.verification import Verifier, summarize
from conclave.files.workspaces import Workspaces
from conclave.sandbox.output import CommandResult


def test_a_result_becomes_a_check() -> None:
    failed = summarize(
        CommandResult(1, "..F\n" + "x" * 500 + "\n\nFAILED (failures=1)\n", "warn\n", False, 3.14159)
    )
    assert failed.status == "failed" and failed.exit_code == 1 and failed.duration_s == 3.14
    assert failed.tail[-1] == "warn" and len(failed.tail[-3]) == 200 and failed.tail[-3].endswith("...")
    assert failed.text() == "failed (exit 1): warn"
    assert summarize(CommandResult(0, "OK\n", "", False, 3.14)).text() == "passed in 3.1 s"
    assert summarize(CommandResult(137, "", "", True, 120.2)).text() == "failed: timed out after 120 s"
    assert summarize(CommandResult(None, "", "", True, 130.0)).status == "failed"  # an overrun exec
    assert Check(status="running").text() == "running"
    assert Check(status="error", error="no Docker").text() == "could not run: no Docker"


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
    workspaces = Workspaces(tmp_path / "job")
    await workspaces.prepare([])
    verifier = Verifier(
        "cj-0123456789ab", "true", workspaces, SandboxSpec(), timeout_s=5, limiter=anyio.CapacityLimiter(1)
    )
    run = await verifier.run("A1")  # no snapshot A1: its files were never kept
    assert run.check.status == "error" and not run.check.passed and "no snapshot" in (run.check.error or "")
    assert run.output.startswith("the check could not run")
