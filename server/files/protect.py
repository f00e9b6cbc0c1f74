"""Checks test the answer, not the answer's tests: a check copy gets the caller's protected files back.

Before a `verify` command runs on an answer's files (coordination/verification.py), its fresh check copy
is put back in line with the caller's project as it was at job start, for every path that matches the
`verify_protect` patterns (gitignore syntax, relative to each context folder; the team file's
`verify_protect`, else `DEFAULT_PROTECT`):
- a protected file the answer modified or deleted is restored from base/ (the job-start copy);
- a protected file the answer added (a new `conftest.py` that skips everything, a new test) is removed.
`DEFAULT_PROTECT` holds the runner's configuration files (`pytest.ini`, `.pytest.ini`, `pyproject.toml`,
`tox.ini`, `setup.cfg`, `conftest.py`) and the project root's package marker, `__init__` at the top
(pytest imports the root as a package, and that module runs, before any test module).
And, whatever the patterns, a module or package that shadows a standard-library module or the runner's
own imports (`unittest.py`, `json/` with an `__init__` module, `_pytest.abi3.so`, `attr`) and did not at
job start is put back as the caller had it, whether or not a folder of that name was there (an
`__init__` added to an existing `json/` folder is removed), at the top of the context folder and in
every folder pytest puts on `sys.path` for a test module (`import_roots`), and the folder of every
Python script the command names (`python3 scripts/check.py` puts `scripts/` first on `sys.path`):
there such a module would run instead of the real one. A module that shadowed at job start is the
project's own and stays as the answer made it. What was put back is returned, and the check says so to
voters and in the result.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import sys
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path, PurePosixPath

from pathspec import GitIgnoreSpec

from conclave.files import safe
from conclave.files.removal import remove_tree
from conclave.files.trees import Listing, list_tree, read_bytes, sha256_file

DEFAULT_PROTECT: tuple[str, ...] = (
    # Python: test folders and files, pytest/tox/coverage configuration, start-up hooks
    "test/",
    "tests/",
    "testing/",
    "test_*.py",
    "*_test.py",
    "conftest.py",
    "/__init__.py",  # the project root as a package: pytest then imports it before any test module
    "pytest.ini",
    ".pytest.ini",
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
# The runner's own imports: pytest, its plugin system and dependencies (some Python versions only), and
# the start-up hooks. A project file by one of these names at the top of a context folder would be
# imported instead of the real one once that folder is on sys.path.
RUNNERS = frozenset(
    {
        "pytest",
        "_pytest",
        "py",
        "pluggy",
        "iniconfig",
        "packaging",
        "attr",
        "attrs",
        "exceptiongroup",
        "tomli",
        "colorama",
        "pygments",
        "hypothesis",
        "nose",
        "nose2",
        "sitecustomize",
        "usercustomize",
        "apport_python_hook",  # Debian's sitecustomize imports it at every start-up
    }
)
SHADOWED = frozenset(sys.stdlib_module_names) | RUNNERS
# What the import system loads as a module besides a folder: source, byte-code, and extension modules
# under any platform's suffix (`.so`, `.abi3.so`, `.cpython-312-x86_64-linux-gnu.so`, `.pyd`, ...).
MODULE_SUFFIXES = ("py", "pyw", "pyc", "pyd", "so")
TEST_MODULE = re.compile(r"test_.*\.py|.*_test\.py|conftest\.py")  # pytest's default python_files


def shadows(name: str, is_dir: bool, has_init: bool = False) -> bool:
    """Whether a top-level entry would be imported instead of a standard module or the runner's own: a
    module file (`json.py`, `json.pyc`, `_pytest.abi3.so`) or a regular package (a folder with an
    `__init__` module; a folder without one never wins over a module found later)."""
    stem, _, rest = name.partition(".")
    if stem not in SHADOWED:
        return False
    if is_dir:
        return has_init and not rest
    return is_module_file(name)


def is_module_file(name: str) -> bool:
    """Whether the import system would load file `name` as a module (any extension-module suffix)."""
    rest = name.partition(".")[2]
    return rest in MODULE_SUFFIXES or rest.endswith((".so", ".pyd"))


class Protection:
    """The protected paths' patterns (the team's `verify_protect`, else `DEFAULT_PROTECT`), compiled once
    for all of a job's checks, and the folders of the scripts the check `command` names."""

    def __init__(self, patterns: Sequence[str], command: str = "") -> None:
        self.spec = GitIgnoreSpec.from_lines(list(patterns))
        self.script_folders = script_folders(command)

    def roots(self, prefix: str) -> set[str]:
        """The script folders inside the context folder whose paths start with `prefix` ("" for one
        context folder, which is the command's own folder; "name/" for one of several), relative to it."""
        return {folder[len(prefix) :] for folder in self.script_folders if f"{folder}/".startswith(prefix)}


def script_folders(command: str) -> frozenset[str]:
    """The folders (relative to the command's, "" for itself) of the Python scripts `command` names:
    Python puts a script's own folder first on `sys.path`."""
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: the shell refuses it too
        words = command.split()
    found = set()
    for word in words:
        path = PurePosixPath(word.removeprefix("./"))
        if path.suffix in (".py", ".pyw") and not path.is_absolute() and ".." not in path.parts:
            found.add("" if str(path.parent) == "." else str(path.parent))
    return frozenset(found)


def restore(
    copy: Path,
    base: Path,
    protection: Protection,
    owner: tuple[int, int] | None = None,
    *,
    written: Collection[str] | None = None,
    listed: Listing | None = None,
    prefix: str = "",
) -> list[str]:
    """Put `copy` (a check copy of one context folder) back in line with `base` for every protected
    path, and for every module or package that shadows a standard module or the runner's own where
    pytest imports from (`import_roots`) and did not at job start. Return the paths the answer had
    changed, sorted (blocking). `written` lists the paths the copy's patch wrote or deleted
    (check_copy.py): a protected file outside it is base's own, copied a moment before, and is not
    read and hashed again, and a patch that wrote nothing leaves nothing to put back; None compares
    every protected file. `listed` is base's listing where the caller has it; `prefix` is the context
    folder's path in the command's folder ("" when it is that folder: Protection.roots)."""
    if written is not None and not written:
        return []  # the copy is base/ as it was: every file the caller's own
    before, after = (listed if listed is not None else list_tree(base)).files, list_tree(copy)
    roots = import_roots([*before, *after.files]) | protection.roots(prefix)
    shadowing = sorted(_shadowing(after.files, roots) - _shadowing(before, roots))
    spec = protection.spec

    def protected(rel: str) -> bool:
        return spec.match_file(rel) or any(rel == path or rel.startswith(f"{path}/") for path in shadowing)

    changed: set[str] = set()
    for rel, entry in before.items():
        now = after.files.get(rel)
        if now is not None and written is not None and rel not in written:
            continue
        if not protected(rel):
            continue
        if now is not None and now.size == entry.size and sha256_file(copy, rel) == sha256_file(base, rel):
            continue
        changed.add(rel)
        _clear(copy, rel)
        safe.write_bytes(copy, rel, read_bytes(base, rel), owner=owner, mode=entry.mode)
    for rel in after.files:
        if rel not in before and protected(rel):
            changed.add(rel)
            _clear(copy, rel)
    return sorted(changed)


def import_roots(files: Iterable[str]) -> set[str]:
    """The folders (relative to the context folder, "" for itself) whose modules pytest can import in
    place of a standard one: the context folder, and for each test module or conftest, the first
    folder above it that is not a package (what pytest's default `prepend` import mode puts first on
    `sys.path`)."""
    files = list(files)
    packages = {_parent(rel) for rel in files if _is_init(rel)}
    roots = {""}
    for rel in files:
        if TEST_MODULE.fullmatch(PurePosixPath(rel).name):
            folder = _parent(rel)
            while folder and folder in packages:
                folder = _parent(folder)
            roots.add(folder)
    return roots


def _shadowing(files: Iterable[str], roots: set[str]) -> set[str]:
    """The modules (`json.py`) and packages (`json`, for `json/__init__.py`) among `files`, directly in
    one of `roots`, that shadow a standard module or the runner's own."""
    found = set()
    for rel in files:
        folder, _, name = rel.rpartition("/")
        if folder in roots and shadows(name, False):
            found.add(rel)
        if folder and _is_init(rel):
            above, _, package = folder.rpartition("/")
            if above in roots and shadows(package, True, True):
                found.add(folder)
    return found


def _is_init(rel: str) -> bool:
    name = PurePosixPath(rel).name
    return name.partition(".")[0] == "__init__" and is_module_file(name)


def _parent(rel: str) -> str:
    return rel.rpartition("/")[0]


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
