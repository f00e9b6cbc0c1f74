"""Checks test the answer, not the answer's tests: a check copy gets the caller's protected files back.

Before a `verify` command runs on an answer's files (coordination/verification.py), its fresh check copy
is put back in line with the caller's project as it was at job start, for every path that matches the
`verify_protect` patterns (gitignore syntax, relative to each context folder; the team file's
`verify_protect`, else `DEFAULT_PROTECT`):
- a protected file the answer modified or deleted is restored from base/ (the job-start copy);
- a protected file the answer added (a new `conftest.py` that skips everything, a new test) is removed.
And, whatever the patterns, a module or package the answer added at a context folder's top level under
the name of a standard-library module or a test runner (`unittest.py`, `json/`, `pytest.py`) is
removed: `python -m unittest` and `python -m pytest` put that folder first on `sys.path`, so such a file
would run instead of the real one. What was put back is returned, and the check says so to voters and
in the result (tests/security/test_verify_protect.py).
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from pathspec import GitIgnoreSpec

from conclave.files import safe, walking
from conclave.files.removal import remove_tree
from conclave.files.trees import list_tree, read_bytes, sha256_file

DEFAULT_PROTECT: tuple[str, ...] = (
    # Python: test folders and files, pytest/tox/coverage configuration, start-up hooks
    "test/",
    "tests/",
    "testing/",
    "test_*.py",
    "*_test.py",
    "conftest.py",
    "pytest.ini",
    "tox.ini",
    "setup.cfg",
    "pyproject.toml",
    "noxfile.py",
    ".coveragerc",
    "sitecustomize.py",
    "usercustomize.py",
    "*.pth",
    # JavaScript and TypeScript: the test scripts in package.json, test folders and files, runner configs
    "package.json",
    "__tests__/",
    "*.test.*",
    "*.spec.*",
    "jest.config.*",
    "vitest.config.*",
    ".mocharc*",
    "karma.conf.*",
    "node_modules/",
)
RUNNERS = frozenset(
    {
        "pytest",
        "_pytest",
        "pluggy",
        "iniconfig",
        "hypothesis",
        "nose",
        "nose2",
        "sitecustomize",
        "usercustomize",
    }
)
SHADOWED = frozenset(sys.stdlib_module_names) | RUNNERS


def shadows(name: str, is_dir: bool, has_init: bool = False) -> bool:
    """Whether a top-level entry would be imported instead of a standard module or a test runner: a
    module file (`json.py`, `json.pyc`, `json.cpython-312-x86_64-linux-gnu.so`) or a regular package
    (a folder with `__init__.py`; a folder without one never wins over a module found later)."""
    stem, _, rest = name.partition(".")
    if stem not in SHADOWED:
        return False
    if is_dir:
        return has_init and not rest
    return rest in ("py", "pyc", "pyd", "so") or (rest.endswith(".so") and rest.startswith("cpython-"))


def restore(
    copy: Path, base: Path, patterns: Sequence[str], owner: tuple[int, int] | None = None
) -> list[str]:
    """Put `copy` (an answer's check copy of one context folder) back in line with `base` for every
    protected path; remove added top-level modules that shadow the standard library. Return the paths
    the answer had changed, sorted (blocking)."""
    spec = GitIgnoreSpec.from_lines(list(patterns))
    before = list_tree(base).files
    after = list_tree(copy)
    changed: set[str] = set()
    for rel, entry in before.items():
        if not spec.match_file(rel):
            continue
        now = after.files.get(rel)
        if now is not None and now.size == entry.size and sha256_file(copy, rel) == sha256_file(base, rel):
            continue
        changed.add(rel)
        _clear(copy, rel)
        safe.write_bytes(copy, rel, read_bytes(base, rel), owner=owner, mode=entry.mode)
    for rel in after.files:
        if rel not in before and spec.match_file(rel):
            changed.add(rel)
            _clear(copy, rel)
    for name in _shadowing(copy, before):
        changed.add(name)
        _clear(copy, name)
    return sorted(changed)


def _shadowing(copy: Path, before: Iterable[str]) -> list[str]:
    """Top-level entries of `copy`, not in the job-start files, that shadow a standard module or a runner."""
    tops = {rel.split("/", 1)[0] for rel in before}
    found = []
    with safe.directory(copy, []) as fd:
        for entry in walking.entries(fd, "", limit=walking.MAX_ENTRIES):
            if entry.name in tops:
                continue
            kind = entry.info.st_mode
            has_init = stat.S_ISDIR(kind) and safe.lstat(copy, f"{entry.name}/__init__.py") is not None
            if (stat.S_ISREG(kind) or stat.S_ISDIR(kind)) and shadows(
                entry.name, stat.S_ISDIR(kind), has_init
            ):
                found.append(entry.name)
    return found


def _clear(root: Path, rel: str) -> None:
    """Remove `root/rel` (a file or a whole folder), reached without following links."""
    parts = safe.split(rel)
    try:
        with safe.directory(root, parts[:-1]) as fd:
            info = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISDIR(info.st_mode):
                os.unlink(parts[-1], dir_fd=fd)
        if stat.S_ISDIR(info.st_mode):  # reached without a link: the same folder by its path
            remove_tree(root.joinpath(*parts))
    except (FileNotFoundError, NotADirectoryError):
        pass
