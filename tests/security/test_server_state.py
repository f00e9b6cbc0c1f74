"""What the server keeps is never a caller's folder: its home (the database, http-tokens.json), its jobs
folder and its team folders may not be, hold or lie inside a context path, by real path and by identity
(a symlink, a second path through a linked parent, a bind mount), whatever the allowed roots say, at
admission, in a follow-up, and where the job is copied and applied. Over HTTP a caller names folders only
under roots the operator set: the working directory is none.

Before (73765ab): the default root over HTTP was the working directory, and nothing kept CONCLAVE_HOME
out of the roots, so a caller named the state folder and read every caller's token, or with a write
context path and apply rewrote http-tokens.json.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError

from conclave.errors import NotPermitted, ServerState
from conclave.jobs.admission.access import Access
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.processes import HTTP_TOKEN, http_server
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, decide, install, is_presentation, vote_labels, voter, write_team
from tests.fakes.waits import until_done

pytestmark = pytest.mark.anyio
SOLO = (("openai", "ann"),)
TOKENS = json.dumps({"alice": "alice-token-0123456789"})
PLANTED = json.dumps({"mallory": "mallory-token-0123456789"})


class Server:
    """A server's layout under one allowed root that holds everything: its state, a caller's project."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "srv" / "state"
        self.jobs = root / "srv" / "jobs"
        self.config = root / "config"
        self.project = root / "project"
        for folder in (self.home, self.jobs, self.config / "conclave" / "teams", self.project):
            folder.mkdir(parents=True, exist_ok=True)
        (self.home / "http-tokens.json").write_text(TOKENS)
        (self.project / "app.py").write_text("print(1)\n")
        self.environ = {KEY_ENV: "test-key-0123456789", "XDG_CONFIG_HOME": str(self.config)}

    def settings(self, **more: object) -> Settings:
        # the root holds the state: the misconfiguration the rule must survive
        return Settings(home=self.home, jobs_dir=self.jobs, allowed_roots=str(self.root), **more)  # type: ignore[arg-type]


@pytest.fixture
def server(tmp_path: Path, fakes: FakeProviders) -> Server:
    layout = Server(tmp_path)
    write_team(layout.config / "conclave" / "teams" / "solo.yaml", fakes, SOLO, name="solo")
    install(fakes.script, SOLO, voter())
    return layout


@pytest.fixture
def bind_mount(tmp_path: Path) -> Iterator[object]:
    """mount --bind SOURCE TARGET (root only), unmounted at teardown."""
    made: list[Path] = []

    def mount(source: Path, target: Path) -> None:
        target.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"mount --bind needs root and CAP_SYS_ADMIN: {done.stderr.strip()}")
        made.append(target)

    yield mount
    for target in reversed(made):
        subprocess.run(["umount", str(target)], check=True)


def named(server: Server, form: str, mount: object) -> Path:
    """The folder (or file) a caller names, for each way of reaching what the server keeps."""
    if form == "home":
        return server.home
    if form == "parent":
        return server.home.parent
    if form == "child":
        (server.home / "inner").mkdir(exist_ok=True)
        return server.home / "inner"
    if form == "symlink":
        (server.root / "link").symlink_to(server.home)
        return server.root / "link"
    if form == "linked-parent":  # a second path to the home through a linked folder above it
        (server.root / "alias").symlink_to(server.home.parent)
        return server.root / "alias" / "state"
    if form == "bind-mount":  # the same folder at another path: the same (st_dev, st_ino)
        mount(server.home, server.project / "view")  # type: ignore[operator]
        return server.project / "view"
    if form == "bind-mount-of-a-child":  # a folder inside the home, shown elsewhere
        (server.home / "inner").mkdir(exist_ok=True)
        mount(server.home / "inner", server.project / "view")  # type: ignore[operator]
        return server.project / "view"
    if form == "mount-inside":  # a folder holding a mount that shows the state's parent
        mount(server.home.parent, server.project / "srv-view")  # type: ignore[operator]
        return server.project
    if form == "database":
        return server.home / "conclave.db"
    if form == "tokens":
        return server.home / "http-tokens.json"
    if form == "jobs":
        return server.jobs
    if form == "team-folder":
        return server.config / "conclave" / "teams"
    raise AssertionError(form)


@pytest.mark.parametrize(
    "form",
    [
        "home",
        "parent",
        "child",
        "symlink",
        "linked-parent",
        "bind-mount",
        "bind-mount-of-a-child",
        "mount-inside",
        "database",
        "tokens",
        "jobs",
        "team-folder",
    ],
)
async def test_what_the_server_keeps_is_never_a_context_path(
    server: Server, bind_mount: object, form: str
) -> None:
    settings = server.settings()
    if form == "database" and settings.database_url is not None:
        pytest.skip("the store is PostgreSQL on this run: nothing of it is local")
    access = Access.http(settings, server.environ, server.root)
    async with JobService.serve(environment_of(settings, server.environ), access=access) as service:
        path = named(server, form, bind_mount)
        for permission in ("read", "write"):
            with pytest.raises(ServerState) as refused:
                await service.submit(
                    JobRequest(
                        task="read it",
                        team="solo",
                        context_paths=[{"path": str(path), "permission": permission}],
                        apply=permission == "write",
                    )
                )
            error = refused.value  # the field, the value and the fix
            assert (error.field, error.value) == ("context_paths[0].path", str(path)), str(error)
            assert "nothing the server keeps is ever a caller's folder" in error.fix, error.fix
            assert "CONCLAVE_ALLOWED_ROOTS" in error.fix, error.fix
        assert not list(server.jobs.glob("cj-*")), "no job was queued"
        if "mount" not in form:  # the project holds a mount of the state then
            view = await service.submit(
                JobRequest(task="read it", team="solo", context_paths=[{"path": str(server.project)}])
            )
            assert (await until_done(service, view)).state == "completed"


async def test_a_follow_up_neither_names_nor_carries_what_the_server_keeps(server: Server) -> None:
    settings = server.settings()
    access = Access.http(settings, server.environ, server.root)
    async with JobService.serve(environment_of(settings, server.environ), access=access) as service:
        first = await service.submit(
            JobRequest(task="read it", team="solo", context_paths=[{"path": str(server.project)}])
        )
        assert (await until_done(service, first)).state == "completed"
        with pytest.raises(ServerState, match="the server's home"):
            await service.submit(
                JobRequest(task="more", follow_up=first.job_id, context_paths=[{"path": str(server.home)}])
            )
    # the operator since keeps a team folder inside the earlier job's folder: carrying it is refused too
    (server.project / "teams").mkdir()
    moved = server.settings(team_dirs=str(server.project / "teams"))
    access = Access.http(moved, server.environ, server.root)
    async with JobService.serve(environment_of(moved, server.environ), access=access) as service:
        with pytest.raises(ServerState, match="team folder") as refused:
            await service.submit(JobRequest(task="more", follow_up=first.job_id))
        assert str(server.project) in str(refused.value)


def rewriter(request: RecordedRequest) -> Reply:
    """The only member: writes a tokens file of its own over the copy's, answers, votes for itself."""
    if is_presentation(request):
        return Reply(text="FINAL: rewrote the tokens")
    labels = vote_labels(request)
    if labels:
        return decide("vote", {"answer": labels[0], "reason": "mine"}, request)
    if "mallory" not in request.text():
        return Reply(tool_calls=[("write_file", {"path": "state/http-tokens.json", "content": PLANTED})])
    return decide("new_answer", {"content": "rewrote state/http-tokens.json"}, request)


async def test_a_worker_never_copies_or_applies_into_its_own_state(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    """The front that admitted the job keeps its state elsewhere; the worker that runs it keeps its home
    inside the caller's folder: the worker's own check refuses it, and nothing is written there."""
    project = tmp_path / "project"
    worker_home = project / "state"
    worker_home.mkdir(parents=True)
    (worker_home / "http-tokens.json").write_text(TOKENS)
    fakes.script.set_default("ann", rewriter)
    team = str(write_team(tmp_path / "team.yaml", fakes, SOLO))
    environ = {KEY_ENV: "test-key-0123456789"}
    front = Access.local(Settings(home=tmp_path / "front-state"), environ)
    async with JobService.serve(environment_of(Settings(home=worker_home), environ), access=front) as service:
        paths = [{"path": str(project), "permission": "write"}]
        view = await service.submit(JobRequest(task="fix it", team=team, context_paths=paths, apply=True))
        view = await until_done(service, view)
    assert (worker_home / "http-tokens.json").read_text() == TOKENS
    assert view.state == "failed", view.text()
    assert "nothing the server keeps is ever a caller's folder" in view.text(), view.text()


async def test_apply_never_writes_into_what_the_worker_keeps_by_then(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    """The worker's team folder is reached through a link that appears only while the job runs, after
    the copy: the apply checks again, refuses, and writes nothing there; the job itself completes."""
    project = tmp_path / "project"
    (project / "teams").mkdir(parents=True)
    (project / "teams" / "solo.yaml").write_text("name: solo\n")
    link = tmp_path / "teams-link"  # the worker's CONCLAVE_TEAM_DIRS, not there when the job is copied

    def planter(request: RecordedRequest) -> Reply:
        if not link.is_symlink():
            link.symlink_to(project / "teams")
        if is_presentation(request):
            return Reply(text="FINAL: a new team file")
        labels = vote_labels(request)
        if labels:
            return decide("vote", {"answer": labels[0], "reason": "mine"}, request)
        if "planted" not in request.text():
            return Reply(tool_calls=[("write_file", {"path": "teams/solo.yaml", "content": "planted: 1\n"})])
        return decide("new_answer", {"content": "wrote teams/solo.yaml"}, request)

    fakes.script.set_default("ann", planter)
    team = str(write_team(tmp_path / "team.yaml", fakes, SOLO))
    environ = {KEY_ENV: "test-key-0123456789"}
    front = Access.local(Settings(home=tmp_path / "front-state"), environ)
    worker = Settings(home=tmp_path / "state", team_dirs=str(link))
    async with JobService.serve(environment_of(worker, environ), access=front) as service:
        paths = [{"path": str(project), "permission": "write"}]
        view = await service.submit(JobRequest(task="fix it", team=team, context_paths=paths, apply=True))
        view = await until_done(service, view)
    assert (project / "teams" / "solo.yaml").read_text() == "name: solo\n"
    assert view.state == "completed", view.text()
    (context,) = view.diff_summary.contexts if view.diff_summary else []
    assert not context.applied and "a team folder of the server" in (context.apply_error or ""), context


async def test_over_http_a_server_without_operator_roots_takes_no_folder(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    """`serve --http` started above its home, with no CONCLAVE_ALLOWED_ROOTS: the working directory is
    no root, so neither the state under it nor a project beside it can be named."""
    install(fakes.script, SOLO, voter())
    (tmp_path / "project").mkdir()
    config = tmp_path / "config"
    write_team(config / "conclave" / "teams" / "solo.yaml", fakes, SOLO, name="solo")
    env = {
        "CONCLAVE_HOME": str(tmp_path / "home"),
        "CONCLAVE_ALLOWED_ROOTS": "",  # unset: the operator chose no root
        "XDG_CONFIG_HOME": str(config),
        KEY_ENV: "test-key-0123456789",
    }
    with http_server(tmp_path, env) as url:  # its working directory is tmp_path, above its home
        async with Client(url, auth=HTTP_TOKEN) as client:
            for folder in (tmp_path / "home", tmp_path / "project"):
                with pytest.raises(ToolError, match="CONCLAVE_ALLOWED_ROOTS") as refused:
                    await client.call_tool(
                        "ask_team",
                        {
                            "task": "read it",
                            "team": "solo",
                            "context_paths": [{"path": str(folder)}],
                            "wait_seconds": 0,
                        },
                    )
                assert "context_paths[0].path" in str(refused.value)
            plain = await client.call_tool(
                "ask_team", {"task": "no files", "team": "solo", "wait_seconds": 0}
            )
            assert plain.structured_content["job_id"].startswith("cj-")
    said = (tmp_path / "server.log").read_text()  # the operator is told at start, not only callers
    assert "callers may name no folder" in said and "CONCLAVE_ALLOWED_ROOTS" in said, said


async def test_a_callers_entry_in_the_tokens_file_narrows_the_folders_it_may_name(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    """http-tokens.json gives alice roots of her own: she names folders only there (and under the
    server's roots); bob, a plain entry, names any folder under the server's roots."""
    install(fakes.script, SOLO, voter())
    for folder in ("alice/app", "bob/app"):
        (tmp_path / "projects" / folder).mkdir(parents=True)
    config = tmp_path / "config"
    write_team(config / "conclave" / "teams" / "solo.yaml", fakes, SOLO, name="solo")
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    alice, bob = "alice-token-0123456789", "bob-token-0123456789ab"
    entries = {"alice": {"token": alice, "roots": [str(tmp_path / "projects" / "alice")]}, "bob": bob}
    (home / "http-tokens.json").write_text(json.dumps(entries))
    (home / "http-tokens.json").chmod(0o600)
    env = {
        "CONCLAVE_HOME": str(home),
        "CONCLAVE_ALLOWED_ROOTS": str(tmp_path / "projects"),
        "XDG_CONFIG_HOME": str(config),
        KEY_ENV: "test-key-0123456789",
    }

    def ask(folder: str) -> dict[str, object]:
        path = str(tmp_path / "projects" / folder)
        return {"task": "read it", "team": "solo", "context_paths": [{"path": path}], "wait_seconds": 0}

    with http_server(tmp_path, env, token=None) as url:
        async with Client(url, auth=alice) as client:
            with pytest.raises(ToolError, match="caller 'alice' may name folders only under") as refused:
                await client.call_tool("ask_team", ask("bob/app"))
            assert "context_paths[0].path" in str(refused.value) and "http-tokens.json" in str(refused.value)
            mine = await client.call_tool("ask_team", ask("alice/app"))
            assert mine.structured_content["job_id"].startswith("cj-")
        async with Client(url, auth=bob) as client:
            for folder in ("bob/app", "alice/app"):
                asked = await client.call_tool("ask_team", ask(folder))
                assert asked.structured_content["job_id"].startswith("cj-")


def test_every_transport_refuses_the_state_whatever_its_roots(tmp_path: Path) -> None:
    """stdio and the CLI too: the roots (or none) never let a caller name what the server keeps."""
    home = tmp_path / "state"
    home.mkdir()
    settings = Settings(home=home)
    environ = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    for access in (Access.local(settings, environ), Access.stdio(settings, environ, tmp_path)):
        for folder in (home, tmp_path):
            with pytest.raises(ServerState):
                access.check_folder("context_paths[0].path", str(folder))
    assert issubclass(ServerState, NotPermitted)  # callers that catch NotPermitted still do
