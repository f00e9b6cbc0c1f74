"""Every tool's structured result matches its own output schema, in every state a job can be in (issue 36).

The official `mcp` client (ClientSession) checks each result's structured content against the output
schema the tool listed, and raises "Invalid structured content returned by tool ..." when they differ:
the caller then sees that error instead of the job, and a failed job's own message is lost. Each test
below puts a job in one state with the fake providers through the real SDKs (queued behind a full server,
running, completed, failed because every provider refuses it, cancelled, interrupted by a server that
stopped, stopped by its token budget), then calls every tool on it through that client, and wants every
call validated and the reason the job ended in what the caller reads.
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fastmcp.client.transports import FastMCPTransport
from mcp.client.session import ClientSession
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult, TextContent

from conclave.app.server import create_app
from conclave.backends.retry import RetryPolicy
from conclave.jobs.read.reader import WorkspacePage
from conclave.jobs.read.teams import TeamList
from conclave.jobs.read.views import JobView
from conclave.jobs.service import JobService
from conclave.settings import MAX_WAIT_S, Settings
from tests.fakes.environment import environment_of
from tests.fakes.processes import stdio_params
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, install, is_presentation, voter, write_team
from tests.fakes.waits import until_state

pytestmark = pytest.mark.anyio
FAST = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.05)
TASK = "What is 6 * 7?"
WAIT = MAX_WAIT_S  # a call waits this long at most; the jobs here end sooner
MAX_CPUS = 64  # what a team file may ask for (config/models.py SandboxSpec)
SLOW = 30.0  # a reply this slow keeps the job running for as long as a test looks at it
MODELS = {"ask_team": JobView, "get_status": JobView, "cancel_job": JobView, "steer_job": JobView}
MODELS |= {"read_workspace": WorkspacePage, "list_teams": TeamList}


def environ(tmp_path: Path) -> dict[str, str]:
    """The fakes' key, and the user's team folder (where team_file writes: its keys may go to the fakes)."""
    return {KEY_ENV: "test-key-0123456789", "XDG_CONFIG_HOME": str(tmp_path / "config")}


def settings_of(tmp_path: Path, **overrides: Any) -> Settings:
    return Settings(home=tmp_path / "home", heartbeat_s=0.2, **overrides)


@asynccontextmanager
async def official(service: JobService, settings: Settings) -> AsyncIterator[ClientSession]:
    """The official client's session on the app, in memory, with every tool's output schema listed (the
    session validates each result against it)."""
    async with FastMCPTransport(create_app(service, settings)).connect_session() as session:
        await session.initialize()
        listed = {tool.name for tool in (await session.list_tools()).tools}
        assert listed == set(MODELS), "a new tool: give it its result model here"
        yield session


@asynccontextmanager
async def served(settings: Settings) -> AsyncIterator[tuple[JobService, ClientSession]]:
    """A job service, as a server holds it, and the official client's session on its app."""
    async with (
        JobService.serve(environment_of(settings, environ(settings.home.parent), FAST)) as service,
        official(service, settings) as session,
    ):
        yield service, session


async def call(session: ClientSession, tool: str, **arguments: Any) -> CallToolResult:
    """One call; the session raises if the structured content does not match the tool's schema."""
    result = await session.call_tool(tool, arguments)
    assert isinstance(result, CallToolResult)
    if not result.is_error:
        MODELS[tool].model_validate(result.structured_content)
    return result


def text_of(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


def view_of(result: CallToolResult) -> JobView:
    assert not result.is_error, text_of(result)
    return JobView.model_validate(result.structured_content)


async def every_tool(session: ClientSession, job_id: str) -> dict[str, CallToolResult]:
    """Each tool on the job, in its state; cancel_job last (it ends a live job), then a follow-up."""
    results = {
        "get_status": await call(session, "get_status", job_id=job_id),
        "read_workspace": await call(session, "read_workspace", job_id=job_id),
        "list_teams": await call(session, "list_teams"),
        "steer_job": await call(session, "steer_job", job_id=job_id, message="keep it short"),
        "cancel_job": await call(session, "cancel_job", job_id=job_id),
    }
    results["ask_team"] = await call(session, "ask_team", task="And 7 * 7?", follow_up=job_id, wait_seconds=0)
    assert set(results) == set(MODELS)
    return results


def nullable(schema: dict[str, Any]) -> bool:
    return schema.get("type") == "null" or any(nullable(part) for part in schema.get("anyOf", []))


def required_nullables(schema: Any, where: str = "") -> list[str]:
    """Every property some object of the schema requires and allows to be null."""
    found = []
    if isinstance(schema, dict):
        required = set(schema.get("required", []))
        properties = schema.get("properties") or {}
        found += [
            f"{where}.{name}" for name, part in properties.items() if name in required and nullable(part)
        ]
        for key, value in schema.items():
            found += required_nullables(value, f"{where}/{key}")
    elif isinstance(schema, list):
        for index, value in enumerate(schema):
            found += required_nullables(value, f"{where}[{index}]")
    return found


async def test_no_job_field_the_result_leaves_out_is_required(tmp_path: Path) -> None:
    """A job's structured result leaves out what is None (jobs/read/views.py `structured`), so no field
    its schema requires may be null: some state of a job would then break every call that shows it."""
    async with served(settings_of(tmp_path)) as (_, session):
        tools = (await session.list_tools()).tools
    shown = [tool for tool in tools if MODELS[tool.name] is JobView]
    assert shown and all(tool.output_schema for tool in shown)
    assert [(tool.name, required_nullables(tool.output_schema)) for tool in shown] == [
        (tool.name, []) for tool in shown
    ]


def slow(request: RecordedRequest) -> Reply:
    return voter(delay=SLOW)(request)


def team_file(tmp_path: Path, fakes: FakeProviders, sandbox: dict[str, Any] | None = None) -> str:
    folder = tmp_path / "config" / "conclave" / "teams"
    return str(write_team(folder / "trio.yaml", fakes, TRIO, sandbox=sandbox or "none"))


async def test_a_completed_job(tmp_path: Path, fakes: FakeProviders) -> None:
    install(fakes.script, TRIO, voter())
    team, settings = team_file(tmp_path, fakes), settings_of(tmp_path)
    async with served(settings) as (_service, session):
        view = view_of(await call(session, "ask_team", task=TASK, team=team, wait_seconds=WAIT))
        assert view.state == "completed" and view.result is not None and view.result.winner
        results = await every_tool(session, view.job_id)
        assert view_of(results["get_status"]).state == "completed"
        assert results["steer_job"].is_error and "follow_up" in text_of(results["steer_job"])


async def test_a_failed_job_says_why(tmp_path: Path, fakes: FakeProviders) -> None:
    for _, agent in TRIO:
        fakes.script.set_default(agent, Reply(status=401, error_message=f"bad key for {agent}"))
    team, settings = team_file(tmp_path, fakes), settings_of(tmp_path)
    async with served(settings) as (_service, session):
        result = await call(session, "ask_team", task=TASK, team=team, wait_seconds=WAIT)
        view = view_of(result)
        assert view.state == "failed" and view.result is not None and view.result.winner is None
        for _, agent in TRIO:  # each provider's own message, in the text and the structured result
            assert f"bad key for {agent}" in text_of(result), text_of(result)
            assert any(f"bad key for {agent}" in error for error in view.result.errors.values())
        results = await every_tool(session, view.job_id)
        assert "bad key for ann" in text_of(results["get_status"])
        assert view_of(results["cancel_job"]).state == "failed"


async def test_a_job_whose_sandboxes_cannot_start_says_why(
    tmp_path: Path, fakes: FakeProviders, docker_image: str
) -> None:
    """More CPUs than the engine has: Docker refuses to create the agents' containers, so the job fails
    at its start, before any agent answers, with the engine's own words."""
    cpus = (os.cpu_count() or 1) + 1
    if cpus > MAX_CPUS:
        pytest.skip(f"this machine has {cpus - 1} CPUs, as many as a team may ask for")
    install(fakes.script, TRIO, voter())
    team = team_file(tmp_path, fakes, sandbox={"memory": "256m", "cpus": cpus, "pids": 64})
    project = tmp_path / "project"
    project.mkdir()
    (project / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    settings, context = settings_of(tmp_path), [{"path": str(project)}]
    async with served(settings) as (_, session):
        arguments = {"task": TASK, "team": team, "context_paths": context, "wait_seconds": WAIT}
        result = await call(session, "ask_team", **arguments)
        view = view_of(result)
        assert view.state == "failed" and view.result is not None and view.result.winner is None
        shown = text_of(result)  # the engine's own words, as the sandbox said them: not a crash
        assert "container of agent" in shown and "did not start" in shown and "CPUs" in shown, shown
        assert "internal error" not in shown and "ExceptionGroup" not in shown, shown
        results = await every_tool(session, view.job_id)
        assert "CPU" in text_of(results["get_status"])


async def test_a_failed_job_says_why_over_stdio(tmp_path: Path, fakes: FakeProviders) -> None:
    """The same through a real `conclave serve` over stdio, as a client runs it."""
    for _, agent in TRIO:
        fakes.script.set_default(agent, Reply(status=401, error_message=f"bad key for {agent}"))
    write_team(tmp_path / "config" / "conclave" / "teams" / "fake-trio.yaml", fakes, TRIO, name="fake-trio")
    async with stdio_client(stdio_params(tmp_path)) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.list_tools()
        result = await call(session, "ask_team", task=TASK, team="fake-trio", wait_seconds=WAIT)
        view = view_of(result)
        assert view.state == "failed" and "bad key for bob" in text_of(result), text_of(result)
        results = await every_tool(session, view.job_id)
        assert "bad key for cy" in text_of(results["get_status"])


async def test_a_job_stopped_by_its_budget_before_any_answer(tmp_path: Path, fakes: FakeProviders) -> None:
    """cy's first chunk reports 50,000 input tokens, over the job's 1,000, while ann and bob think."""
    install(fakes.script, TRIO, slow)
    fakes.script.set_default("cy", Reply(text="Let me think.", usage=(50_000, 10, 0), stall=SLOW))
    team, settings = team_file(tmp_path, fakes), settings_of(tmp_path)
    async with served(settings) as (_service, session):
        arguments = {"task": TASK, "team": team, "max_tokens": 1_000, "wait_seconds": WAIT}
        result = await call(session, "ask_team", **arguments)
        view = view_of(result)
        assert view.done and view.result is not None and view.result.budget_reached, text_of(result)
        assert view.result.winner is None and "budget" in text_of(result)
        await every_tool(session, view.job_id)


async def test_a_job_stopped_by_its_budget_with_a_winner(tmp_path: Path, fakes: FakeProviders) -> None:
    install(fakes.script, TRIO, voter())
    team, settings = team_file(tmp_path, fakes), settings_of(tmp_path)
    async with served(settings) as (_service, session):
        arguments = {"task": TASK, "team": team, "max_tokens": 1, "wait_seconds": WAIT}
        view = view_of(await call(session, "ask_team", **arguments))
        assert view.done and view.result is not None and view.result.budget_reached
        await every_tool(session, view.job_id)


async def test_a_running_job_then_cancelled(tmp_path: Path, fakes: FakeProviders) -> None:
    install(fakes.script, TRIO, slow)
    team, settings = team_file(tmp_path, fakes), settings_of(tmp_path)
    async with served(settings) as (service, session):
        view = view_of(await call(session, "ask_team", task=TASK, team=team, wait_seconds=0))
        await until_state(service, view.job_id, "running")
        results = await every_tool(session, view.job_id)  # cancel_job ends it
        assert view_of(results["get_status"]).state == "running"
        assert not results["steer_job"].is_error
        assert view_of(results["cancel_job"]).state == "cancelled"
        cancelled = await every_tool(session, view.job_id)
        assert view_of(cancelled["get_status"]).state == "cancelled"


async def test_a_presenting_job(tmp_path: Path, fakes: FakeProviders) -> None:
    """The vote is over and the winner's author writes the final answer, held until the test lets it go."""
    gate = threading.Event()
    vote = voter()

    def respond(request: RecordedRequest) -> Reply:
        return Reply(text="FINAL: 42", gate=gate) if is_presentation(request) else vote(request)

    install(fakes.script, TRIO, respond)
    team, settings = team_file(tmp_path, fakes), settings_of(tmp_path)
    try:
        async with served(settings) as (service, session):
            view = view_of(await call(session, "ask_team", task=TASK, team=team, wait_seconds=0))
            presenting = await until_state(service, view.job_id, "presenting")
            assert presenting.result is None and presenting.progress is not None
            results = await every_tool(session, view.job_id)  # cancel_job ends it
            assert view_of(results["get_status"]).state == "presenting"
    finally:
        gate.set()


async def test_a_queued_job(tmp_path: Path, fakes: FakeProviders) -> None:
    install(fakes.script, TRIO, slow)
    team, settings = team_file(tmp_path, fakes), settings_of(tmp_path, max_jobs=1)
    async with served(settings) as (service, session):
        first = view_of(await call(session, "ask_team", task=TASK, team=team, wait_seconds=0))
        await until_state(service, first.job_id, "running")
        queued = view_of(await call(session, "ask_team", task=TASK, team=team, wait_seconds=0))
        assert queued.state == "queued"
        results = await every_tool(session, queued.job_id)
        assert view_of(results["get_status"]).state == "queued"
        await call(session, "cancel_job", job_id=first.job_id)


async def test_an_interrupted_job(tmp_path: Path, fakes: FakeProviders) -> None:
    install(fakes.script, TRIO, slow)
    team, settings = team_file(tmp_path, fakes), settings_of(tmp_path)
    async with served(settings) as (service, session):
        view = view_of(await call(session, "ask_team", task=TASK, team=team, wait_seconds=0))
        await until_state(service, view.job_id, "running")
    async with served(settings) as (_, session):  # the next server
        results = await every_tool(session, view.job_id)
        interrupted = view_of(results["get_status"])
        assert interrupted.state == "interrupted" and interrupted.phase in text_of(results["get_status"])
