"""Checks run as the user's terminal runs them: the commands people write for `verify`, on the layouts
their projects have. For each, the caller's files' run (the baseline) goes as it would in a terminal in
the project folder (the bug fails its test; nothing fails to import), an answer that fixes the bug
passes and one that does not fails, so the fix is the answer the verification rule picks. A command
that cannot run on the caller's own files at all says so, naming the command, what failed and the fix.
Real checks in the sandbox image (Docker) through the Verifier as a job runs them; the battery's cases
run once per module, a few at a time, and each test reads its case."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import anyio
import pytest
from rich.console import Console

from conclave.backends.retry import RetryPolicy
from conclave.cli.render import render
from conclave.config.models import SandboxSpec
from conclave.coordination.verdicts import Baseline
from conclave.coordination.verification import CheckRun, Verifier
from conclave.files.contexts import ContextPath
from conclave.files.job_folder import JobFolder
from conclave.files.workspaces import Workspaces
from conclave.jobs.read.views import structured
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.sandbox.container import container_user
from conclave.settings import Settings
from tests.fakes.calc_task import CALC, TASK, TESTS, agent, calc_project
from tests.fakes.environment import environment_of
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, write_team
from tests.fakes.waits import until_done

BUG, RIGHT, WRONG = "return a - b", "return a + b", "return a * b"  # 2 * 3 != 5
SCRIPT = "from calc import add\n\nassert add(2, 3) == 5, add(2, 3)\nprint('add works')\n"
UNITTEST = (
    "import unittest\n\nfrom calc import add\n\n\nclass AddTest(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n\n"
    "if __name__ == '__main__':\n    unittest.main()\n"
)
PYTHONPATH_SRC = '[tool.pytest.ini_options]\npythonpath = ["src"]\n'
RUN_TESTS = "#!/bin/sh\nset -e\npython3 -m pytest -q tests\n"
AT_ONCE = 3  # cases checked at once: each has one check container, its runs one after another
ENV = {KEY_ENV: "test-key-0123456789"}
FAST = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05)


@dataclass(frozen=True)
class Case:
    """A project (`files`, path: text; the module with the bug is `module`) and its check command."""

    command: str
    files: Mapping[str, str]
    module: str = "calc.py"
    needs: tuple[str, ...] = field(default=())  # what the reason a baseline cannot run must name


FLAT = {"calc.py": CALC, "test_calc.py": TESTS}
TESTS_FOLDER = {"calc.py": CALC, "tests/test_calc.py": TESTS}
WITH_CONFTEST = {**TESTS_FOLDER, "conftest.py": ""}
SRC = {"src/calc.py": CALC, "tests/test_calc.py": TESTS, "pyproject.toml": PYTHONPATH_SRC}
UNITTEST_FLAT = {"calc.py": CALC, "test_calc.py": UNITTEST}

RUNS = {
    "python3-script-importing-its-sibling": Case(
        "python3 test_calc.py", {"calc.py": CALC, "test_calc.py": SCRIPT}
    ),
    "python3-m-pytest-flat": Case("python3 -m pytest -q", FLAT),
    "pytest-flat": Case("pytest -q", FLAT),
    "python3-m-pytest-tests-folder": Case("python3 -m pytest -q", TESTS_FOLDER),
    "python3-m-pytest-tests-folder-conftest": Case("python3 -m pytest -q", WITH_CONFTEST),
    "pytest-tests-folder-conftest": Case("pytest -q", WITH_CONFTEST),
    "python3-m-pytest-src-pythonpath": Case("python3 -m pytest -q", SRC, "src/calc.py"),
    "pytest-src-pythonpath": Case("pytest -q", SRC, "src/calc.py"),
    "python3-m-unittest-discovery": Case("python3 -m unittest", UNITTEST_FLAT),
    "python3-m-unittest-by-name": Case("python3 -m unittest test_calc", UNITTEST_FLAT),
    "unittest-main-script": Case("python3 test_calc.py", UNITTEST_FLAT),
    "sh-run-tests": Case("sh run_tests.sh", {**TESTS_FOLDER, "run_tests.sh": RUN_TESTS}),
}
# Commands that cannot run on the caller's own files, in the user's terminal either: the job must say so.
CANNOT_RUN = {
    # `pytest` (unlike `python3 -m pytest`) does not put the current folder on sys.path
    "pytest-tests-folder-no-conftest": Case("pytest -q", TESTS_FOLDER, needs=("calc", "pythonpath")),
    "command-not-found": Case("tox -q", FLAT, needs=("`tox -q`", "not found", "127")),
    "script-not-executable": Case(
        "./run_tests.sh", {**TESTS_FOLDER, "run_tests.sh": RUN_TESTS}, needs=("126",)
    ),
    "pytest-path-not-found": Case("python3 -m pytest -q tests/unit", FLAT, needs=("tests/unit", "4")),
    "pytest-no-tests": Case("pytest -q", {"calc.py": CALC}, needs=("no tests",)),
    "unittest-module-not-found": Case("python3 -m unittest tests.test_calc", UNITTEST_FLAT, needs=("tests",)),
}


@dataclass(frozen=True)
class Ran:
    """A case's three runs: the caller's files, the right fix (A1) and the wrong one (B1)."""

    baseline: Baseline
    right: CheckRun
    wrong: CheckRun


async def check_case(folder: Path, case: Case, limiter: anyio.CapacityLimiter) -> Ran:
    project = folder / "proj"
    for rel, text in case.files.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(text)
    workspaces = Workspaces(JobFolder(folder, "job"), agent_owner=container_user())
    await workspaces.prepare([ContextPath(path=str(project))])
    agents = await workspaces.create(["A", "B"])
    for letter, fix in (("A", RIGHT), ("B", WRONG)):
        module = workspaces.rooted(agents[letter]) / case.module
        module.write_text(module.read_text().replace(BUG, fix))
        await workspaces.snapshot(letter, f"{letter}1")
    verifier = Verifier(
        "cj-" + os.urandom(6).hex(),
        case.command,
        workspaces,
        SandboxSpec(),
        timeout_s=60,
        limiter=anyio.CapacityLimiter(1),
    )
    async with limiter:
        try:
            await verifier.warm(1)
            right, wrong = await verifier.run("A1"), await verifier.run("B1")
            return Ran(await verifier.baseline(), right, wrong)
        finally:
            await verifier.close()


@pytest.fixture(scope="module")
def battery(docker_image: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Ran]:
    """Every case checked once, `AT_ONCE` at a time (the module's tests read their case)."""
    cases = {**RUNS, **CANNOT_RUN}
    ran: dict[str, Ran] = {}

    async def all_cases() -> None:
        limiter = anyio.CapacityLimiter(AT_ONCE)

        async def one(name: str) -> None:
            ran[name] = await check_case(tmp_path_factory.mktemp(name), cases[name], limiter)

        async with anyio.create_task_group() as tg:
            for name in cases:
                tg.start_soon(one, name)

    anyio.run(all_cases)
    return ran


@pytest.mark.parametrize("name", list(RUNS))
def test_the_baseline_runs_as_in_a_terminal_and_only_the_fix_passes(
    battery: dict[str, Ran], name: str
) -> None:
    ran = battery[name]
    assert "ModuleNotFoundError" not in ran.right.output, ran.right.output
    assert ran.right.check.status == "passed", ran.right.output
    assert ran.wrong.check.status == "failed", ran.wrong.output
    assert ran.baseline.blocked is None, ran.baseline.text()
    if ran.baseline.counts is not None:  # the bug failed its one test: it ran, and failed
        assert (ran.baseline.counts.ran, ran.baseline.counts.failed) == (1, 1), ran.baseline.text()
        assert ran.right.check.required == 1 and ran.right.check.verdict == "tests"
    else:  # a plain script: its exit code is the verdict, and the bug made it fail
        assert ran.right.check.verdict == "exit_code" and "AssertionError" in ran.wrong.output


@pytest.mark.parametrize("name", list(CANNOT_RUN))
def test_a_baseline_that_cannot_run_says_why_and_what_to_do(battery: dict[str, Ran], name: str) -> None:
    ran, case = battery[name], CANNOT_RUN[name]
    blocked = ran.baseline.blocked
    assert blocked is not None, ran.baseline.text()
    assert blocked.startswith(f"`{case.command}` could not run on your files"), blocked
    assert all(word in blocked for word in case.needs), blocked
    assert blocked in ran.right.output and blocked in ran.wrong.output  # every check's output says it


@pytest.mark.anyio
@pytest.mark.usefixtures("docker_image")
async def test_a_test_script_importing_its_sibling_grounds_the_vote(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    """The issue's job: only ann fixes add(), two of three vote for bob's wrong fix; the test script
    the command runs imports calc beside it, passes on ann's answer alone, and so ann's answer wins."""
    project = calc_project(tmp_path, {"test_calc.py": SCRIPT})
    for name, favourite in (("ann", "ann"), ("bob", "bob"), ("cy", "bob")):
        fakes.script.set_default(name, agent(favourite))
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO, coordination={"final": "reuse"}))
    request = JobRequest(
        task=TASK, team=team, context_paths=[{"path": str(project)}], verify="python3 test_calc.py"
    )
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        view = await until_done(service, await service.submit(request))
        patch = (await service.lookup.read(view.job_id, "@diff", None, 0, 100_000)).content
    assert view.answer == "add() fixed in calc.py (ann).", view.text()
    assert view.winner_check and view.winner_check.startswith("passed in "), view.text()
    assert "the verification rule chose it" in view.winner_check and view.verify_blocked is None
    assert "+    return a + b\n" in patch


@pytest.mark.anyio
@pytest.mark.usefixtures("docker_image")
async def test_a_check_that_cannot_run_is_said_at_once_and_the_vote_is_not_shown_as_a_verdict(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    """`tox -q` is not in the sandbox image: while the agents are still held at their first turn, the
    job already says the check cannot run, why and what to do (get_status's view, its text, the
    transcript); when it ends, the winner is the vote's, said to be unverified, not a failed check."""
    held = threading.Event()  # every reply waits for it (tests/fakes/script.py's gate)

    def waiting(favourite: str) -> Callable[[RecordedRequest], Reply]:
        respond = agent(favourite)
        return lambda request: replace(respond(request), gate=held)

    for name, favourite in (("ann", "ann"), ("bob", "bob"), ("cy", "bob")):
        fakes.script.set_default(name, waiting(favourite))
    project = calc_project(tmp_path)
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO, coordination={"final": "reuse"}))
    request = JobRequest(task=TASK, team=team, context_paths=[{"path": str(project)}], verify="tox -q")
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        view = await service.submit(request)
        try:
            with anyio.fail_after(60):
                while view.verify_blocked is None:
                    view = await service.wait(view.job_id, 1)
            assert not view.done and view.checks() == {}  # no agent has answered yet
        finally:
            held.set()
        blocked = view.verify_blocked
        assert blocked.startswith("`tox -q` could not run on your files: a command it runs was not found")
        assert "(exit 127: " in blocked and "`python3 -m pytest -q`" in blocked
        assert f"Verification cannot decide: {blocked}" in view.text()
        assert structured(view)["progress"]["verify_blocked"] == blocked  # type: ignore[index]
        view = await until_done(service, view)
        transcript = (await service.lookup.read(view.job_id, "transcript", None, 0, 100_000)).content
    assert view.state == "completed" and view.answer == "add() fixed in calc.py (bob).", view.text()
    assert view.winner_check == f"not verified, the vote alone chose it: {blocked}"
    assert f"Its check: not verified, the vote alone chose it: {blocked}" in view.text()
    assert f"Verification cannot decide: {blocked}." in transcript
    console = Console(record=True, width=100)  # what `conclave ask` and `conclave status` print
    console.print(render(view))
    shown = " ".join(console.export_text().split())
    assert f"verification cannot decide: {blocked}" in shown
    assert f"its check: not verified, the vote alone chose it: {blocked}" in shown
