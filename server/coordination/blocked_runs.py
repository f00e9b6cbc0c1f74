"""Why a check command cannot run on the caller's own files at all, in words that name the fix.

A check's verdict (verdicts.py) holds an answer's run against the caller's files' run, the `Baseline`.
When that run stopped before any test could pass or fail (the command was not found or not executable,
pytest stopped while collecting, found no tests or could not start, unittest could not import the test
module, or the command's Python could not import a module that is in the project), no answer's check
can tell a fix from a miss on the command's own account: the job says so at once and names the fix
(coordination/verification.py reports it; the view shows it beside the vote). The same command fails the
same way in the user's terminal: checks run as it does (verification.py's `RUNNER_ENV`). Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath

from conclave.sandbox.output import CommandResult

ANSI = re.compile(r"\x1b\[[0-9;]*m")
MISSING = re.compile(r"ModuleNotFoundError: No module named '(?P<name>[\w.]+)'$", re.MULTILINE)
FAILED_IMPORT = re.compile(r"ImportError: Failed to import test module: (?P<name>[\w.]+)")
COLLECTING = re.compile(r"Interrupted: \d+ errors? during collection|^ERROR collecting ", re.MULTILINE)
PYTEST_ERROR = re.compile(r"^(?:ERROR: |[\w.-]+: error: )(?P<what>.+)$", re.MULTILINE)
NO_TESTS = re.compile(r"^=*\s*no tests ran in |^Ran 0 tests in |^NO TESTS RAN", re.MULTILINE)
LINE_CHARS = 200


def project_modules(files: Iterable[str]) -> dict[str, str]:
    """The top-level names a project's files could be imported by (`calc` for `src/calc.py`, `pkg` for
    `pkg/`), each with the folder that holds it ("" for the project folder), the shallowest first."""
    found: dict[str, str] = {}
    for rel in sorted(files, key=lambda rel: (rel.count("/"), rel)):
        path = PurePosixPath(rel)
        parts = path.parts
        for depth, name in enumerate(parts[:-1]):
            if name.isidentifier():
                found.setdefault(name, "/".join(parts[:depth]))
        if path.suffix == ".py" and path.stem.isidentifier():
            found.setdefault(path.stem, "/".join(parts[:-1]))
    return found


def why_blocked(result: CommandResult, command: str, modules: Mapping[str, str]) -> str | None:
    """Why `result`, the caller's files' run of `command`, shows it cannot run on them at all, with what
    to do; None when it ran (its tests passing or failing, or a command that printed no tests at all)."""
    if result.timed_out or result.exit_code in (0, None):
        return None
    code = result.exit_code
    text = ANSI.sub("", f"{result.stdout}\n{result.stderr}")
    lead = f"`{command}` could not run on your files"
    if code == 127:
        return (
            f"{lead}: a command it runs was not found (exit 127: {_last(text)}). Name a command the "
            "sandbox image has (python3 and pytest: `python3 -m pytest -q`), or give the team a sandbox "
            "image that has it"
        )
    if code == 126:
        return (
            f"{lead}: a file it runs is not executable (exit 126: {_last(text)}). Run it through its "
            "interpreter (`sh run_tests.sh`), or make it executable in your project (`chmod +x`)"
        )
    for match in MISSING.finditer(text):
        top = match.group("name").split(".")[0]
        if top in modules:
            return _not_on_path(lead, command, top, modules[top])
    if (failed := FAILED_IMPORT.search(text)) is not None:
        return (
            f"{lead}: unittest could not import the test module `{failed.group('name')}` "
            f"({_import_error(text)}). Name it by its dotted name from the project folder "
            "(`python3 -m unittest test_calc`, `python3 -m unittest tests.test_calc` when "
            "tests holds an __init__.py), or let unittest find it: `python3 -m unittest discover -s tests`"
        )
    if COLLECTING.search(text) is not None:
        missing = _missing(text)
        why = f"it could not import `{missing}`" if missing else _pytest_error(text)
        fix = (
            f"Add `{missing}` to the sandbox image (the team's sandbox image), or, if the task is to "
            "write it, an answer that does can still pass"
            if missing
            else "Fix what it reports in your project, then run the job again"
        )
        return f"{lead}: pytest stopped while collecting the tests (exit {code}: {why}). {fix}"
    if code == 4 and (error := PYTEST_ERROR.search(text)) is not None:
        return (
            f"{lead}: pytest could not start (exit 4: {_cut(error.group('what'))}). Give it only paths and "
            "options that exist in your project"
        )
    if code == 3 and "INTERNALERROR" in text:
        return f"{lead}: pytest failed inside itself (exit 3: INTERNALERROR). Run it in a terminal to see why"
    if NO_TESTS.search(text) is not None:
        return (
            f"{lead}: it found no tests (exit {code}). Name the files or folder that hold your tests "
            "(`python3 -m pytest -q tests`), or the pattern they follow (pytest's `python_files`)"
        )
    return None


def _not_on_path(lead: str, command: str, module: str, folder: str) -> str:
    """A module of the project the command's Python did not look for where it is."""
    where = f"`{folder}/`" if folder else "the project folder"
    said = f"{lead}: it could not import `{module}`, which is in your project ({where}), as Python looks for "
    said += "modules elsewhere with this command (as it would in your terminal). "
    if "pytest" in command:
        fix = f'Add `pythonpath = ["{folder or "."}"]` under [tool.pytest.ini_options] in pyproject.toml '
        fix += "(pytest 7+)"
        if not folder and "-m pytest" not in command:
            fix += ", or run `python3 -m pytest`, which puts the current folder first on sys.path"
        return said + fix
    return said + f"Run it as `PYTHONPATH={folder or '.'} {command}`"


def _missing(text: str) -> str | None:
    match = MISSING.search(text)
    return match.group("name") if match else None


def _import_error(text: str) -> str:
    missing = _missing(text)
    return f"ModuleNotFoundError: No module named {missing!r}" if missing else "ImportError"


def _pytest_error(text: str) -> str:
    error = PYTEST_ERROR.search(text)
    return _cut(error.group("what")) if error else _last(text)


def _last(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return _cut(lines[-1]) if lines else "no output"


def _cut(line: str) -> str:
    return line if len(line) <= LINE_CHARS else line[: LINE_CHARS - 3] + "..."
