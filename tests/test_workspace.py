"""Workspaces: copying context paths, confinement, snapshots, peer views, diffs and apply (no Docker)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from conclave.errors import (
    ApplyConflict,
    ApplyFailed,
    ContextTooLarge,
    FileTooLarge,
    InputError,
    NotAFile,
    PathOutsideRoot,
)
from conclave.files import apply as applying
from conclave.files import safe
from conclave.files import workspaces as workspaces_module
from conclave.files.contexts import CALLER, Caps, ContextPath, copy_context, copy_context_sync
from conclave.files.diff import diff_trees
from conclave.files.job_folder import JobFolder
from conclave.files.review import Consent
from conclave.files.settling import settle
from conclave.files.trees import CHUNK, copy_file, read_bytes
from conclave.files.workspaces import Workspaces, apply, diff

OLD = time.time() - 3600  # an mtime well before any capture: unchanged files may be reused


def make_tree(root: Path, files: dict[str, str | bytes], *, mtime: float | None = OLD) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        if mtime is not None:
            os.utime(path, (mtime, mtime))
    root.mkdir(parents=True, exist_ok=True)
    return root


def read_tree(root: Path) -> dict[str, bytes]:
    """Every file under root, hidden ones included, as {posix path: bytes}."""
    out = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = Path(directory, name)
            out[path.relative_to(root).as_posix()] = path.read_bytes()
    return out


def copied(tmp_path: Path, source: Path, caps: Caps = Caps()):
    manifest = copy_context_sync([ContextPath(path=str(source))], tmp_path / "dest", caps)
    return manifest.contexts[0], tmp_path / "dest" / source.name


# -- copying context paths ---------------------------------------------------------------------


def test_gitignore_root_nested_and_negation(tmp_path):
    src = make_tree(
        tmp_path / "proj",
        {
            ".gitignore": "*.log\n!keep.log\nbuild/\n/top.txt\n",
            "a.log": "x",
            "keep.log": "k",
            "top.txt": "t",
            "build/out.o": "o",
            "src/build/gen.py": "g",
            "src/top.txt": "nested top is not anchored at root",
            "src/.gitignore": "secret.txt\n!debug.log\n",
            "src/secret.txt": "s",
            "src/debug.log": "d",
            "src/other.log": "o",
            "src/main.py": "m",
            ".git/info/exclude": "local-only.txt\n",
            "local-only.txt": "l",
        },
    )
    context, dest = copied(tmp_path, src)
    assert sorted(context.files) == [
        ".gitignore",
        "keep.log",
        "src/.gitignore",
        "src/debug.log",
        "src/main.py",
        "src/top.txt",
    ]
    assert sorted(read_tree(dest)) == sorted(context.files)


def test_git_dir_skipped(tmp_path):
    src = make_tree(
        tmp_path / "proj",
        {
            ".git/HEAD": "ref",
            ".git/objects/ab/cd": "x",
            "lib/.git": "gitdir: ../.git/modules/lib",
            "lib/code.py": "print()",
        },
    )
    context, dest = copied(tmp_path, src)
    assert sorted(context.files) == ["lib/code.py"]
    assert not (dest / ".git").exists() and not (dest / "lib/.git").exists()


def test_manifest_records_size_mode_and_sha256(tmp_path):
    binary = bytes(range(256)) * 4
    src = make_tree(tmp_path / "proj", {"bin.dat": binary, "run.sh": "#!/bin/sh\n"})
    (src / "run.sh").chmod(0o755)
    context, dest = copied(tmp_path, src)
    assert context.files["bin.dat"].sha256 == hashlib.sha256(binary).hexdigest()
    assert context.files["bin.dat"].size == 1024
    assert context.files["run.sh"].mode == 0o755
    assert (dest / "bin.dat").read_bytes() == binary
    assert os.stat(dest / "run.sh").st_mode & 0o777 == 0o755


def test_cap_on_file_count_refuses_before_copying(tmp_path):
    src = make_tree(tmp_path / "proj", {f"node_modules/m{i}.js": "x" for i in range(12)} | {"a.py": "a"})
    with pytest.raises(ContextTooLarge) as caught:
        copy_context_sync([ContextPath(path=str(src))], tmp_path / "dest", Caps(max_files=10))
    message = str(caught.value)
    assert "13 files after .gitignore" in message and "cap of 10 files" in message
    assert "node_modules (12 files)" in message and ".gitignore entry" in message
    assert not (tmp_path / "dest").exists()


def test_cap_on_bytes_refuses_before_copying(tmp_path):
    src = make_tree(tmp_path / "proj", {"small.txt": "x", "data/big.bin": b"\0" * 3_000_000})
    with pytest.raises(ContextTooLarge) as caught:
        copy_context_sync([ContextPath(path=str(src))], tmp_path / "dest", Caps(max_bytes=1_000_000))
    assert "2.9 MB after .gitignore" in str(caught.value) and "cap of 1.0 MB" in str(caught.value)
    assert "data (2.9 MB)" in str(caught.value)
    assert not (tmp_path / "dest").exists()


def test_gitignored_files_do_not_count_against_caps(tmp_path):
    modules = {f"node_modules/{i}": "x" for i in range(50)}
    src = make_tree(tmp_path / "proj", {".gitignore": "node_modules/\n"} | modules)
    context, _ = copied(tmp_path, src, Caps(max_files=5))
    assert list(context.files) == [".gitignore"]


def test_missing_path_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ValidationError) as caught:
        ContextPath.model_validate({"path": str(tmp_path / "nope")}, context=CALLER)
    text = str(caught.value)
    assert "path" in text and "it does not exist; give an existing directory" in text


def test_file_instead_of_directory_is_refused(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(ValidationError, match="is a file, not a directory; give the folder"):
        ContextPath.model_validate({"path": str(tmp_path / "f.txt")}, context=CALLER)
    with pytest.raises(ValidationError, match="permission"):
        ContextPath.model_validate({"path": str(tmp_path), "permission": "admin"}, context=CALLER)
    with pytest.raises(ValidationError, match="is empty"):
        ContextPath.model_validate({"path": " "}, context=CALLER)


def test_same_folder_twice_is_refused(tmp_path):
    paths = [ContextPath(path=str(tmp_path)), ContextPath(path=str(tmp_path), permission="write")]
    with pytest.raises(InputError, match="listed twice"):
        copy_context_sync(paths, tmp_path.parent / "dest-twice")


def test_context_names_are_unique(tmp_path):
    one = make_tree(tmp_path / "a" / "app", {"x": "1"})
    two = make_tree(tmp_path / "b" / "app", {"y": "2"})
    manifest = copy_context_sync([ContextPath(path=str(one)), ContextPath(path=str(two))], tmp_path / "dest")
    assert [c.name for c in manifest.contexts] == ["app", "app-2"]
    assert (tmp_path / "dest/app/x").exists() and (tmp_path / "dest/app-2/y").exists()


def test_symlinks_and_fifos_are_skipped_not_followed(tmp_path):
    outside = make_tree(tmp_path / "outside", {"secret.txt": "s"})
    src = make_tree(tmp_path / "proj", {"real.txt": "r"})
    (src / "link.txt").symlink_to(outside / "secret.txt")
    (src / "linkdir").symlink_to(outside)
    (src / "inside.txt").symlink_to("real.txt")
    os.mkfifo(src / "pipe")
    context, dest = copied(tmp_path, src)
    assert list(context.files) == ["real.txt"]
    assert set(context.skipped) == {"link.txt", "linkdir", "inside.txt", "pipe"}
    assert "symlink" in context.skipped["link.txt"] and "FIFO" in context.skipped["pipe"]
    assert sorted(os.listdir(dest)) == ["real.txt"]


def copy_as_nobody(src: Path, dest: Path) -> dict:
    """copy_context_sync in a forked child that dropped root (root reads mode-000 files anyway)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 1
        try:
            os.close(read_end)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            context = copy_context_sync([ContextPath(path=str(src))], dest).contexts[0]
            result = {"files": sorted(context.files), "skipped": context.skipped}
            os.write(write_end, json.dumps(result).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        output = pipe.read()
    assert os.waitpid(pid, 0)[1] == 0, "the unprivileged copy failed"
    return json.loads(output)


def test_unreadable_file_is_skipped_and_listed():
    work = Path(tempfile.mkdtemp(prefix="conclave-unreadable-"))  # outside root's private pytest dir
    try:
        work.chmod(0o777)
        src = make_tree(work / "proj", {"ok.txt": "fine", "locked.txt": "secret"})
        src.chmod(0o755)
        (src / "ok.txt").chmod(0o644)
        (src / "locked.txt").chmod(0o000)
        result = copy_as_nobody(src, work / "dest")
        assert result["files"] == ["ok.txt"]
        assert result["skipped"]["locked.txt"] == "unreadable, not copied: Permission denied"
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.anyio
async def test_copy_context_async_wrapper(tmp_path):
    src = make_tree(tmp_path / "proj", {"a.txt": "a"})
    manifest = await copy_context([ContextPath(path=str(src), permission="write")], tmp_path / "dest")
    assert manifest.contexts[0].permission == "write" and list(manifest.contexts[0].files) == ["a.txt"]


# -- confinement --------------------------------------------------------------------------------


@pytest.fixture
def root(tmp_path):
    make_tree(tmp_path / "outside", {"secret.txt": "s"})
    root = make_tree(tmp_path / "root", {"src/app.py": "a", "docs/readme.md": "r"})
    (root / "out.txt").symlink_to(tmp_path / "outside" / "secret.txt")
    (root / "outdir").symlink_to(tmp_path / "outside")
    (root / "dangling").symlink_to(tmp_path / "outside" / "missing")
    (root / "inlink").symlink_to("src")
    return root


@pytest.mark.parametrize(
    "relative, reason",
    [
        ("../outside/secret.txt", "'..' leads outside"),
        ("src/../../outside", "'..' leads outside"),
        ("/etc/passwd", "absolute paths"),
        ("out.txt", "symlink"),
        ("outdir/secret.txt", "symlink"),
        ("dangling", "symlink"),
        ("inlink/app.py", "symlink"),  # a link is never followed, even one that stays inside
        ("inlink/../../outside", "'..' leads outside"),
        ("src/\x00x", "NUL byte"),
        ("src/\udc80x", "not valid UTF-8"),
    ],
)
def test_the_walk_refuses_escapes_and_links(root, relative, reason):
    with pytest.raises(PathOutsideRoot, match=reason) as caught:
        safe.read_bytes(root, relative)
    assert caught.value.field == "path" and "relative to the root" in str(caught.value)
    assert str(root) not in str(caught.value)


@pytest.mark.parametrize(
    "relative, expected",
    [
        ("src/app.py", b"a"),
        ("./src/app.py", b"a"),
        ("src/../docs/readme.md", b"r"),
        ("docs//readme.md", b"r"),
    ],
)
def test_the_walk_reads_paths_inside(root, relative, expected):
    assert safe.read_bytes(root, relative) == expected


def test_writes_replace_links_and_fifos_instead_of_writing_through_them(root, tmp_path):
    safe.write_bytes(root, "out.txt", b"mine")
    os.mkfifo(root / "pipe")
    safe.write_bytes(root, "pipe", b"not blocked")
    assert (tmp_path / "outside" / "secret.txt").read_bytes() == b"s"
    assert (root / "out.txt").read_bytes() == b"mine" and not (root / "out.txt").is_symlink()
    assert (root / "pipe").read_bytes() == b"not blocked"
    with pytest.raises(PathOutsideRoot, match="symlink"):
        safe.write_bytes(root, "outdir/new-file.txt", b"x")
    assert not (tmp_path / "outside" / "new-file.txt").exists()
    assert safe.write_bytes(root, "new/dir/file.txt", b"abc") == safe.Written(0, 3)
    assert safe.write_bytes(root, "new/dir/file.txt", b"abcdef") == safe.Written(3, 6)
    assert sorted(os.listdir(root / "new" / "dir")) == ["file.txt"]  # no temporary file left


def test_size_is_checked_before_reading(root):
    with open(root / "sparse", "wb") as handle:
        handle.truncate(6 * 2**30)
    with pytest.raises(FileTooLarge, match="6,442,450,944 bytes"):
        safe.read_bytes(root, "sparse", 1 << 20)
    assert safe.read_bytes(root, "src/app.py", 1) == b"a"


def test_files_are_read_and_copied_whole_across_chunks_and_cut_at_their_cap(root, tmp_path):
    data = os.urandom(2 * CHUNK + 12_345)  # unbuffered reads and writes: several rounds each
    (root / "big.bin").write_bytes(data)
    assert safe.read_bytes(root, "big.bin") == data
    assert safe.read_bytes(root, "big.bin", len(data)) == data
    digest = copy_file(root, "big.bin", tmp_path / "copy.bin")
    assert (tmp_path / "copy.bin").read_bytes() == data and digest == hashlib.sha256(data).hexdigest()
    copy_file(root, "big.bin", tmp_path / "cut.bin", max_bytes=CHUNK + 1)  # the size a listing saw
    assert (tmp_path / "cut.bin").read_bytes() == data[: CHUNK + 1]


def test_settle_clears_unsafe_bits_and_never_follows_links(root, tmp_path):
    outside = tmp_path / "outside" / "secret.txt"
    os.chmod(outside, 0o4777)
    make_tree(root, {"tool": "x", "sub/shared": "y"})
    os.chmod(root / "tool", 0o6755)
    os.chmod(root / "sub", 0o2777)
    os.chmod(root / "sub" / "shared", 0o666)
    report = settle(root)
    assert stat.S_IMODE(os.stat(root / "tool").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(root / "sub").st_mode) == 0o775
    assert stat.S_IMODE(os.stat(root / "sub" / "shared").st_mode) == 0o664
    assert stat.S_IMODE(os.stat(outside).st_mode) == 0o4777  # reached only through links: untouched
    assert report.stripped == 3 and report.total_bytes == sum(
        os.lstat(p).st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink()
    )


def test_reading_follows_no_symlink_and_never_blocks_on_a_fifo(root):
    assert read_bytes(root, "src/app.py") == b"a"
    for through_a_link in ("out.txt", "outdir/secret.txt", "inlink/app.py"):
        with pytest.raises(PathOutsideRoot):
            read_bytes(root, through_a_link)
    os.mkfifo(root / "pipe")
    with pytest.raises(NotAFile, match="a FIFO, not a regular file"):
        read_bytes(root, "pipe")


# -- workspaces, snapshots, peers ---------------------------------------------------------------


@pytest.fixture
async def job(tmp_path):
    src = make_tree(
        tmp_path / "proj",
        {
            "app.py": "print('hi')\n",
            "lib/util.py": "def f():\n    return 1\n",
            "data.bin": b"\0\1\2",
        },
    )
    spaces = Workspaces(JobFolder(tmp_path / "jobs", "j1"))
    await spaces.prepare([ContextPath(path=str(src), permission="write")])
    await spaces.create(["A", "B", "C"])
    return spaces


@pytest.mark.anyio
async def test_create_copies_base_without_sharing_inodes(job):
    base = job.base / "proj" / "app.py"
    for letter in "ABC":
        mine = job.agent(letter) / "proj" / "app.py"
        assert mine.read_text() == "print('hi')\n"
        assert os.stat(mine).st_ino != os.stat(base).st_ino
    assert job.manifest().get("proj").permission == "write"


@pytest.mark.anyio
async def test_agent_copies_can_belong_to_the_sandbox_user(tmp_path):
    src = make_tree(tmp_path / "proj", {"sub/a.txt": "a"})
    spaces = Workspaces(JobFolder(tmp_path, "job"), agent_owner=(1000, 1000))
    await spaces.prepare([ContextPath(path=str(src))])
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root; this run is not root")
    await spaces.create(["A"])
    for path in (spaces.agent("A"), spaces.agent("A") / "proj/sub", spaces.agent("A") / "proj/sub/a.txt"):
        assert (os.stat(path).st_uid, os.stat(path).st_gid) == (1000, 1000)
    assert os.stat(spaces.base / "proj/sub/a.txt").st_uid == 0


@pytest.mark.anyio
async def test_snapshot_is_isolated_from_later_edits(job):
    work = job.agent("B") / "proj"
    (work / "app.py").write_text("print('v1')\n")
    snap = await job.snapshot("B", "B1")
    (work / "app.py").write_text("print('v2')\n")
    (work / "lib" / "util.py").unlink()
    assert (snap / "proj" / "app.py").read_text() == "print('v1')\n"
    assert (snap / "proj" / "lib" / "util.py").exists()
    for name in ("app.py", "lib/util.py", "data.bin"):  # agents/ never shares an inode with a snapshot
        if (work / name).exists():
            assert os.stat(work / name).st_ino != os.stat(snap / "proj" / name).st_ino
    snap2 = await job.snapshot("B", "B2")
    assert (snap2 / "proj" / "app.py").read_text() == "print('v2')\n"
    assert not (snap2 / "proj" / "lib" / "util.py").exists()
    assert (snap / "proj" / "app.py").read_text() == "print('v1')\n"


def _app(tree: Path) -> str:
    return (tree / "proj" / "app.py").read_text()


@pytest.mark.anyio
async def test_restore_rebuilds_the_working_copies_from_the_answers_the_journal_kept(job):
    """A resumed job (jobs/upkeep/takeover.py): each copy starts from its latest kept answer, a snapshot the
    journal never recorded is dropped, one recorded but never made is made from its author's copy."""
    (job.agent("A") / "proj" / "app.py").write_text("print('A1')\n")
    await job.snapshot("A", "A1")
    (job.agent("A") / "proj" / "app.py").write_text("print('a turn in flight')\n")
    (job.agent("B") / "proj" / "app.py").write_text("print('B1')\n")
    await job.snapshot("B", "B1")
    (job.agent("B") / "proj" / "app.py").write_text("print('B2, never journaled')\n")
    await job.snapshot("B", "B2")
    (job.agent("C") / "proj" / "app.py").write_text("print('C1')\n")  # journaled, not snapshotted
    await job.publish("A", "A1")
    restored = await job.restore(["A", "B", "C"], ["A1", "B1", "C1"])
    assert restored.lost == [] and sorted(os.listdir(job.folder.snapshots)) == ["A1", "B1", "C1"]
    assert not {"B2", "B2.held"} & set(os.listdir(job.folder.meta))  # its records go with it
    assert _app(job.snapshot_dir("C1")) == "print('C1')\n"
    for letter in "ABC":
        assert _app(job.agent(letter)) == f"print('{letter}1')\n"
    assert restored.sizes["A"] == sum(p.stat().st_size for p in job.agent("A").rglob("*") if p.is_file())
    assert not job.folder.peers.exists()  # published again once the containers are known


@pytest.mark.anyio
async def test_restore_names_an_answer_left_without_files_and_starts_its_author_from_base(job):
    shutil.rmtree(job.agent("C"))  # its author's copy is gone too: nothing to snapshot it from
    restored = await job.restore(["A", "B", "C"], ["C1"])
    assert restored.lost == ["C1"] and _app(job.agent("C")) == "print('hi')\n"


@pytest.mark.anyio
async def test_snapshot_links_unchanged_files_and_copies_changed_ones(job):
    work = job.agent("A") / "proj"
    (work / "app.py").write_text("print('yo')\n")
    snap = await job.snapshot("A", "A1")
    base_util = os.stat(job.base / "proj" / "lib" / "util.py")
    assert os.stat(snap / "proj" / "lib" / "util.py").st_ino == base_util.st_ino  # unchanged: linked
    assert os.stat(snap / "proj" / "app.py").st_nlink == 1  # changed: copied
    assert (snap / "proj" / "app.py").read_text() == "print('yo')\n"
    assert (job.base / "proj" / "app.py").read_text() == "print('hi')\n"


@pytest.mark.anyio
async def test_snapshot_copies_a_racy_file_even_with_the_same_size_and_mtime(job):
    # A file rewritten within one filesystem clock tick keeps its mtime; git's racy-clean rule: a file
    # whose mtime is near the reference tree's capture proves nothing, so it is copied, not reused.
    work = job.agent("A") / "proj"
    (work / "new.txt").write_text("n")
    snap = await job.snapshot("A", "A1")
    (work / "new.txt").write_text("m")
    os.utime(work / "new.txt", ns=(os.stat(snap / "proj/new.txt").st_mtime_ns,) * 2)
    snap2 = await job.snapshot("A", "A2")
    assert (snap2 / "proj" / "new.txt").read_text() == "m"
    assert (snap / "proj" / "new.txt").read_text() == "n"


@pytest.mark.anyio
async def test_snapshot_refuses_a_workspace_over_its_caps(tmp_path, monkeypatch):
    monkeypatch.setattr(workspaces_module, "WORKSPACE_CAPS", Caps(max_files=5))
    spaces = Workspaces(JobFolder(tmp_path, "job"))
    await spaces.prepare([])
    await spaces.create(["A"])
    make_tree(spaces.agent("A"), {f"gen/{i}.o": "x" for i in range(8)})
    refused = "agent A's workspace holds more than 5 files.*delete generated"
    with pytest.raises(ContextTooLarge, match=refused):
        await spaces.snapshot("A", "A1")
    assert spaces.latest() == {} and not spaces.folder.snapshots.exists()


@pytest.mark.anyio
async def test_peer_view_shows_each_other_agents_latest_snapshot(job):
    assert job.peer_view("A") == {}
    await job.snapshot("B", "B1")
    await job.snapshot("C", "C1")
    await job.snapshot("B", "B2")
    await job.snapshot("A", "A1")
    # one context path: peers see the project folder of each snapshot, as the agent sees its own
    folder = job.folder
    assert job.peer_view("A") == {"B": folder.snapshot("B2") / "proj", "C": folder.snapshot("C1") / "proj"}
    assert job.peer_view("B") == {"A": folder.snapshot("A1") / "proj", "C": folder.snapshot("C1") / "proj"}
    assert job.latest() == {"A": "A1", "B": "B2", "C": "C1"}
    with pytest.raises(FileExistsError):
        await job.snapshot("B", "B2")
    with pytest.raises(ValueError, match="does not belong"):
        await job.snapshot("A", "B3")


@pytest.mark.anyio
async def test_labels_and_sources_are_validated(job):
    for bad in ("../base", "B0", "b1", "BB1", "B1/../../x", "final/.."):
        with pytest.raises(InputError):
            job.source(bad)
    with pytest.raises(InputError, match="nothing there yet"):
        job.source("B7")
    with pytest.raises(InputError, match="one capital letter"):
        job.agent("../A")
    assert job.source("base") == job.base


@pytest.mark.anyio
async def test_finalize_from_label(job):
    work = job.agent("C") / "proj"
    (work / "app.py").write_text("print('answer')\n")
    await job.snapshot("C", "C1")
    (work / "app.py").write_text("print('presented')\n")
    final = await job.finalize("C1")
    assert (final / "proj" / "app.py").read_text() == "print('answer')\n"
    assert job.source("final") == job.final
    assert [p.name for p in job.folder.root.iterdir() if p.name.startswith(".")] == []


# -- diffs --------------------------------------------------------------------------------------


BASE_FILES = {
    "keep.txt": "same\n",
    "mod.py": "".join(f"line {i}\n" for i in range(1, 21)),
    "gone.txt": "bye\nnow\n",
    "tail.txt": "no newline at end",
    "img.png": b"\x89PNG\r\n\x1a\n\0\0binary",
    "with space.txt": "a\n",
    "empty-gone.txt": "",
}
FINAL_FILES = {
    "keep.txt": "same\n",
    "mod.py": "".join(f"line {i}\n" for i in range(1, 21))
    .replace("line 3\n", "line three\n")
    .replace("line 18\n", "line 18\nline 18b\n"),
    "tail.txt": "no newline at end, changed",
    "img.png": b"\x89PNG\r\n\x1a\n\0\0BINARY!",
    "new/dir/added.txt": "fresh\nfile\n",
    "with space.txt": "b\n",
    "empty-new.txt": "",
    "caf\u00e9.md": "accent\n",
}


def trees(tmp_path: Path) -> tuple[Path, Path]:
    return make_tree(tmp_path / "base", BASE_FILES), make_tree(tmp_path / "final", FINAL_FILES)


def git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    # git's output must not depend on the machine or on what other tests left in the environment
    clean = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env = {
        **clean,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "HOME": str(cwd),
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)


def git_repo(tmp_path: Path, name: str, files: dict) -> Path:
    repo = make_tree(tmp_path / name, files)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    assert git(repo, "commit", "-qm", "base").returncode == 0
    return repo


def test_diff_summary(tmp_path):
    patch = diff_trees(*trees(tmp_path))
    summary = {f.path: (f.status, f.change, f.added_lines, f.removed_lines) for f in patch.files}
    assert summary == {
        "caf\u00e9.md": ("added", "added", 1, 0),
        "empty-gone.txt": ("deleted", "deleted", 0, 0),
        "empty-new.txt": ("added", "added", 0, 0),
        "gone.txt": ("deleted", "deleted", 0, 2),
        "img.png": ("binary", "modified", 0, 0),
        "mod.py": ("modified", "modified", 2, 1),
        "new/dir/added.txt": ("added", "added", 2, 0),
        "tail.txt": ("modified", "modified", 1, 1),
        "with space.txt": ("modified", "modified", 1, 1),
    }
    assert (patch.added_lines, patch.removed_lines) == (7, 5)
    assert "Binary files a/img.png and b/img.png differ" in patch.text
    assert "BINARY" not in patch.text


def test_diff_text_matches_git_exactly(tmp_path):
    text_only = {k: v for k, v in BASE_FILES.items() if k != "img.png"}
    final_text = {k: v for k, v in FINAL_FILES.items() if k != "img.png"}
    base, final = make_tree(tmp_path / "base", text_only), make_tree(tmp_path / "final", final_text)
    (base / "mod.py").chmod(0o644)
    (final / "mod.py").chmod(0o755)  # a mode change rides along with a content change
    repo = git_repo(tmp_path, "repo", text_only)
    (repo / "mod.py").chmod(0o644)
    shutil.rmtree(repo / "new", ignore_errors=True)
    for rel in text_only:
        (repo / rel).unlink()
    make_tree(repo, final_text)
    (repo / "mod.py").chmod(0o755)
    # Git trusts an index entry whose stat data still matches; a same-size file rewritten within the
    # kernel's coarse timestamp tick (and given the unlinked file's inode) matches, so git would miss
    # the change. Dropping the index makes git hash every file.
    git(repo, "rm", "-rq", "--cached", ".")
    git(repo, "add", "-A")
    expected = git(repo, "-c", "core.abbrev=7", "diff", "--cached", "--no-renames").stdout
    assert diff_trees(base, final).text == expected


def test_no_trailing_newline_markers(tmp_path):
    base = make_tree(tmp_path / "b", {"t.txt": "a\nb"})
    final = make_tree(tmp_path / "f", {"t.txt": "a\nb\n"})
    expected = "@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+b\n"
    assert diff_trees(base, final).text.endswith(expected)


def test_git_apply_and_patch_accept_the_patch(tmp_path):
    base_files = {k: v for k, v in BASE_FILES.items() if k != "img.png"}
    final_files = {k: v for k, v in FINAL_FILES.items() if k != "img.png"}
    base, final = make_tree(tmp_path / "base", base_files), make_tree(tmp_path / "final", final_files)
    patch_file = tmp_path / "change.patch"
    patch_file.write_text(diff_trees(base, final).text)
    repo = git_repo(tmp_path, "repo", base_files)
    check = git(repo, "apply", "--check", str(patch_file))
    assert check.returncode == 0, check.stderr
    assert git(repo, "apply", str(patch_file)).returncode == 0
    assert _without_git(read_tree(repo)) == read_tree(final)
    plain = make_tree(tmp_path / "plain", base_files)
    command = ["patch", "-p1", "-s", "-i", str(patch_file)]
    run = subprocess.run(command, cwd=plain, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert read_tree(plain) == read_tree(final)


def _without_git(files: dict[str, bytes]) -> dict[str, bytes]:
    return {k: v for k, v in files.items() if not k.startswith(".git/")}


def test_diff_respects_final_gitignore_but_keeps_tracked_files(tmp_path):
    rules = {".gitignore": "__pycache__/\n*.tmp\n", "a.py": "a\n"}
    base = make_tree(tmp_path / "b", rules | {"keep.tmp": "t\n"})
    made = {"keep.tmp": "u\n", "__pycache__/a.pyc": b"\0pyc", "scratch.tmp": "s", "b.py": "b\n"}
    final = make_tree(tmp_path / "f", rules | made)
    (final / "link").symlink_to("/etc/passwd")
    patch = diff_trees(base, final)
    assert [f.path for f in patch.files] == ["b.py", "keep.tmp"]
    assert "link" in patch.skipped and "passwd" not in patch.text


@pytest.mark.anyio
async def test_workspace_diffs_per_context(job):
    (job.agent("B") / "proj" / "app.py").write_text("print('hello')\n")
    await job.snapshot("B", "B1")
    await job.finalize("B1")
    patches = await job.diffs()
    assert list(patches) == ["proj"]
    assert [f.path for f in patches["proj"].files] == ["app.py"]
    assert "-print('hi')\n+print('hello')\n" in patches["proj"].text
    same = await diff(job.base / "proj", job.base / "proj")
    assert same.empty and same.text == ""


# -- apply ---------------------------------------------------------------------------------------


@pytest.fixture
async def applied_job(tmp_path):
    src = make_tree(
        tmp_path / "proj",
        {
            "app.py": "v1\n",
            "old.txt": "old\n",
            "dir/only.txt": "x\n",
            "logo.bin": b"\0\1",
            "same.txt": "s\n",
        },
    )
    spaces = Workspaces(JobFolder(tmp_path, "job"))
    await spaces.prepare([ContextPath(path=str(src), permission="write")])
    await spaces.create(["A"])
    work = spaces.agent("A") / "proj"
    (work / "app.py").write_text("v2\n")
    (work / "old.txt").unlink()
    shutil.rmtree(work / "dir")
    (work / "logo.bin").write_bytes(b"\0\2\3")
    make_tree(work, {"pkg/new/mod.py": "new\n"}, mtime=None)
    await spaces.snapshot("A", "A1")
    await spaces.finalize("A1")
    return spaces, src


@pytest.mark.anyio
async def test_apply_success(applied_job):
    spaces, src = applied_job
    changes = await spaces.apply("proj", consent=Consent(force_binary=True))  # logo.bin is binary
    assert (changes.added, sorted(changes.modified), changes.deleted) == (
        ["pkg/new/mod.py"],
        ["app.py", "logo.bin"],
        ["dir/only.txt", "old.txt"],
    )
    assert read_tree(src) == {
        "app.py": b"v2\n",
        "logo.bin": b"\0\2\3",
        "pkg/new/mod.py": b"new\n",
        "same.txt": b"s\n",
    }
    assert not (src / "dir").exists()  # emptied by the deletion, pruned like git does


@pytest.mark.anyio
async def test_apply_conflict_changes_nothing(applied_job):
    spaces, src = applied_job
    (src / "app.py").write_text("edited by the user\n")
    (src / "pkg" / "new").mkdir(parents=True)
    (src / "pkg" / "new" / "mod.py").write_text("user's own\n")
    (src / "dir" / "only.txt").unlink()  # the team also deletes it: that one is no conflict
    (src / "old.txt").write_text("the user's\n")
    before = read_tree(src)
    with pytest.raises(ApplyConflict) as caught:
        await spaces.apply("proj")
    assert caught.value.conflicts == {
        "app.py": "modified since the job started",
        "pkg/new/mod.py": "created since the job started",
        "old.txt": "modified since the job started",
    }
    assert "nothing was applied" in str(caught.value) and "app.py (modified" in str(caught.value)
    assert read_tree(src) == before


@pytest.mark.anyio
async def test_an_apply_made_already_is_no_conflict_and_writes_nothing_again(applied_job):
    """A job resumed after its dead server had applied applies again (files/apply.py): what it finds is its
    own change, file by file, and the rest is written as usual."""
    spaces, src = applied_job
    consent = Consent(force_binary=True)
    first = await spaces.apply("proj", consent=consent)
    after = read_tree(src)
    written = {rel: os.stat(src / rel).st_mtime_ns for rel in after}
    again = await spaces.apply("proj", consent=consent)
    assert (again.added, again.modified, again.deleted) == (first.added, first.modified, first.deleted)
    assert read_tree(src) == after
    assert {rel: os.stat(src / rel).st_mtime_ns for rel in after} == written  # nothing written again
    # half made: the caller's folder has some changes already, and gets the rest
    (src / "app.py").write_text("v1\n")
    (src / "old.txt").write_text("old\n")
    (src / "pkg" / "new" / "mod.py").unlink()
    await spaces.apply("proj", consent=consent)
    assert read_tree(src) == after


@pytest.mark.anyio
async def test_apply_refuses_a_symlink_on_the_way(applied_job, tmp_path):
    spaces, src = applied_job
    shutil.rmtree(src / "dir")
    (tmp_path / "elsewhere").mkdir()
    (src / "dir").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ApplyConflict, match="'dir' is now a symlink or a file"):
        await spaces.apply("proj")


@pytest.mark.anyio
async def test_apply_failure_midway_rolls_back(applied_job, monkeypatch):
    spaces, src = applied_job
    before = read_tree(src)
    real_copy, calls = applying._copy_in, []

    def failing_copy(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real_copy(*args, **kwargs)

    monkeypatch.setattr(applying, "_copy_in", failing_copy)
    with pytest.raises(ApplyFailed, match="No space left on device; every change was rolled back"):
        await spaces.apply("proj", consent=Consent(force_binary=True))
    assert len(calls) == 3
    assert read_tree(src) == before  # also: no temp or backup files left behind
    assert not (src / "pkg").exists()


@pytest.mark.anyio
async def test_apply_needs_write_permission(tmp_path):
    src = make_tree(tmp_path / "proj", {"a.txt": "a"})
    spaces = Workspaces(JobFolder(tmp_path, "job"))
    manifest = await spaces.prepare([ContextPath(path=str(src))])
    with pytest.raises(InputError, match="permission 'write'"):
        await apply(spaces.base / "proj", src, manifest.contexts[0])
