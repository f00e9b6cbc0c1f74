"""A check's copy (files/check_copy.py) is what apply would write to the caller's folder, built as scratch."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from conclave.files import apply as applying
from conclave.files.contexts import ContextPath
from conclave.files.workspaces import Workspaces

pytestmark = pytest.mark.anyio


def tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `root` with its permission bits, and every folder (as empty bytes, mode 0)."""
    found: dict[str, tuple[bytes, int]] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            found[Path(folder, name).relative_to(root).as_posix() + "/"] = (b"", 0)
        for name in files:
            path = Path(folder, name)
            found[path.relative_to(root).as_posix()] = (path.read_bytes(), stat.S_IMODE(path.stat().st_mode))
    return found


async def test_the_check_copy_is_what_apply_writes_without_an_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "proj"
    (project / "pkg" / "gone").mkdir(parents=True)
    (project / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (project / "run.sh").write_text("echo hi\n")
    (project / "pkg" / "gone" / "old.py").write_text("X = 1\n")
    (project / "pkg" / "keep.py").write_text("Y = 2\n")
    workspaces = Workspaces(tmp_path / "job")
    await workspaces.prepare([ContextPath(path=str(project), permission="write")])
    await workspaces.create(["A"])
    mine = workspaces.agent("A") / "proj"
    (mine / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (mine / "run.sh").chmod(0o755)  # the patch's `new mode`
    (mine / "pkg" / "gone" / "old.py").unlink()  # its folder is left empty: apply removes it
    (mine / "new.py").write_text("Z = 3\n")
    await workspaces.snapshot("A", "A1")
    await workspaces.finalize("A1")

    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    copy = await workspaces.check_copy("A1")
    assert synced == []  # scratch: removed after its check, never the caller's files
    await workspaces.apply("proj")
    assert len(synced) == 3  # apply writes each changed file durably: calc.py, new.py, run.sh

    assert tree(copy.path / "proj") == tree(project)
    assert "pkg/gone/" not in tree(project)
    assert stat.S_IMODE((project / "run.sh").stat().st_mode) & 0o111
    assert applying.git_mode(None, False) == stat.S_IMODE((copy.path / "proj" / "new.py").stat().st_mode)
