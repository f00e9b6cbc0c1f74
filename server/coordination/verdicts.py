"""A check's verdict: the test runner's own summary, held against the run of the caller's own files.

An exit code of 0 alone is what `os._exit(0)` at import, or any command that never ran the tests, also
gives; and a run of fewer tests (a module that skips itself at import) passes what it did not run. So a
check (coordination/verification.py) first runs the caller's command once on the caller's files as they
were (the `Baseline`), and an answer's check passes only when its command exits 0 within its time and
the runner's own summary reports at least as many tests run as the caller's files' run did (skipped
ones left out), all of them passed. When the caller's files' run printed no summary recognised here (a
`make lint`), the verdict is the exit code, and the check says so (`verdict="exit_code"`).

Summaries recognised (every one in the output counts, added up):
- pytest's final line: `=== 1 failed, 4 passed, 1 skipped in 0.12s ===`, `-q`'s bare `5 passed in 0.12s`,
  `no tests ran in 0.01s`;
- unittest's `Ran 5 tests in 0.001s` and the verdict line after it: `OK`, `OK (skipped=1)`,
  `FAILED (failures=1, errors=2)`, `NO TESTS RAN`.
Code under test runs inside its runner and can still print a summary of its own or patch the runner
(docs/apply-and-verify.md says what a check can and cannot promise). Pure: no I/O.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from conclave.coordination.blocked_runs import why_blocked
from conclave.sandbox.output import CommandResult

_WORDS = "failed|passed|skipped|deselected|xfailed|xpassed|warnings?|errors?|rerun"
_PART = rf"\d+ (?:{_WORDS})"
PYTEST = re.compile(
    rf"^=*\s*(?P<parts>{_PART}(?:, {_PART})*|no tests ran) in \d+(?:\.\d+)?s(?: \([\d:.]+\))?\s*=*$"
)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
UNITTEST_RAN = re.compile(r"^Ran (?P<count>\d+) tests? in \d+(?:\.\d+)?s$")
UNITTEST_VERDICT = re.compile(r"^(?P<verdict>OK|FAILED|NO TESTS RAN)(?: \((?P<parts>[^)]*)\))?$")


class RunCounts(BaseModel):
    """What a runner's summary says: tests that ran without failing, that failed (or errored), skipped."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runner: Literal["pytest", "unittest"]
    line: str  # the summary as the runner printed it
    passed: int = 0  # passed, xfailed and xpassed: ran and did not fail
    failed: int = 0  # failed, errors, unexpected successes
    skipped: int = 0

    @property
    def ran(self) -> int:
        """The tests the run reported, failing or not, skipped ones left out."""
        return self.passed + self.failed


@dataclass(frozen=True)
class Baseline:
    """The check command's run on the caller's files as they were, once per job (or kept: baselines.py)."""

    counts: RunCounts | None
    timed_out: bool = False
    # why the command cannot run on the caller's files at all, and what to do (blocked_runs.py)
    blocked: str | None = None
    reused: bool = False  # kept from an earlier job's run on the same files (coordination/baselines.py)

    @classmethod
    def of(cls, result: CommandResult, command: str, modules: Mapping[str, str]) -> Baseline:
        """The run `result` of `command` on the caller's files (`modules`: the project's, blocked_runs.py)."""
        blocked = why_blocked(result, command, modules)
        return cls(read_summary(result.stdout, result.stderr), result.timed_out, blocked)

    @property
    def required(self) -> int | None:
        """How many tests an answer's run must pass: all the caller's files' run reported, skipped ones
        left out; None when it printed no summary recognised here (the verdict is then the exit code).
        A run that timed out without one asks for a summary of at least one test."""
        if self.counts is not None:
            return self.counts.ran
        return 1 if self.timed_out else None

    def text(self) -> str:
        """What the caller's files' run said, for a check's output."""
        if self.counts is not None:
            said = f"the original files' run reported {self.counts.line!r}"
        elif self.timed_out:
            said = "the original files' run timed out without a test summary"
        else:
            said = "the original files' run printed no test summary recognised: the verdict is the exit code"
        if self.blocked:
            said += f"; {self.blocked}"
        if self.reused:
            said += " (kept from an earlier job's run of this command on the same files)"
        return said


def shortfall(counts: RunCounts | None, required: int) -> str | None:
    """Why a run that exited 0 is not a pass against `required` tests, or None when it is one."""
    if counts is None:
        return f"no test summary from the runner (the original files' run reported {_tests(required)})"
    if counts.failed:
        return f"{counts.line} ({counts.failed} failed)"
    if counts.passed < required:
        skipped = f", {counts.skipped} skipped" if counts.skipped else ""
        return f"{counts.passed} of the {_tests(required)} the original files ran passed{skipped}"
    return None


def _tests(count: int) -> str:
    return f"{count} test" + ("" if count == 1 else "s")


def read_summary(stdout: str, stderr: str) -> RunCounts | None:
    """Every runner summary in a check's output, added up (pytest prints on stdout, unittest on
    stderr), or None. All count, not only the last: a command may run its tests in several runs, and a
    line printed after the runner's own (from an `atexit` hook) cannot hide the failures it reported."""
    lines = _lines(stdout) + _lines(stderr)
    found = [counts for line in lines if (counts := _pytest(line)) is not None]
    found += _unittest(_lines(stderr)) + _unittest(_lines(stdout))
    if not found:
        return None
    if len(found) == 1:
        return found[0]
    shown = "; ".join(counts.line for counts in found[:3]) + (
        f" and {len(found) - 3} more" if len(found) > 3 else ""
    )
    return RunCounts(
        runner=found[0].runner,
        line=shown,
        passed=sum(counts.passed for counts in found),
        failed=sum(counts.failed for counts in found),
        skipped=sum(counts.skipped for counts in found),
    )


def _lines(text: str) -> list[str]:
    """The non-blank lines, without colour codes (`--color=yes`)."""
    plain = ANSI.sub("", text)
    return [line.strip() for line in plain.splitlines() if line.strip()]


def _pytest(line: str) -> RunCounts | None:
    match = PYTEST.match(line)
    if match is None:
        return None
    counts = dict.fromkeys(("passed", "failed", "skipped"), 0)
    for part in match.group("parts").split(", ") if match.group("parts") != "no tests ran" else ():
        number, word = part.split(" ", 1)
        key = {"xfailed": "passed", "xpassed": "passed", "error": "failed", "errors": "failed"}.get(
            word, word
        )
        if key in counts:
            counts[key] += int(number)
    return RunCounts(runner="pytest", line=line.strip("= "), **counts)


def _unittest(lines: list[str]) -> list[RunCounts]:
    found = []
    for ran_line, verdict_line in itertools.pairwise(lines):
        ran, verdict = UNITTEST_RAN.match(ran_line), UNITTEST_VERDICT.match(verdict_line)
        if ran is None or verdict is None:
            continue
        parts = {
            key.strip(): int(value)
            for key, _, value in (part.partition("=") for part in (verdict.group("parts") or "").split(","))
            if value.strip().isdigit()
        }
        failed = parts.get("failures", 0) + parts.get("errors", 0) + parts.get("unexpected successes", 0)
        skipped = parts.get("skipped", 0)
        total = int(ran.group("count"))
        if verdict.group("verdict") == "FAILED":
            failed = max(failed, 1)
        found.append(
            RunCounts(
                runner="unittest",
                line=f"{ran_line}: {verdict_line}",
                passed=max(total - failed - skipped, 0),
                failed=failed,
                skipped=skipped,
            )
        )
    return found
