"""The MCP surface for jobs with files: context_paths, the diff through read_workspace and as a
resource link, files of the final tree and of an answer's snapshot, and confinement. The team runs
with `sandbox: none` (file tools, no commands), so no Docker is needed here."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import Client
from mcp.types import ResourceLink

from conclave.app.server import create_app
from conclave.errors import SandboxUnavailable
from conclave.jobs.read.views import JobView
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, decide, install, is_presentation, vote_labels, voter, write_team
from tests.fakes.waits import until_done

pytestmark = pytest.mark.anyio


def writer(request: RecordedRequest) -> Reply:
    """Writes docs/USAGE.md, then answers; otherwise behaves like `voter()`."""
    if not is_presentation(request) and "Answer from" not in request.text() and "wrote" not in request.text():
        return Reply(tool_calls=[("write_file", {"path": "docs/USAGE.md", "content": "Run it.\n"})])
    if "wrote 8 bytes" in request.text() and "(your own answer)" not in request.text():
        return decide("new_answer", {"content": "Answer from the writer: added USAGE.md"}, request)
    return fan(request)


def fan(request: RecordedRequest) -> Reply:
    """Answers once, then votes for the writer's answer as soon as it is on the table."""
    text = request.text()
    for label in vote_labels(request):
        if "added USAGE.md" in text.split(f"## Answer {label}", 1)[-1].split("## Answer", 1)[0]:
            return decide("vote", {"answer": label, "reason": "docs help"}, request)
    reply = voter()(request)
    if any(name == "vote" for name, _ in reply.tool_calls):  # wait for the writer instead of voting early
        reply.delay = 0.2
    return reply


@pytest.fixture
async def client(tmp_path: Path, fakes: FakeProviders) -> AsyncIterator[tuple[Client, str, Path]]:
    install(fakes.script, TRIO, fan)
    fakes.script.set_default("ann", writer)
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    project = tmp_path / "proj"
    project.mkdir()
    (project / "README.md").write_text("hello\n")
    settings = Settings(home=tmp_path / "home")
    async with (
        JobService.serve(environment_of(settings, {KEY_ENV: "test-key-0123456789"})) as service,
        Client(create_app(service, settings)) as connected,
    ):
        yield connected, team, project


async def call(client: Client, tool: str, **arguments: Any) -> Any:
    return await client.call_tool(tool, arguments, raise_on_error=False)


async def test_context_paths_give_a_diff_files_and_links(client: tuple[Client, str, Path]) -> None:
    mcp, team, project = client
    result = await call(
        mcp,
        "ask_team",
        task="Document usage",
        team=team,
        context_paths=[{"path": str(project)}],
        wait_seconds=50,
    )
    view = JobView.model_validate(result.structured_content)
    with anyio.fail_after(120):
        while not view.done:
            result = await call(mcp, "get_status", job_id=view.job_id, wait_seconds=30)
            view = JobView.model_validate(result.structured_content)
    assert view.state == "completed"
    links = {item.uri: item for item in result.content if isinstance(item, ResourceLink)}
    diff_uri = f"conclave://jobs/{view.job_id}/diff"
    assert f"conclave://jobs/{view.job_id}/transcript" in links

    patch = (await call(mcp, "read_workspace", job_id=view.job_id, path="@diff")).structured_content[
        "content"
    ]
    summary = view.diff_summary.model_dump() if view.diff_summary else None
    assert summary is not None
    assert summary["contexts"][0]["files"] == [
        {
            "path": "docs/USAGE.md",
            "status": "added",
            "change": "added",
            "added_lines": 1,
            "removed_lines": 0,
            "became_binary": False,
            "autorun": None,  # runs nothing on its own (files/autorun.py)
        }
    ]
    assert diff_uri in links and "+Run it." in patch and "docs/USAGE.md" in patch
    resource = await mcp.read_resource(diff_uri)
    assert resource[0].text == patch
    page = await call(mcp, "read_workspace", job_id=view.job_id, path="proj/docs/USAGE.md", source="final")
    assert page.structured_content["content"] == "Run it.\n"
    plain = await call(
        mcp, "read_workspace", job_id=view.job_id, path="proj/docs/USAGE.md"
    )  # final by default
    assert plain.structured_content["content"] == "Run it.\n"
    everything = (await call(mcp, "read_workspace", job_id=view.job_id)).structured_content
    assert {"@diff", "proj/docs/USAGE.md", "proj/README.md"} <= set(everything["entries"])
    second = (await call(mcp, "read_workspace", job_id=view.job_id, offset=1, limit=2)).structured_content
    assert second["entries"] == everything["entries"][1:3]  # a listing's offset and limit count entries
    assert second["total"] == len(everything["entries"]) and second["next_offset"] == 3
    # every answer's snapshot is readable, and the caller's folder was never written
    listing = await call(mcp, "read_workspace", job_id=view.job_id, path="", source=view.result.winner)
    assert "proj/README.md" in listing.structured_content["entries"]
    assert not (project / "docs").exists()
    for bad in ("../../../../etc/passwd", "/etc/passwd"):
        refused = await call(mcp, "read_workspace", job_id=view.job_id, path=bad, source="final")
        message = refused.content[0].text
        assert refused.is_error and ("outside the root" in message or "not allowed" in message), message


def json_writer(request: RecordedRequest) -> Reply:
    """A `json`-mode agent: calls write_file through {"action": "call_tool"}, then answers, then votes."""
    text = request.text()
    if is_presentation(request):
        return Reply(text="FINAL")
    if "Result of write_file" not in text and "(your own answer)" not in text:
        call = {
            "action": "call_tool",
            "tool": "write_file",
            "arguments": {"path": "json.txt", "content": f"by {request.agent}\n"},
        }
        return Reply(text=json.dumps(call))
    if "(your own answer)" not in text:
        return Reply(text=json.dumps({"action": "new_answer", "content": f"Answer from {request.agent}"}))
    labels = vote_labels(request)
    return Reply(text=json.dumps({"action": "vote", "answer": labels[0], "reason": "fine"}))


async def test_json_mode_agents_use_the_work_tools(tmp_path: Path, fakes: FakeProviders) -> None:
    install(fakes.script, TRIO, json_writer)
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO, tool_mode="json"))
    project = tmp_path / "proj"
    project.mkdir()
    settings = Settings(home=tmp_path / "home")
    async with JobService.serve(environment_of(settings, {KEY_ENV: "test-key-0123456789"})) as service:
        view = await until_done(
            service,
            await service.submit(
                JobRequest(task="Leave a note", team=team, context_paths=[{"path": str(project)}])
            ),
        )
        winner = view.result.winner
        assert view.state == "completed" and winner
        note = await service.lookup.read(view.job_id, "proj/json.txt", winner, 0, 100)
    assert note.content.startswith("by ")
    first = fakes.script.requests_of("ann")[0].text()
    assert "call_tool" in first and "write_file" in first and "run_command" not in first  # sandbox: none


def two_folder_writer(request: RecordedRequest) -> Reply:
    """Writes at the workspace root first (refused: two project folders), then inside web/, answers, votes."""
    text = request.text()
    if is_presentation(request):
        return Reply(text="FINAL")
    if "outside the project folders" not in text:
        call = {
            "action": "call_tool",
            "tool": "write_file",
            "arguments": {"path": "stray.txt", "content": "x\n"},
        }
        return Reply(text=json.dumps(call))
    if "wrote " not in text:
        call = {
            "action": "call_tool",
            "tool": "write_file",
            "arguments": {"path": "web/note.txt", "content": "x\n"},
        }
        return Reply(text=json.dumps(call))
    if "(your own answer)" not in text:
        return Reply(text=json.dumps({"action": "new_answer", "content": f"A note from {request.agent}"}))
    return Reply(text=json.dumps({"action": "vote", "answer": vote_labels(request)[0], "reason": "fine"}))


async def test_with_two_folders_nothing_is_written_outside_them(tmp_path: Path, fakes: FakeProviders) -> None:
    install(fakes.script, TRIO, two_folder_writer)
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO, tool_mode="json"))
    folders = [tmp_path / "api", tmp_path / "web"]
    for folder in folders:
        folder.mkdir()
    async with JobService.serve(
        environment_of(Settings(home=tmp_path / "home"), {KEY_ENV: "test-key-0123456789"})
    ) as service:
        view = await service.submit(
            JobRequest(
                task="Leave a note", team=team, context_paths=[{"path": str(folder)} for folder in folders]
            )
        )
        view = await until_done(service, view)
        patch = await service.lookup.read(view.job_id, "@diff", None, 0, 10_000)
    assert view.state == "completed", view.text()
    refused = next(
        r.text() for r in fakes.script.requests_of("ann") if "outside the project folders" in r.text()
    )
    assert "api/, web/" in refused  # the tool error names the folders
    assert "b/note.txt" in patch.content and "stray" not in patch.content
    assert view.diff_summary is not None and view.diff_summary.model_dump()["outside"] == []


async def test_a_command_team_is_refused_without_a_docker_engine(
    tmp_path: Path, fakes: FakeProviders, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO, sandbox={"memory": "256m"}))
    project = tmp_path / "proj"
    project.mkdir()
    settings = Settings(home=tmp_path / "home")
    async with JobService.serve(environment_of(settings, {KEY_ENV: "test-key-0123456789"})) as service:
        with pytest.raises(SandboxUnavailable) as refused:
            await service.submit(JobRequest(task="task", team=team, context_paths=[{"path": str(project)}]))
    message = str(refused.value)
    assert "no Docker engine" in message and "sandbox: none" in message and "conclave doctor" in message
    # no job's folder (on PostgreSQL the folder holds its .store-id: jobs/store/shared_files.py)
    assert not list((settings.home / "jobs").glob("cj-*"))
