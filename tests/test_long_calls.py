"""Long calls never hang a client: every tool returns within its `wait_seconds` however slow the team,
progress notifications carry an increasing `progress` and a short message, and a client that goes away
mid-call leaves the job to run on (HTTP, in memory) or, when its stdio server goes with it, readable as
`interrupted` from a new client.

The bounds are behavioural (a client's tool-call timeout depends on them), not speed benchmarks: a
call may take `wait_seconds` plus MARGIN at most.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import Client
from mcp.client.session import ClientSession
from mcp.client.stdio import stdio_client

from conclave.app.server import create_app
from conclave.jobs.read.reader import WorkspacePage
from conclave.jobs.read.views import JobView
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.processes import HTTP_TOKEN, http_server, stdio_params
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, install, voter, write_team

pytestmark = pytest.mark.anyio

MARGIN = 1.5  # seconds over wait_seconds a call may take: one poll, the view, the transport
SHORT = 200  # characters: a progress message is a line, not a report
JOB_ID = re.compile(r"cj-[0-9a-f]{12}")
ACTIVE = ("queued", "running", "presenting")
Note = tuple[float, float | None, str | None]


@pytest.fixture
def team(tmp_path: Path, fakes: FakeProviders) -> str:
    return str(write_team(tmp_path / "config" / "conclave" / "teams" / "trio.yaml", fakes, TRIO, name="trio"))


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[JobService]:
    settings = Settings(home=tmp_path / "home")
    environ = {KEY_ENV: "test-key", "XDG_CONFIG_HOME": str(tmp_path / "config")}
    async with JobService.serve(environment_of(settings, environ)) as jobs:
        yield jobs


@pytest.fixture(params=["auto", "legacy"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def timed(client: Client, tool: str, **arguments: Any) -> tuple[float, Any]:
    started = time.monotonic()
    result = await client.call_tool(tool, arguments, raise_on_error=False)
    assert not result.is_error, result.content[0].text
    return time.monotonic() - started, result.structured_content


def check_progress(notes: list[Note]) -> None:
    values = [value for value, _, _ in notes]
    assert values and all(later > earlier for earlier, later in itertools.pairwise(values)), values
    for value, total, message in notes:
        assert isinstance(message, str) and 0 < len(message) <= SHORT, message
        assert total is None or total >= value


# Every tool within its bound ----------------------------------------------------------------------
async def test_every_tool_returns_within_its_wait_seconds_when_the_team_is_slow(
    service: JobService, fakes: FakeProviders, team: str, mode: str
) -> None:
    install(fakes.script, TRIO, voter(delay=30))  # no provider answers within any call below
    async with Client(create_app(service, service.settings), mode=mode) as client:
        took, started = await timed(client, "ask_team", task="Slow", team="trio", wait_seconds=2)
        assert 2 <= took < 2 + MARGIN and started["state"] in ACTIVE
        job_id = started["job_id"]
        took, view = await timed(client, "get_status", job_id=job_id, wait_seconds=3)
        assert 3 <= took < 3 + MARGIN and view["state"] in ACTIVE
        took, _ = await timed(client, "ask_team", task="Slow too", team="trio", wait_seconds=0)
        assert took < MARGIN
        for tool, arguments in [
            ("get_status", {"job_id": job_id}),
            ("read_workspace", {"job_id": job_id}),
            ("read_workspace", {"job_id": job_id, "path": "transcript"}),
            ("list_teams", {}),
        ]:
            took, _ = await timed(client, tool, **arguments)
            assert took < MARGIN, (tool, took)
        took, cancelled = await timed(client, "cancel_job", job_id=job_id)
        assert took < 5 and cancelled["state"] == "cancelled"  # the in-flight provider call is cut


async def test_over_stdio_calls_return_in_time_and_progress_is_short_and_increasing(
    tmp_path: Path, fakes: FakeProviders, team: str
) -> None:
    """What a coding agent sees: a real `conclave serve` process and the official mcp client."""
    install(fakes.script, TRIO, voter(delay=30))
    notes: list[Note] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        notes.append((value, total, message))

    async with stdio_session(tmp_path) as session:
        started = time.monotonic()
        result = await session.call_tool("ask_team", {"task": "Slow", "team": "trio", "wait_seconds": 2})
        assert 2 <= time.monotonic() - started < 2 + MARGIN  # wall-time: the wait is the behaviour
        job_id = result.structured_content["job_id"]
        started = time.monotonic()
        await session.call_tool("get_status", {"job_id": job_id, "wait_seconds": 2})
        assert 2 <= time.monotonic() - started < 2 + MARGIN  # wall-time: the wait is the behaviour

        install(fakes.script, TRIO, voter(delay=0.2))  # the next job moves: answers, votes, the end
        result = await session.call_tool(
            "ask_team", {"task": "Quick", "team": "trio", "wait_seconds": 40}, progress_callback=on_progress
        )
        assert result.structured_content["state"] == "completed"
    check_progress(notes)
    said = " | ".join(message or "" for _, _, message in notes)
    assert "posted" in said and "voted" in said and "completed" in said


async def test_progress_restarts_per_call_and_stays_short(
    service: JobService, fakes: FakeProviders, team: str, mode: str
) -> None:
    install(fakes.script, TRIO, voter(delay=0.3))
    first: list[Note] = []
    second: list[Note] = []

    def into(notes: list[Note]) -> Callable[[float, float | None, str | None], Any]:
        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            notes.append((value, total, message))

        return on_progress

    async with Client(create_app(service, service.settings), mode=mode) as client:
        result = await client.call_tool(
            "ask_team", {"task": "Q", "team": "trio", "wait_seconds": 0.5}, progress_handler=into(first)
        )
        job_id = result.structured_content["job_id"]
        await client.call_tool(
            "get_status", {"job_id": job_id, "wait_seconds": 40}, progress_handler=into(second)
        )
    check_progress(first)
    check_progress(second)
    assert job_id in (first[0][2] or "") and job_id in (second[0][2] or "")


# A client that goes away mid-call -----------------------------------------------------------------
async def abandon_mid_call(client: Any, arguments: dict[str, Any], *, after: str = "running") -> str:
    """Call ask_team, give up on the call once a progress message mentions `after`; the job id."""
    seen = anyio.Event()
    job: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        job.extend(JOB_ID.findall(message or ""))
        if after in (message or ""):
            seen.set()

    async with anyio.create_task_group() as tg:

        async def call() -> None:
            if isinstance(client, ClientSession):
                await client.call_tool("ask_team", arguments, progress_callback=on_progress)
            else:
                await client.call_tool("ask_team", arguments, progress_handler=on_progress)

        tg.start_soon(call)
        with anyio.fail_after(20):
            await seen.wait()
        tg.cancel_scope.cancel()  # the client stops waiting for the result
    assert job, "no progress message named the job"
    return job[0]


async def test_in_memory_a_client_gone_mid_call_leaves_the_job_running(
    service: JobService, fakes: FakeProviders, team: str, mode: str
) -> None:
    install(fakes.script, TRIO, voter(delay=0.5))
    app = create_app(service, service.settings)
    async with Client(app, mode=mode) as first:
        job_id = await abandon_mid_call(first, {"task": "Q", "team": "trio", "wait_seconds": 40})
    async with Client(app, mode=mode) as second:
        _, view = await timed(second, "get_status", job_id=job_id)
        assert view["state"] in ACTIVE, view
        _, done = await timed(second, "get_status", job_id=job_id, wait_seconds=40)
        assert done["state"] == "completed" and done["result"]["answer"]


async def test_over_http_a_client_gone_mid_call_leaves_the_job_running(
    tmp_path: Path, fakes: FakeProviders, team: str
) -> None:
    install(fakes.script, TRIO, voter(delay=0.5))
    env = {
        "CONCLAVE_HOME": str(tmp_path / "home"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        KEY_ENV: "test-key",
    }
    with http_server(tmp_path, env) as url:
        for mode in ("auto", "legacy"):  # one server process for both protocol eras
            async with Client(url, mode=mode, auth=HTTP_TOKEN) as first:
                job_id = await abandon_mid_call(first, {"task": "Q", "team": "trio", "wait_seconds": 40})
            async with Client(url, mode=mode, auth=HTTP_TOKEN) as second:
                _, view = await timed(second, "get_status", job_id=job_id)
                assert view["state"] in ACTIVE, (mode, view)
                _, done = await timed(second, "get_status", job_id=job_id, wait_seconds=40)
                assert done["state"] == "completed" and done["result"]["answer"], mode


async def test_over_stdio_a_client_gone_mid_call_leaves_the_job_readable(
    tmp_path: Path, fakes: FakeProviders, team: str
) -> None:
    """A stdio server lives as long as its client; the next server finds the job `interrupted`,
    its answers kept."""
    install(fakes.script, TRIO, voter(delay=0.5))
    fakes.script.set_default("cy", voter(delay=30))  # one agent never votes: the job cannot finish
    async with stdio_session(tmp_path) as first:
        job_id = await abandon_mid_call(
            first, {"task": "Q", "team": "trio", "wait_seconds": 40}, after="posted"
        )
    async with stdio_session(tmp_path) as second:
        result = await second.call_tool("get_status", {"job_id": job_id})
        view = JobView.model_validate(result.structured_content)
        assert view.state == "interrupted" and sum(agent.answers for agent in view.agents) >= 1
        listing = await second.call_tool("read_workspace", {"job_id": job_id})
        entries = WorkspacePage.model_validate(listing.structured_content).entries
        assert any(entry.startswith("answers/") for entry in entries), entries


@asynccontextmanager
async def stdio_session(tmp_path: Path) -> AsyncIterator[ClientSession]:
    """`python -m conclave serve` over stdio, the fake team as a user preset, through the official client."""
    async with stdio_client(stdio_params(tmp_path)) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        # The stdio front answers initialize before the server is loaded (conclave.app.stdio_front); the
        # first call waits for the rest of the start, which is not what the timings here are about.
        await session.call_tool("list_teams", {})
        yield session
