"""A real `python -m conclave serve` over stdio, driven by the official `mcp` client, against the fakes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import stdio_client

from conclave.jobs.read.reader import WorkspacePage
from conclave.jobs.read.teams import TeamList
from conclave.jobs.read.views import JobView
from tests.fakes.processes import stdio_params
from tests.fakes.server import FakeProviders
from tests.fakes.team import TRIO, install, voter, write_team

pytestmark = pytest.mark.anyio
FIVE = {"ask_team", "get_status", "read_workspace", "cancel_job", "list_teams", "steer_job"}


@pytest.fixture
def fakes() -> Iterator[FakeProviders]:
    with FakeProviders() as running:
        install(running.script, TRIO, voter())
        yield running


async def test_stdio_server_runs_a_job_to_completion(tmp_path: Path, fakes: FakeProviders) -> None:
    # The team is a user preset found through XDG_CONFIG_HOME; its key comes from the environment.
    config = tmp_path / "config"
    write_team(config / "conclave" / "teams" / "fake-trio.yaml", fakes, TRIO, name="fake-trio")
    params = stdio_params(tmp_path)  # user teams under tmp_path/config, as written above
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        init = await session.initialize()
        assert init.server_info.name == "conclave" and "ask_team" in (init.instructions or "")
        tools = (await session.list_tools()).tools
        assert {tool.name for tool in tools} == FIVE

        listed = await session.call_tool("list_teams", {})
        teams = TeamList.model_validate(listed.structured_content)
        trio = next(team for team in teams.teams if team.name == "fake-trio")
        assert trio.ready and len(trio.agents) == 3

        bad = await session.call_tool("get_status", {"job_id": "nope"})
        assert bad.is_error and "job_id='nope'" in bad.content[0].text

        result = await session.call_tool(
            "ask_team",
            {"task": "What is 6 * 7?", "team": "fake-trio", "wait_seconds": 40},
            progress_callback=on_progress,
        )
        assert not result.is_error, result.content[0].text
        view = JobView.model_validate(result.structured_content)
        assert view.state == "completed" and view.result.consensus and view.answer.startswith("FINAL:")
        assert result.content[0].text == view.text()
        assert progress and [value for value, _ in progress] == sorted({value for value, _ in progress})

        final = await session.call_tool("read_workspace", {"job_id": view.job_id, "path": "final"})
        assert WorkspacePage.model_validate(final.structured_content).content == view.answer

    assert (tmp_path / "home" / "conclave.db").is_file()
