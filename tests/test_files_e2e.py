"""End to end with files: a scripted team edits a project in Docker-confined workspaces, one agent reads
a peer's snapshot with run_command, and the winner's diff comes back exact; then apply and its conflict
check. Needs the Docker engine and the sandbox image (.ci/run provides both)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import anyio
import pytest

from conclave.backends.retry import RetryPolicy
from conclave.errors import InputError, PathOutsideRoot
from conclave.jobs.read.views import JobView
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, decide, is_presentation, own_letter, vote_labels, write_team

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_image")]
ENV = {KEY_ENV: "test-key-0123456789"}
OLD = b"def add(a, b):\n    return a - b\n"
NEW = b"def add(a, b):\n    return a + b\n"
DOCKER = {"memory": "256m", "cpus": 1, "pids": 64}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "build").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "calc.py").write_bytes(OLD)
    (root / "README.md").write_text("A calculator.\n")
    (root / ".gitignore").write_text("build/\n")
    (root / "build" / "junk.o").write_bytes(b"\x00junk")
    return root


def label_with(request: RecordedRequest, needle: str) -> str | None:
    """The current label whose answer text contains `needle`."""
    text = request.text()
    for label in vote_labels(request):
        section = text.split(f"## Answer {label}", 1)[-1].split("## Answer", 1)[0]
        if needle in section:
            return label
    return None


def editor(request: RecordedRequest) -> Reply:
    """ann: fixes calc.py with edit_file, then answers, then votes for its fix."""
    if is_presentation(request):
        return Reply(text="FINAL: add() now adds.")
    mine = label_with(request, "Fixed add()")
    if mine is None:
        if "replaced 1 occurrence in calc.py" in request.text():
            return decide("new_answer", {"content": "Fixed add(): it subtracted."}, request)
        return Reply(
            tool_calls=[
                ("edit_file", {"path": "calc.py", "old_text": "return a - b", "new_text": "return a + b"})
            ]
        )
    return decide("vote", {"answer": mine, "reason": "the fix is right"}, request)


def reviewer(request: RecordedRequest) -> Reply:
    """bob and cy: answer at once without files; bob checks the peers' files with run_command, then both
    vote for the fix once it is on the table."""
    if is_presentation(request):
        return Reply(text="FINAL (unexpected presenter)")
    me = own_letter(request)
    if not any(label.startswith(me or "?") for label in vote_labels(request)):
        return decide("new_answer", {"content": f"{request.agent}: the bug is in calc.py"}, request)
    fix = label_with(request, "Fixed add()")
    if fix is None:
        return decide("vote", {"answer": vote_labels(request)[0], "reason": "only one so far"}, request)
    if request.agent == "bob" and "--- stdout ---" not in request.text():
        return Reply(tool_calls=[("run_command", {"command": f"cat /peers/{fix[0]}/calc.py; id -u"})])
    return decide("vote", {"answer": fix, "reason": "verified"}, request)


def blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


async def test_team_edits_files_and_the_diff_is_exact(
    tmp_path: Path, fakes: FakeProviders, project: Path
) -> None:
    fakes.script.set_default("ann", editor)
    fakes.script.set_default("bob", reviewer)
    fakes.script.set_default("cy", reviewer)
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO, sandbox=DOCKER))
    settings = Settings(home=tmp_path / "state")
    retry = RetryPolicy(max_attempts=2, base_delay_s=0.01)
    async with JobService.serve(environment_of(settings, ENV, retry)) as service:
        view = await service.submit(
            JobRequest(task="Fix add() in calc.py", team=team, context_paths=[{"path": str(project)}])
        )
        with anyio.fail_after(120):
            while not view.done:
                view = await service.wait(view.job_id, 10)
        assert view.state == "completed" and view.result.consensus, view.text()
        patch = (await service.lookup.read(view.job_id, "@diff", None, 0, 100_000)).content
        final_calc = await service.lookup.read(view.job_id, "proj/calc.py", "final", 0, 1000)
        listing = await service.lookup.read(view.job_id, "", "final", 0, 1000)

    expected = (
        f"# proj: {project}\n"
        f"diff --git a/calc.py b/calc.py\nindex {blob(OLD)[:7]}..{blob(NEW)[:7]} 100644\n"
        "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n"
        " def add(a, b):\n-    return a - b\n+    return a + b\n"
    )
    assert patch == expected
    assert final_calc.content == NEW.decode()
    assert listing.entries == [
        "proj/.gitignore",
        "proj/README.md",
        "proj/calc.py",
    ]  # .git and build/ left out
    assert project.joinpath("calc.py").read_bytes() == OLD  # the caller's folder was never written
    summary = view.diff_summary.model_dump() if view.diff_summary else None
    assert summary is not None and summary["contexts"][0]["files"] == [
        {
            "path": "calc.py",
            "status": "modified",
            "change": "modified",
            "added_lines": 1,
            "removed_lines": 1,
            "became_binary": False,
            "autorun": None,
        }
    ]
    # bob read ann's snapshot through /peers in its container, as uid 1000
    looked = [r for r in fakes.script.requests_of("bob") if "--- stdout ---" in r.text()]
    stdout = looked[0].text().split("--- stdout ---", 1)[1][:300] if looked else ""
    assert "return a + b" in stdout and re.search(r"\\n1000\b", stdout), stdout  # `id -u` in JSON text


async def run_to_end(
    tmp_path: Path, fakes: FakeProviders, project: Path, *, apply: bool, during=None
) -> JobView:
    fakes.script.set_default("ann", editor)
    fakes.script.set_default("bob", reviewer)
    fakes.script.set_default("cy", reviewer)
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO, sandbox=DOCKER))
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV)) as service:
        paths = [{"path": str(project), "permission": "write"}]
        view = await service.submit(
            JobRequest(task="Fix add() in calc.py", team=team, context_paths=paths, apply=apply)
        )
        if during is not None:  # once the folder is copied (when the job starts, not at submit)
            with anyio.fail_after(60):
                while not service.job_folder(view.job_id).manifest.exists():
                    await anyio.sleep(0.05)
            during()
        with anyio.fail_after(120):
            while not view.done:
                view = await service.wait(view.job_id, 10)
        for bad in ("../../../etc/passwd", "/etc/passwd", "proj/../../manifest.json"):
            with pytest.raises(PathOutsideRoot):
                await service.lookup.read(view.job_id, bad, "final", 0, 100)
    return view


async def test_apply_writes_the_winners_changes(tmp_path: Path, fakes: FakeProviders, project: Path) -> None:
    view = await run_to_end(tmp_path, fakes, project, apply=True)
    assert view.state == "completed"
    assert project.joinpath("calc.py").read_bytes() == NEW
    assert view.diff_summary is not None and view.diff_summary.model_dump()["contexts"][0]["applied"] is True
    assert project.joinpath("build", "junk.o").read_bytes() == b"\x00junk"  # ignored files untouched


async def test_apply_refuses_when_the_folder_changed_meanwhile(
    tmp_path: Path, fakes: FakeProviders, project: Path
) -> None:
    mine = b"def add(a, b):\n    return b - a  # the user's own edit\n"
    view = await run_to_end(
        tmp_path, fakes, project, apply=True, during=lambda: project.joinpath("calc.py").write_bytes(mine)
    )
    assert view.state == "completed" and view.diff_summary is not None
    context = view.diff_summary.model_dump()["contexts"][0]
    assert context["applied"] is False and "calc.py" in context["apply_error"]
    assert project.joinpath("calc.py").read_bytes() == mine  # nothing of the user's was lost


async def test_apply_is_refused_for_read_only_context_paths(tmp_path: Path, project: Path) -> None:
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV)) as service:
        with pytest.raises(InputError, match="permission 'write'"):
            await service.submit(
                JobRequest(
                    task="task",
                    team="frontier",
                    context_paths=[{"path": str(project), "permission": "read"}],
                    apply=True,
                )
            )
