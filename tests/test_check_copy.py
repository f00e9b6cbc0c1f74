"""A check's copy (files/check_copy.py) is what apply would write to the caller's folder, built as scratch;
the digest its kept baseline is found by (coordination/baselines.py) reads no file again."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import anyio.to_thread
import pytest

from conclave.files import apply as applying
from conclave.files.contexts import ContextPath
from conclave.files.job_folder import JobFolder
from conclave.files.protect import DEFAULT_PROTECT, Protection, restore
from conclave.files.trees import read_bytes, sha256_file, tree_digest
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
    workspaces = Workspaces(JobFolder(tmp_path, "job"))
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
    copy = await anyio.to_thread.run_sync(workspaces.check_copy, "A1")
    assert synced == []  # scratch: removed after its check, never the caller's files
    await workspaces.apply("proj")
    assert len(synced) == 3  # apply writes each of the three changed files durably

    assert tree(copy.path / "proj") == tree(project)
    assert "pkg/gone/" not in tree(project)
    assert stat.S_IMODE((project / "run.sh").stat().st_mode) & 0o111
    assert applying.git_mode(None, False) == stat.S_IMODE((copy.path / "proj" / "new.py").stat().st_mode)


async def test_the_check_copys_diff_reads_from_base_only_the_files_the_answer_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    for name in ("calc.py", "keep.py", "run.sh", "gone.py"):
        (project / name).write_text(f"# {name}\nX = 1\n")
    workspaces = Workspaces(JobFolder(tmp_path, "job"))
    await workspaces.prepare([ContextPath(path=str(project))])
    await workspaces.create(["A"])
    mine = workspaces.agent("A") / "proj"
    (mine / "calc.py").write_text("# calc.py\nX = 2\n")  # the same size: only its content tells
    (mine / "run.sh").chmod(0o755)  # the same content: only its mode tells
    (mine / "gone.py").unlink()
    await workspaces.snapshot("A", "A1")  # files written just now: copied, not linked to base/

    reads: list[tuple[Path, str]] = []

    def reading(root: Path, rel: str) -> bytes:
        reads.append((root, rel))
        return read_bytes(root, rel)

    monkeypatch.setattr("conclave.files.diff.read_bytes", reading)
    copy = await anyio.to_thread.run_sync(workspaces.check_copy, "A1")
    # the file left as it was has the digest and mode it was copied into base/ with: not read again
    assert sorted(rel for root, rel in reads if root == workspaces.base / "proj") == [
        "calc.py",
        "gone.py",
        "run.sh",
    ]
    done = copy.path / "proj"
    assert sorted(path.name for path in done.iterdir()) == ["calc.py", "keep.py", "run.sh"]
    assert (done / "calc.py").read_text().endswith("X = 2\n") and (done / "run.sh").stat().st_mode & 0o100


async def test_protected_files_the_answers_patch_left_alone_are_not_hashed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    for name in ("calc.py", "test_kept.py", "test_changed.py"):
        (project / name).write_text(f"# {name}\nX = 1\n")
    workspaces = Workspaces(JobFolder(tmp_path, "job"))
    await workspaces.prepare([ContextPath(path=str(project))])
    await workspaces.create(["A"])
    mine = workspaces.agent("A") / "proj"
    (mine / "test_changed.py").write_text("# test_changed.py\nX = 2\n")  # the answer edits a test
    (mine / "calc.py").write_text("X = 3\n")
    await workspaces.snapshot("A", "A1")
    copy = await anyio.to_thread.run_sync(workspaces.check_copy, "A1")
    assert copy.written == {"proj": {"calc.py", "test_changed.py"}}

    hashed: list[str] = []

    def hashing(root: Path, rel: str) -> str:
        hashed.append(rel)
        return sha256_file(root, rel)

    monkeypatch.setattr("conclave.files.protect.sha256_file", hashing)
    mine, base = copy.path / "proj", workspaces.base / "proj"
    changed = restore(mine, base, Protection(DEFAULT_PROTECT), written=copy.written["proj"])
    assert changed == ["test_changed.py"] and sorted(set(hashed)) == ["test_changed.py"]
    assert (mine / "test_changed.py").read_text().endswith("X = 1\n")  # put back as the caller had it
    assert (mine / "calc.py").read_text() == "X = 3\n"


async def test_a_patch_that_writes_nothing_leaves_nothing_to_put_back_and_nothing_is_walked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "proj"
    (project / "tests").mkdir(parents=True)
    (project / "tests" / "test_calc.py").write_text("def test_x():\n    assert True\n")
    workspaces = Workspaces(JobFolder(tmp_path, "job"))
    await workspaces.prepare([ContextPath(path=str(project))])
    await workspaces.create(["A"])
    await workspaces.snapshot("A", "A1")  # the answer changed nothing
    copy = await anyio.to_thread.run_sync(workspaces.check_copy, "A1")
    assert copy.written["proj"] == frozenset()
    walked: list[Path] = []
    monkeypatch.setattr("conclave.files.protect.list_tree", lambda root: walked.append(root))
    protection = Protection(DEFAULT_PROTECT)
    assert (
        restore(copy.path / "proj", workspaces.base / "proj", protection, written=copy.written["proj"]) == []
    )
    assert walked == []


async def test_the_base_digest_is_the_trees_and_takes_contents_from_the_manifest(tmp_path: Path) -> None:
    digests = []
    for n, names in enumerate((["calc.py"], ["calc.py", "other.py"])):  # one context, then two
        sources = []
        for name in names:
            project = tmp_path / f"{n}-{name}" / name.removesuffix(".py")
            (project / "sub").mkdir(parents=True)
            (project / "sub" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
            (project / "run.sh").write_text("echo hi\n")
            (project / "run.sh").chmod(0o755)
            sources.append(ContextPath(path=str(project)))
        workspaces = Workspaces(JobFolder(tmp_path, f"job{n}"))
        await workspaces.prepare(sources)
        first = workspaces.manifest().contexts[0]
        if n == 0:  # one context: the digest is its tree's, as the key always was (kept runs still match)
            assert workspaces.base_digest() == tree_digest(workspaces.base / first.name)
        digests.append(workspaces.base_digest())
        assert workspaces.manifest().digest == digests[-1]  # recorded by prepare: no walk at a check
        # a manifest from before the digest was recorded: a walk of base/, contents from the manifest
        manifest = workspaces.folder.manifest
        manifest.write_text(workspaces.manifest().model_copy(update={"digest": None}).model_dump_json())
        older = Workspaces(workspaces.folder)
        assert older.base_digest() == digests[-1]
        # the same size, other bytes, behind the manifest's back: a digest that read the file would move
        (older.base / first.name / "sub" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
        assert older.base_digest() == digests[-1]
        (older.base / first.name / "run.sh").chmod(0o644)  # a mode is read from base/ (listed once a process)
        assert Workspaces(workspaces.folder).base_digest() != digests[-1]
    assert digests[0] != digests[1]


async def test_a_check_reads_only_the_answers_files_whose_recorded_digest_is_not_bases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    for n in range(5):  # written just now: the snapshot copies them (racy), never links them from base/
        (project / f"m{n}.py").write_text(f"X = {n}\n")
    workspaces = Workspaces(JobFolder(tmp_path, "job"))
    await workspaces.prepare([ContextPath(path=str(project))])
    await workspaces.create(["A"])
    (workspaces.agent("A") / "proj" / "m1.py").write_text("X = 'changed'\n")
    (workspaces.agent("A") / "proj" / "m2.py").chmod(0o755)  # a mode change alone is a change
    await workspaces.snapshot("A", "A1")
    assert sorted(workspaces.digests("A1")) == [f"proj/m{n}.py" for n in range(5)]

    read: list[str] = []
    real = read_bytes
    monkeypatch.setattr(
        "conclave.files.diff.read_bytes", lambda root, rel: (read.append(rel), real(root, rel))[1]
    )
    copy = await anyio.to_thread.run_sync(workspaces.check_copy, "A1")
    assert sorted(set(read)) == ["m1.py", "m2.py"]  # the unchanged three are neither read nor diffed
    assert (copy.path / "proj" / "m1.py").read_text() == "X = 'changed'\n"
    assert copy.written["proj"] == frozenset({"m1.py", "m2.py"})

    # a record that does not hold (here forged; a snapshot's own is written after it is in place) would
    # put base's file in the check: the record of a label made again is its own, never an earlier one's
    await workspaces.restore(["A"], [])  # A1 was never posted: it goes, and what records it
    assert workspaces.digests("A1") == {}
    workspaces.folder.record("A1.sha256").write_text(json.dumps(workspaces.digests(None)))
    (workspaces.agent("A") / "proj" / "m3.py").write_text("X = 'again'\n")
    await workspaces.snapshot("A", "A1")
    copy = await anyio.to_thread.run_sync(workspaces.check_copy, "A1")
    assert (copy.path / "proj" / "m3.py").read_text() == "X = 'again'\n"


async def test_a_snapshot_records_the_digest_of_a_file_it_links_from_its_origin(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    for n in range(3):
        (project / f"m{n}.py").write_text(f"X = {n}\n")
        os.utime(project / f"m{n}.py", (1e9, 1e9))  # long unchanged: later trees link them
    workspaces = Workspaces(JobFolder(tmp_path, "job"))
    await workspaces.prepare([ContextPath(path=str(project))])
    await workspaces.create(["A"])
    (workspaces.agent("A") / "proj" / "m1.py").write_text("X = 'changed'\n")
    os.utime(workspaces.agent("A") / "proj" / "m1.py", (1.5e9, 1.5e9))  # before A1 is captured: A2 links it
    await workspaces.snapshot("A", "A1")  # links m0 and m2 from base/, copies m1
    await workspaces.snapshot("A", "A2")  # links all three from A1
    base = workspaces.digests(None)
    for label in ("A1", "A2"):
        recorded = workspaces.digests(label)
        assert recorded["proj/m0.py"] == base["proj/m0.py"] and recorded["proj/m2.py"] == base["proj/m2.py"]
        assert recorded["proj/m1.py"] == sha256_file(workspaces.snapshot_dir(label), "proj/m1.py")
    assert (
        os.stat(workspaces.snapshot_dir("A2") / "proj" / "m1.py").st_ino
        == os.stat(workspaces.snapshot_dir("A1") / "proj" / "m1.py").st_ino
    )
