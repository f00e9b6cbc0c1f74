"""Follow-ups, end to end: a job fails its verify, the caller follows up with the test output, and the same
team, starting from the earlier answer's files, passes; over stdio (the official mcp client) and streamable
HTTP (FastMCP's Client), against Docker and the fake providers through the real SDKs. Also what carries
over, a caller's edit that clashes with the earlier answer, and following up a job that is still running."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import Client
from mcp.client.client import Client as McpClient

from conclave.backends.retry import RetryPolicy
from conclave.errors import InputError
from conclave.jobs.read.views import JobView
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.calc_task import CALC, TASK, calc_project
from tests.fakes.environment import environment_of
from tests.fakes.processes import HTTP_TOKEN, http_server, stdio_params
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, decide, vote_labels, write_team

pytestmark = pytest.mark.anyio
ENV = {KEY_ENV: "test-key-0123456789"}
FAST = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05)
FOLLOW_UP_MARK = "The task now: their follow-up"


def own_label(request: RecordedRequest) -> str | None:
    for label in vote_labels(request):
        section = request.text().split(f"## Answer {label}", 1)[-1].split("## Answer", 1)[0]
        if f"({request.agent})" in section:
            return label
    return None


def fixer(request: RecordedRequest) -> Reply:
    """The first job: changes `a - b` to `a * b` (wrong). A follow-up: changes `a * b` to `a + b`, which
    only works on a workspace that starts from the earlier answer's files."""
    follow_up = FOLLOW_UP_MARK in request.text()
    old, new = ("return a * b", "return a + b") if follow_up else ("return a - b", "return a * b")
    if own_label(request) is None:
        if "replaced 1 occurrence" not in request.text():
            return Reply(tool_calls=[("edit_file", {"path": "calc.py", "old_text": old, "new_text": new})])
        return decide("new_answer", {"content": f"calc.py now says {new} ({request.agent})."}, request)
    return decide("vote", {"answer": sorted(vote_labels(request))[0], "reason": "fine"}, request)


@pytest.fixture
def fakes() -> Iterator[FakeProviders]:
    with FakeProviders() as running:
        for _, agent in TRIO:
            running.script.set_default(agent, fixer)
        yield running


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return calc_project(tmp_path, {"README.md": "calc\n"})


async def finished(call: Any, view: JobView) -> JobView:
    with anyio.fail_after(180):
        while not view.done:
            view = JobView.model_validate(
                await call("get_status", {"job_id": view.job_id, "wait_seconds": 20})
            )
    return view


@pytest.mark.usefixtures("docker_image")
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_failed_check_then_a_follow_up_with_its_output_passes(
    tmp_path: Path, fakes: FakeProviders, project: Path, transport: str
) -> None:
    config = tmp_path / "config"
    write_team(
        config / "conclave" / "teams" / "fixers.yaml",
        fakes,
        TRIO,
        name="fixers",
        coordination={"final": "reuse", "timeout_s": 150},
    )
    env = {"CONCLAVE_HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(config), **ENV}
    first_args = {
        "task": TASK,
        "team": "fixers",
        "verify": "pytest -q",
        "apply": "force",
        "wait_seconds": 0,
        "context_paths": [{"path": str(project), "permission": "write"}],
    }
    if transport == "stdio":
        params = stdio_params(tmp_path)
        params.env = {**(params.env or {}), **env}
        client_cm: Any = McpClient(params)
    else:
        server_cm = http_server(tmp_path, env)
        url = server_cm.__enter__()
        client_cm = Client(url, auth=HTTP_TOKEN)
    try:
        async with client_cm as client:

            async def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
                result = await client.call_tool(name, arguments)
                assert not result.is_error, result.content[0].text
                return result.structured_content  # type: ignore[no-any-return]

            first = await finished(call, JobView.model_validate(await call("ask_team", first_args)))
            output = (
                await call(
                    "read_workspace", {"job_id": first.job_id, "path": f"verify/{first.result.winner}"}
                )
            )["content"]
            assert first.state == "completed" and "failed" in (first.winner_check or ""), first
            assert "assert 6 == 5" in output
            assert "return a * b" in project.joinpath("calc.py").read_text()  # applied by force
            project.joinpath("README.md").write_text("calc, edited by me\n")  # the caller's edit in between
            second_args = {
                "task": f"The tests still fail:\n{output}",
                "follow_up": first.job_id,
                "wait_seconds": 0,
            }
            second = await finished(call, JobView.model_validate(await call("ask_team", second_args)))
            patch = (await call("read_workspace", {"job_id": second.job_id, "path": "@diff"}))["content"]
            thread = (await call("read_workspace", {"job_id": second.job_id, "path": "thread"}))["content"]
    finally:
        if transport == "http":
            server_cm.__exit__(None, None, None)

    assert second.state == "completed" and second.winner_check and second.winner_check.startswith("passed"), (
        second
    )
    assert second.follow_up == first.job_id and second.thread == [first.job_id, second.job_id]
    assert {a.letter: a.model for a in second.agents} == {
        a.letter: a.model for a in first.agents
    }  # same letters
    # against the folder as it is now: the applied change is not shown again, the caller's edit is kept
    assert "-    return a * b\n+    return a + b\n" in patch and "return a - b" not in patch
    assert "README" not in patch and project.joinpath("README.md").read_text() == "calc, edited by me\n"
    assert first.job_id in thread and second.job_id in thread and "assert 6 == 5" in thread
    history = [r.text() for r in fakes.script.requests if FOLLOW_UP_MARK in r.text()]
    assert history and all(TASK in text and "Round 1" in text for text in history)


async def test_carried_options_a_clashing_edit_and_a_running_job(
    tmp_path: Path, fakes: FakeProviders, project: Path
) -> None:
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO, coordination={"final": "reuse"}))
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        first = await service.submit(
            JobRequest(task=TASK, team=team, context_paths=[{"path": str(project), "permission": "write"}])
        )
        with pytest.raises(InputError, match=r"still (queued|running)"):
            await service.submit(JobRequest(task="more", team=None, follow_up=first.job_id))
        first = await service.wait(first.job_id, 50)
        assert first.state == "completed" and project.joinpath("calc.py").read_text() == CALC  # not applied
        with pytest.raises(InputError, match="team="):
            await service.submit(JobRequest(task="more", team="frontier", follow_up=first.job_id))
        with pytest.raises(InputError, match="follow_up="):
            await service.submit(JobRequest(task="more", team=None, follow_up="cj-000000000000x"))
        # the caller changed calc.py too, differently from the earlier answer: a clear conflict
        project.joinpath("calc.py").write_text("def add(a, b):\n    return b + a\n")
        clash = await service.wait(
            (await service.submit(JobRequest(task="go on", team=None, follow_up=first.job_id))).job_id, 50
        )
        row = service.store.sync.job(clash.job_id)
        assert (
            row is not None
            and row.options.context_paths == service.store.sync.job(first.job_id).options.context_paths
        )
        assert clash.state == "failed" and "calc.py" in (clash.result.errors.get("job") or ""), clash
        assert "changed both in your folder" in clash.result.errors["job"]
        # back as it was: the follow-up starts from the earlier answer (a * b) and changes it to a + b
        project.joinpath("calc.py").write_text(CALC)
        second = await service.wait(
            (await service.submit(JobRequest(task="go on", team=None, follow_up=first.job_id))).job_id, 50
        )
        patch = (await service.lookup.read(second.job_id, "@diff", None, 0, 100_000)).content
    assert second.state == "completed" and second.follow_up == first.job_id, second
    assert "-    return a - b\n+    return a + b\n" in patch  # not applied before: the whole change shows
