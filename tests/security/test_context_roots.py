"""A context path is pinned at submit: opened without following a link, known by (st_dev, st_ino), and
checked again at the copy and at the apply, so a link swapped in meanwhile reads and writes nothing
outside the allowed roots.

Before (b4dce12): the copy and the apply opened the folder by name again, so a folder (or a folder above
it) swapped for a symlink after the access check got the outside folder copied into the job, and the
winner's changes written into it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conclave.config.loading import parse_team
from conclave.errors import PathOutsideRoot
from conclave.files.contexts import parse_context_paths
from conclave.files.job_folder import JobFolder
from conclave.files.workspaces import Workspaces
from conclave.jobs.admission.access import Access
from conclave.jobs.context.files import admit, prepare
from conclave.settings import Settings

pytestmark = pytest.mark.anyio
TEAM = parse_team({"agents": [{"model": "local/smollm2"}], "sandbox": "none"}, "t.yaml", {})


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


async def _admitted(tmp_path: Path, project: Path, permission: str = "read"):  # type: ignore[no-untyped-def]
    sources = parse_context_paths([{"path": str(project), "permission": permission}])
    access = Access.local(Settings(home=tmp_path / "state", allowed_roots=str(tmp_path / "allowed")))
    access.check_folder("context_paths[0].path", sources[0].path)  # inside the root: accepted
    return await admit(sources, TEAM)


async def test_a_folder_swapped_for_a_link_after_submit_is_not_copied(tmp_path: Path) -> None:
    outside = _tree(tmp_path / "outside" / "proj", {"secret.txt": "the user's private key\n"})
    for swapped in ("proj", "a"):  # the folder itself, or a folder above it
        project = _tree(tmp_path / "allowed" / "a" / "proj", {"app.py": "print(1)\n"})
        options = await _admitted(tmp_path, project)
        moved = tmp_path / "allowed" / "a" / swapped if swapped == "proj" else tmp_path / "allowed" / "a"
        moved.rename(moved.with_name(moved.name + ".orig"))
        moved.symlink_to(outside if swapped == "proj" else outside.parent)
        job = JobFolder(tmp_path, f"job-{swapped}")
        with pytest.raises(PathOutsideRoot, match="since the job was submitted"):
            await prepare(job, options)
        assert not list(tmp_path.glob("job-*/**/secret.txt"))
        moved.unlink()
        shutil.rmtree(moved.with_name(moved.name + ".orig"))


async def test_a_folder_replaced_by_another_is_refused_by_identity(tmp_path: Path) -> None:
    project = _tree(tmp_path / "allowed" / "proj", {"app.py": "print(1)\n"})
    options = await _admitted(tmp_path, project)
    project.rename(tmp_path / "allowed" / "proj.orig")
    _tree(project, {"other.txt": "not the folder that was checked\n"})
    with pytest.raises(PathOutsideRoot, match="replaced by another folder"):
        await prepare(JobFolder(tmp_path, "job"), options)


async def test_a_folder_swapped_for_a_link_after_the_copy_is_not_written_at_apply(tmp_path: Path) -> None:
    project = _tree(tmp_path / "allowed" / "proj", {"app.py": "v1\n"})
    options = await _admitted(tmp_path, project, "write")
    spaces = Workspaces(JobFolder(tmp_path, "job"))
    await spaces.prepare(list(options.context_paths))
    await spaces.create(["A"])
    (spaces.agent("A") / "proj" / "app.py").write_text("v2 from the team\n")
    await spaces.snapshot("A", "A1")
    await spaces.finalize("A1")
    outside = tmp_path / "outside" / "proj"  # the same files, so no conflict gives the swap away
    shutil.copytree(project, outside)
    project.rename(tmp_path / "allowed" / "proj.orig")
    project.symlink_to(outside)
    with pytest.raises(PathOutsideRoot, match="since the job was submitted") as refused:
        await spaces.apply("proj")
    assert "/proc/self/fd" not in str(refused.value)
    assert (outside / "app.py").read_text() == "v1\n"
    project.unlink()
    (tmp_path / "allowed" / "proj.orig").rename(project)  # back in place: the apply goes through
    await spaces.apply("proj")
    assert (project / "app.py").read_text() == "v2 from the team\n"
