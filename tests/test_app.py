"""The MCP surface through FastMCP's in-memory client, in both protocol eras, against the fake providers."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import Client

from conclave.app.server import create_app
from conclave.coordination.reports import AgentProgress, Progress
from conclave.jobs.read.reader import WorkspacePage
from conclave.jobs.read.teams import TeamList
from conclave.jobs.read.views import JobView
from conclave.jobs.service import JobService
from conclave.settings import Settings
from conclave.tools._progress import changes
from tests.fakes.environment import environment_of
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, install, voter, write_team

pytestmark = pytest.mark.anyio

MAX_TASK = 2_000
FIVE = {"ask_team", "get_status", "read_workspace", "cancel_job", "list_teams", "steer_job"}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home", max_task_chars=MAX_TASK)


@pytest.fixture
def environ(tmp_path: Path) -> dict[str, str]:
    # OPENAI_API_KEY makes the openai preset ready; no test calls ask_team without a team, so no real
    # provider is ever reached.
    return {KEY_ENV: "test-key", "OPENAI_API_KEY": "sk-test", "XDG_CONFIG_HOME": str(tmp_path / "config")}


@pytest.fixture
def team(tmp_path: Path, fakes: FakeProviders) -> str:
    """A three-agent team, one per wire format; quick voters unless a test installs others."""
    install(fakes.script, TRIO, voter())
    return str(write_team(tmp_path / "trio.yaml", fakes, TRIO))


@pytest.fixture
async def service(settings: Settings, environ: dict[str, str]) -> AsyncIterator[JobService]:
    async with JobService.serve(environment_of(settings, environ)) as jobs:
        yield jobs


@pytest.fixture(params=["auto", "legacy"])
async def client(
    request: pytest.FixtureRequest, service: JobService, settings: Settings
) -> AsyncIterator[Client]:
    async with Client(create_app(service, settings), mode=request.param) as connected:
        yield connected


async def call(client: Client, tool: str, **arguments: Any) -> Any:
    return await client.call_tool(tool, arguments, raise_on_error=False)


async def job(client: Client, tool: str, **arguments: Any) -> JobView:
    result = await call(client, tool, **arguments)
    assert not result.is_error, result.content[0].text
    view = JobView.model_validate(result.structured_content)
    assert result.content[0].text == view.text()
    return view


# The surface --------------------------------------------------------------------------------------
async def test_lists_five_tools_with_annotations_and_output_schemas(client: Client) -> None:
    tools = {tool.name: tool for tool in await client.list_tools()}
    assert set(tools) == FIVE
    for name in ("get_status", "read_workspace", "list_teams"):
        assert tools[name].annotations.read_only_hint is True
        assert tools[name].annotations.idempotent_hint is True
    assert tools["cancel_job"].annotations.read_only_hint is False
    assert tools["cancel_job"].annotations.idempotent_hint is True
    assert tools["cancel_job"].annotations.destructive_hint is False
    assert tools["ask_team"].annotations.read_only_hint is False
    assert tools["ask_team"].annotations.open_world_hint is True
    for tool in tools.values():
        assert tool.title and tool.description and "ctx" not in tool.input_schema["properties"]
    assert {"job_id", "state", "next", "result"} <= set(tools["ask_team"].output_schema["properties"])
    assert {"teams", "default"} <= set(tools["list_teams"].output_schema["properties"])
    assert {"content", "next_offset"} <= set(tools["read_workspace"].output_schema["properties"])
    wait = tools["ask_team"].input_schema["properties"]["wait_seconds"]
    assert (wait["default"], wait["minimum"], wait["maximum"]) == (45, 0, 50)
    assert tools["ask_team"].input_schema["required"] == ["task"]
    assert tools["get_status"].input_schema["properties"]["wait_seconds"]["default"] == 0
    for tool in tools.values():  # inlined, for clients that follow no $ref (app/server.py, once)
        listed = json.dumps([tool.input_schema, tool.output_schema])
        assert "$ref" not in listed and "$defs" not in listed, tool.name


BAD_CALLS = [
    ("ask_team", {"task": ""}, ["task", "non-empty"]),
    ("ask_team", {"task": "   \n"}, ["task"]),
    ("ask_team", {"task": "x" * (MAX_TASK + 1)}, ["task", str(MAX_TASK)]),
    ("ask_team", {"task": "t", "team": "frontiers"}, ["'frontiers'", "frontier"]),
    ("ask_team", {"task": "t", "team": "/no/such/team.yaml"}, ["/no/such/team.yaml", "does not exist"]),
    ("ask_team", {"task": "t", "team": "frontier"}, ["ANTHROPIC_API_KEY"]),
    ("ask_team", {"task": "t", "wait_seconds": 51}, ["wait_seconds", "50"]),
    ("ask_team", {"task": "t", "wait_seconds": -1}, ["wait_seconds", "0"]),
    (
        "ask_team",
        {"task": "t", "context_paths": [{"path": "/no/such/dir"}]},
        ["context_paths[0]", "does not exist"],
    ),
    (
        "ask_team",
        {"task": "t", "context_paths": [{"path": "/etc/hostname"}]},
        ["context_paths[0]", "not a directory"],
    ),
    ("ask_team", {"task": "t", "apply": True}, ["apply", "permission 'write'"]),
    ("ask_team", {"task": "t", "apply": True, "context_paths": [{"path": "/usr"}]}, ["apply", "'write'"]),
    # consent is a real boolean: a string is not read as one (jobs/request.py)
    ("ask_team", {"task": "t", "team": "frontier", "force_binary": "yes"}, ["force_binary", "boolean"]),
    ("ask_team", {"task": "t", "team": "frontier", "apply": "true"}, ["apply", "boolean"]),
    ("get_status", {"job_id": "cj-000000000000", "wait_seconds": 51}, ["wait_seconds", "50"]),
    ("get_status", {"job_id": "not a job"}, ["job_id", "'not a job'", "cj-"]),
    ("get_status", {"job_id": "cj-000000000000"}, ["cj-000000000000", "no such job"]),
    ("cancel_job", {"job_id": "cj-000000000000"}, ["no such job"]),
    ("read_workspace", {"job_id": "cj-000000000000"}, ["no such job"]),
    ("read_workspace", {"job_id": "cj-000000000000", "limit": 0}, ["limit"]),
]


async def test_bad_input_is_a_tool_error_naming_the_fix_and_the_server_keeps_serving(client: Client) -> None:
    for tool, arguments, expected in BAD_CALLS:
        result = await call(client, tool, **arguments)
        assert result.is_error, (tool, arguments)
        message = result.content[0].text
        for part in expected:
            assert part in message, (tool, arguments, message)
        teams = await call(client, "list_teams")  # still serving
        assert not teams.is_error


async def test_unknown_argument_is_refused(client: Client) -> None:
    result = await call(client, "get_status", job_id="cj-000000000000", wait=3)
    assert result.is_error and "wait" in result.content[0].text


async def test_list_teams_shows_presets_and_missing_keys(client: Client) -> None:
    result = await call(client, "list_teams")
    teams = TeamList.model_validate(result.structured_content)
    by_name = {team.name: team for team in teams.teams}
    assert {"frontier", "anthropic", "openai", "gemini"} <= set(by_name)
    frontier = by_name["frontier"]
    assert not frontier.ready
    assert "ANTHROPIC_API_KEY" in frontier.missing_keys and "OPENAI_API_KEY" not in frontier.missing_keys
    assert [agent.key_set for agent in frontier.agents if agent.model.startswith("openai/")] == [True]
    assert by_name["openai"].ready and teams.default == "openai"
    assert "frontier: needs ANTHROPIC_API_KEY" in result.content[0].text


async def test_a_missing_key_in_a_team_file_names_the_variable(
    client: Client, tmp_path: Path, fakes: FakeProviders
) -> None:
    # in the user's team folder: a project's team file may send no variable to a URL of its own
    write_team(
        tmp_path / "config" / "conclave" / "teams" / "keyless.yaml", fakes, TRIO, key_env="CONCLAVE_UNSET_KEY"
    )
    result = await call(client, "ask_team", task="t", team="keyless")
    assert result.is_error and "set the CONCLAVE_UNSET_KEY environment variable" in result.content[0].text


def test_progress_messages_say_what_moved() -> None:
    def view(state: str, round: int, *agents: tuple[str, int, str | None]) -> JobView:
        return JobView(
            job_id="cj-0123456789ab",
            state=state,
            phase="p",
            elapsed_s=1,
            team="t",
            task="x",
            progress=Progress(
                phase="coordinating",
                round=round,
                agents=[
                    AgentProgress(letter=letter, model="x/y", state="working", answers=answers, vote=vote)
                    for letter, answers, vote in agents
                ],
            ),
            next="wait",
        )

    first = view("running", 1, ("A", 0, None), ("B", 1, None))
    assert changes(None, first) == ["job cj-0123456789ab running: p"]
    later = view("presenting", 2, ("A", 1, "B1"), ("B", 1, "B1"))
    assert changes(first, later) == ["round 2", "A posted A1", "A voted B1", "B voted B1", "presenting"]
    assert changes(later, later) == []


# Jobs that run --------------------------------------------------------------------------------
async def test_ask_team_returns_the_completed_job_with_progress(client: Client, team: str) -> None:
    notes: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append((progress, total, message))

    result = await client.call_tool(
        "ask_team", {"task": "What is 6 * 7?", "team": team, "wait_seconds": 30}, progress_handler=on_progress
    )
    view = JobView.model_validate(result.structured_content)
    assert view.state == "completed", view.text()
    assert view.result.consensus is True and view.result.winner is not None
    assert view.result.tally[view.result.winner] == 3
    assert view.answer is not None and view.answer.startswith("FINAL:")
    assert view.usage.input_tokens > 0 and view.usage.output_tokens > 0
    assert [agent.answers for agent in view.agents] == [1, 1, 1]
    assert "Final answer:" in result.content[0].text and view.job_id in result.content[0].text

    progress = [note[0] for note in notes]
    assert progress == sorted(set(progress)) and len(progress) >= 2
    messages = " | ".join(note[2] or "" for note in notes)
    assert view.job_id in notes[0][2]
    assert "posted" in messages and "voted" in messages and "completed" in messages


async def test_get_status_long_poll_returns_when_the_job_ends(client: Client, team: str) -> None:
    view = await job(client, "ask_team", task="What is 6 * 7?", team=team, wait_seconds=0)
    assert view.state in ("queued", "running")
    assert f"job_id={view.job_id!r}" in view.next and "get_status" in view.next
    done = await job(client, "get_status", job_id=view.job_id, wait_seconds=40)
    assert done.state == "completed"
    again = await job(client, "get_status", job_id=view.job_id)
    assert again.answer == done.answer


async def test_a_slow_job_returns_running_then_completes(
    client: Client, fakes: FakeProviders, team: str
) -> None:
    install(fakes.script, TRIO, voter(delay=1.5))
    started = time.monotonic()
    view = await job(client, "ask_team", task="Slow one", team=team, wait_seconds=1)
    assert time.monotonic() - started >= 0.9  # wall-time: the call waited its wait_seconds
    assert view.state == "running" and view.answer is None
    assert "get_status" in view.next and view.job_id in view.next
    notes: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append(message)

    result = await client.call_tool(
        "get_status", {"job_id": view.job_id, "wait_seconds": 40}, progress_handler=on_progress
    )
    done = JobView.model_validate(result.structured_content)
    assert done.state == "completed" and done.answer
    assert notes and any("posted" in (note or "") for note in notes)


async def test_budgets_the_estimate_and_the_leading_answer_reach_the_caller(
    client: Client, fakes: FakeProviders, team: str
) -> None:
    refused = await call(client, "ask_team", task="What is 6 * 7?", team=team, max_cost_usd=0.5)
    assert (
        refused.is_error
        and "max_cost_usd=0.5 is not valid: a cost budget needs a price" in refused.content[0].text
    )
    install(fakes.script, TRIO, voter(delay=0.4))
    first = await call(client, "ask_team", task="What is 6 * 7?", team=team, wait_seconds=0, max_tokens=10**6)
    view = JobView.model_validate(first.structured_content)
    assert list(first.structured_content)[:3] == ["job_id", "state", "estimate"]  # what a model reads first
    assert (
        view.estimate is not None
        and "no past jobs" in view.estimate.note
        and view.budget == {"max_tokens": 10**6}
    )
    leading, presenting = None, None
    with anyio.fail_after(120):
        while not view.done:
            await anyio.sleep(0.1)
            view = await job(client, "get_status", job_id=view.job_id)
            now = view.progress.leading if view.progress is not None else None
            leading = leading or now
            presenting = presenting or (now if view.state == "presenting" else None)
    assert view.progress is not None and view.progress.leading is None  # done: the result has the vote
    assert leading is not None and leading.preview.startswith("Answer from")
    assert presenting is not None and presenting.label == view.result.winner  # while it presents: the winner
    assert view.state == "completed" and view.estimate is None


async def test_cancel_job_stops_a_running_job(client: Client, fakes: FakeProviders, team: str) -> None:
    install(fakes.script, TRIO, voter(delay=5))
    view = await job(client, "ask_team", task="Never mind", team=team, wait_seconds=0)
    cancelled = await job(client, "cancel_job", job_id=view.job_id)
    assert cancelled.state == "cancelled" and "cancelled" in cancelled.next
    assert (await job(client, "get_status", job_id=view.job_id)).state == "cancelled"
    assert (await job(client, "cancel_job", job_id=view.job_id)).state == "cancelled"  # idempotent
    listing = await call(client, "read_workspace", job_id=view.job_id)
    assert "transcript" in WorkspacePage.model_validate(listing.structured_content).entries


async def test_read_workspace_lists_reads_and_pages(client: Client, team: str) -> None:
    view = await job(client, "ask_team", task="What is 6 * 7?", team=team, wait_seconds=30)
    assert view.state == "completed"

    async def read(**arguments: Any) -> WorkspacePage:
        result = await call(client, "read_workspace", job_id=view.job_id, **arguments)
        assert not result.is_error, result.content[0].text
        page = WorkspacePage.model_validate(result.structured_content)
        assert result.content[0].text == page.text()
        return page

    listing = await read()
    assert listing.entries is not None
    assert {"transcript", "final", f"answers/{view.result.winner}"} <= set(listing.entries)
    assert len([entry for entry in listing.entries if entry.startswith("answers/")]) == 3

    answer = await read(path=f"answers/{view.result.winner}")
    assert answer.content.startswith("Answer from ") and answer.next_offset is None
    assert (await read(path="final")).content == view.answer

    transcript = await read(path="transcript")
    assert view.job_id in transcript.content and "voted for" in transcript.content
    pages, offset = [], 0
    while offset is not None:
        page = await read(path="transcript", offset=offset, limit=500)
        assert len(page.content) <= 500
        pages.append(page.content)
        offset = page.next_offset
    assert "".join(pages) == transcript.content and len(pages) > 1
    first = await read(path="transcript", limit=10)
    assert first.next_offset == 10 and "offset=10" in first.text()

    for bad in ("../../etc/passwd", "answers/Z9", "nope"):
        result = await call(client, "read_workspace", job_id=view.job_id, path=bad)
        assert result.is_error and "path=" in result.content[0].text, result.content[0].text
