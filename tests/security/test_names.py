"""Names round-trip or are refused by name, and walks are iterative with their caps checked while walking:
a folder named ` src`, names with trailing spaces or a newline, a name that is not UTF-8, a tree 1,500
folders deep made by a command, and a folder of tens of thousands of entries (server/files/safe.py,
server/files/trees.py, server/coordination/job_files.py)."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from conclave.errors import ContextTooLarge
from conclave.files import safe
from conclave.files.agent_tools import AgentTools
from conclave.files.contexts import ContextPath
from conclave.files.job_folder import JobFolder
from conclave.files.removal import empty_folder, remove_tree
from conclave.files.trees import list_tree
from conclave.files.workspaces import Workspaces
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, decide, is_presentation, vote_labels, write_team

pytestmark = pytest.mark.anyio
ODD = {
    " src/conftest.py": b"import sys\n",
    "trail /x.py": b"x = 1\n",
    "two\nlines.txt": b"nl\n",
    "tab\there.txt": b"t\n",
    " lead.txt": b"lead\n",
    "lead.txt": b"NOT THIS ONE\n",
}


async def test_odd_names_round_trip_through_copy_snapshot_diff_and_apply(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    for rel, data in ODD.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_bytes(data)
    spaces = Workspaces(JobFolder(tmp_path, "job"))
    manifest = await spaces.prepare([ContextPath(path=str(project), permission="write")])
    assert set(manifest.contexts[0].files) == set(ODD) and not manifest.contexts[0].skipped
    await spaces.create(["A"])
    work = spaces.agent("A") / "proj"
    for rel, data in ODD.items():
        assert (work / rel).read_bytes() == data, rel
    (work / " lead.txt").write_bytes(b"lead, edited\n")
    (work / " src" / "conftest.py").write_bytes(b"import os\n")
    await spaces.snapshot("A", "A1")
    await spaces.finalize("A1")
    patch = (await spaces.diffs())["proj"]
    assert sorted(change.path for change in patch.files) == [" lead.txt", " src/conftest.py"]
    assert "diff --git a/ lead.txt b/ lead.txt\n" in patch.text
    await spaces.apply("proj")
    assert (project / " lead.txt").read_bytes() == b"lead, edited\n"
    assert (project / "lead.txt").read_bytes() == b"NOT THIS ONE\n"  # never another file's name
    assert (project / " src" / "conftest.py").read_bytes() == b"import os\n"
    assert not (project / "src").exists()


async def test_a_name_that_is_not_utf8_is_refused_by_name_never_renamed(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "ok.py").write_text("ok\n")
    fd = os.open(os.fsencode(project) + b"/bad\xff.py", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"bad\n")
    os.close(fd)
    spaces = Workspaces(JobFolder(tmp_path, "job"))
    manifest = await spaces.prepare([ContextPath(path=str(project), permission="write")])
    context = manifest.contexts[0]
    assert list(context.files) == ["ok.py"]
    assert "not valid UTF-8" in context.skipped["bad\\xff.py"]
    manifest.model_dump_json()  # the manifest holds only names that round-trip


async def test_a_tree_too_deep_is_refused_with_a_message_not_a_recursion_error(tmp_path: Path) -> None:
    root = tmp_path / "deep"
    root.mkdir()
    with safe.directory(root, []) as fd:  # 1,500 levels, made fd-relative: the path is too long for mkdir -p
        current = os.dup(fd)
        for _ in range(1500):
            os.mkdir("d", dir_fd=current)
            step = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=current)
            os.close(current)
            current = step
        os.close(current)
    listing = list_tree(root, max_files=100)
    assert listing.truncated and listing.limit and "nested more than 256 deep" in listing.limit
    with pytest.raises(ContextTooLarge, match="nested more than 256 deep"):
        await Workspaces(JobFolder(tmp_path, "job")).prepare([ContextPath(path=str(root))])
    remove_tree(root)  # shutil.rmtree dies with RecursionError here on Python 3.11
    assert not root.exists()


def test_a_check_containers_folder_is_emptied_in_place_through_no_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "kept.txt").write_text("the host's")
    slot = tmp_path / "slot"  # what a check left in its container's folder (files/check_slots.py)
    (slot / "pkg" / "deep").mkdir(parents=True)
    (slot / "pkg" / "deep" / "x.py").write_text("X = 1\n")
    (slot / "a.txt").write_text("a")
    (slot / "to-outside").symlink_to(outside)
    (slot / "pkg" / "to-sub").symlink_to(outside / "sub")
    inode = slot.stat().st_ino
    empty_folder(slot)
    assert list(slot.iterdir()) == [] and slot.stat().st_ino == inode  # the mounted folder itself stays
    assert (outside / "sub" / "kept.txt").read_text() == "the host's"


def test_a_listing_stops_at_its_cap_without_loading_the_whole_folder(tmp_path: Path, monkeypatch) -> None:
    crowded = tmp_path / "crowded"
    crowded.mkdir()
    for index in range(30_000):
        os.close(os.open(crowded / f"f{index:05}", os.O_WRONLY | os.O_CREAT, 0o644))
    seen = []
    real = os.scandir

    class Counting:
        def __init__(self, target: object) -> None:
            self.inner = real(target)  # type: ignore[call-overload]

        def __enter__(self) -> Counting:
            return self

        def __exit__(self, *exc: object) -> None:
            self.inner.close()

        def __iter__(self):  # type: ignore[no-untyped-def]
            for item in self.inner:
                seen.append(item.name)
                yield item

    monkeypatch.setattr(safe.os, "scandir", Counting)
    text = anyio.run(AgentTools(tmp_path, peers=dict).handlers()["list_files"], {"path": "crowded"})
    assert "the listing stopped: more than 10,000 entries" in text
    assert len(seen) <= 10_001, f"read {len(seen):,} entries for a listing capped at 400 files"


def deep_agent(request: RecordedRequest) -> Reply:
    """Makes a tree 1,500 folders deep with run_command, then answers and votes for itself."""
    if is_presentation(request):
        return Reply(text="FINAL: done")
    if vote_labels(request):
        return decide("vote", {"answer": vote_labels(request)[0], "reason": "mine"}, request)
    if "--- stdout ---" not in request.text() and "exit code" not in request.text():
        script = "i=0; while [ $i -lt 1500 ]; do mkdir d && cd d || exit 1; i=$((i+1)); done; echo made"
        return Reply(tool_calls=[("run_command", {"command": script})])
    return decide("new_answer", {"content": "Made the folders."}, request)


@pytest.mark.usefixtures("docker_image")
async def test_a_command_that_nests_1500_folders_fails_that_step_never_the_job(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "a.py").write_text("a = 1\n")
    fakes.script.set_default("ann", deep_agent)
    sandbox = {"memory": "256m", "cpus": 1, "pids": 64}
    team = str(
        write_team(
            tmp_path / "team.yaml",
            fakes,
            (("openai", "ann"),),
            sandbox=sandbox,
            coordination={"final": "reuse"},
        )
    )
    async with JobService.serve(
        environment_of(Settings(home=tmp_path / "state"), {KEY_ENV: "k-0123456789"})
    ) as service:
        view = await service.submit(
            JobRequest(task="nest", team=team, context_paths=[{"path": str(project)}])
        )
        with anyio.fail_after(120):
            while not view.done:
                view = await service.wait(view.job_id, 10)
        transcript = (await service.lookup.read(view.job_id, "transcript", None, 0, 100_000)).content
    assert view.state == "completed", view.text()
    assert "RecursionError" not in transcript and "internal error" not in (
        view.phase + str(view.result.errors)
    )
    assert "nested more than 256 deep" in transcript
