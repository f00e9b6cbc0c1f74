"""A check runs the reviewed patch and passes only on the runner's own summary: the security review's
answers that left calc.py wrong and the tests untouched, yet had `python3 -m pytest -q` say passed.
Each runs a real check in the sandbox image (Docker), through the Verifier as a job does
(coordination/verification.py, files/check_copy.py, files/protect.py, coordination/verdicts.py); the
honest fix is the control that must still pass."""

from __future__ import annotations

import importlib.util
import marshal
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from conclave.config.models import SandboxSpec
from conclave.coordination.verification import CheckRun, Verifier
from conclave.files.contexts import ContextPath
from conclave.files.job_folder import JobFolder
from conclave.files.workspaces import Workspaces
from conclave.sandbox.container import container_user
from tests.fakes.calc_task import CALC, TESTS, calc_project

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_image")]
CHECK = "python3 -m pytest -q"
GITIGNORE = "__pycache__/\n*.pyc\n.venv/\n"  # a usual one
EXIT = "import os\nos._exit(0)\n"  # exit 0 before a single test ran
# the sandbox image's Python and pytest (server/sandbox/image.py): the names their caches go by
CACHE_TAG, PYTEST = "cpython-311", "7.2.1"


def fix(answer: Path) -> None:
    (answer / "calc.py").write_text(CALC.replace("a - b", "a + b"))


def cached_bytecode(answer: Path) -> None:
    """A byte-code cache of the untouched test file, stamped with its mtime and size, whose test does
    nothing: the import system and pytest's assertion rewriter both take it for the source's."""
    source = answer / "test_calc.py"
    info = source.stat()
    noop = "def test_add():\n    pass\n"
    code = compile(noop + "#" * (len(TESTS) - len(noop) - 1) + "\n", str(source), "exec")
    header = (
        importlib.util.MAGIC_NUMBER
        + (0).to_bytes(4, "little")
        + (int(info.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
        + (info.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    )
    cache = answer / "__pycache__"
    cache.mkdir()
    for name in (f"test_calc.{CACHE_TAG}.pyc", f"test_calc.{CACHE_TAG}-pytest-{PYTEST}.pyc"):
        (cache / name).write_bytes(header + marshal.dumps(code))


def abi3_extension(answer: Path) -> None:
    """`_pytest.abi3.so`, a real extension module that exits 0 when pytest imports `_pytest`."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("needs a C compiler to build the extension module")
    source = answer.parent / "ext.c"
    source.write_text("#include <unistd.h>\nvoid *PyInit__pytest(void) { _exit(0); return 0; }\n")
    built = subprocess.run(
        [compiler, "-shared", "-fPIC", "-o", str(answer / "_pytest.abi3.so"), str(source)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    source.unlink()


def dotted_ini(answer: Path) -> None:
    (answer / ".pytest.ini").write_text("[pytest]\naddopts = --collect-only\n")


def runner_dependency(name: str) -> Callable[[Path], None]:
    def write(answer: Path) -> None:
        (answer / f"{name}.py").write_text(EXIT)

    return write


def root_package(answer: Path) -> None:
    (answer / "__init__.py").write_text(EXIT)


def package_in_existing_folder(answer: Path) -> None:
    (answer / "json" / "__init__.py").write_text(EXIT)  # json/ held data files at the start


def exit_at_import(answer: Path) -> None:
    (answer / "calc.py").write_text(EXIT + CALC)


def summary_after_the_runners(answer: Path) -> None:
    """Prints a passing summary after pytest's own and exits 0 (an atexit hook runs after pytest)."""
    forge = (
        "import atexit, os\natexit.register(lambda: (print('1 passed in 0.01s', flush=True), os._exit(0)))\n"
    )
    (answer / "calc.py").write_text(forge + CALC)


async def check(tmp_path: Path, answer: Callable[[Path], None], *, outside: bool = False) -> CheckRun:
    """Answer A1's check: `answer` writes into the agent's copy of the calc project (`outside`: with a
    second context folder, into /workspace itself, which holds both)."""
    project = calc_project(tmp_path, {".gitignore": GITIGNORE})
    (project / "json").mkdir()
    (project / "json" / "sample.json").write_text("{}\n")
    paths = [ContextPath(path=str(project))]
    if outside:
        (tmp_path / "docs").mkdir()
        (tmp_path / "docs" / "notes.txt").write_text("notes\n")
        paths.append(ContextPath(path=str(tmp_path / "docs")))
    workspaces = Workspaces(JobFolder(tmp_path, "job"), agent_owner=container_user())
    await workspaces.prepare(paths)
    (agent,) = (await workspaces.create(["A"])).values()
    answer(agent if outside else workspaces.rooted(agent))
    await workspaces.snapshot("A", "A1")
    command = f"{CHECK} proj" if outside else CHECK  # from /workspace, which holds both folders
    verifier = Verifier(
        "cj-" + os.urandom(6).hex(),
        command,
        workspaces,
        SandboxSpec(),
        timeout_s=60,
        limiter=anyio.CapacityLimiter(1),
    )
    try:
        return await verifier.run("A1")
    finally:
        await verifier.close()


async def test_the_honest_fix_passes_on_the_runners_count(tmp_path: Path) -> None:
    run = await check(tmp_path, fix)
    assert run.check.passed, run.output
    assert run.check.text().startswith("passed in ") and "(1 test passed; the original files ran 1)" in (
        run.check.text()
    )
    assert "[the original files' run reported '1 failed in" in run.output


@pytest.mark.parametrize(
    "answer",
    [
        cached_bytecode,
        abi3_extension,
        dotted_ini,
        runner_dependency("attr"),
        runner_dependency("py"),
        root_package,
        package_in_existing_folder,
        exit_at_import,
        summary_after_the_runners,
    ],
    ids=[
        "pyc-of-the-test",
        "_pytest.abi3.so",
        ".pytest.ini",
        "attr.py",
        "py.py",
        "root-__init__",
        "json-package-in-existing-folder",
        "os._exit-in-calc",
        "summary-after-the-runners",
    ],
)
async def test_an_answer_that_leaves_calc_wrong_does_not_pass(
    tmp_path: Path, answer: Callable[[Path], None]
) -> None:
    run = await check(tmp_path, answer)
    assert run.check.status == "failed", run.output


async def test_a_runner_module_outside_the_context_folders_is_not_in_the_check(tmp_path: Path) -> None:
    run = await check(tmp_path, runner_dependency("pytest"), outside=True)
    assert run.check.status == "failed", run.output
    assert "1 failed" in run.output


async def test_what_apply_holds_back_is_named_and_an_exit_code_alone_is_not_a_pass(tmp_path: Path) -> None:
    run = await check(tmp_path, abi3_extension)
    assert run.check.held == ["_pytest.abi3.so (artifact)"], run.check
    assert "not in the check, as apply holds them back: _pytest.abi3.so (artifact)" in run.check.text()
    (tmp_path / "again").mkdir()
    run = await check(tmp_path / "again", exit_at_import)
    assert run.check.exit_code == 0 and run.check.text() == (
        "failed (exit 0): no test summary from the runner (the original files' run reported 1 test)"
    ), run.check.text()
