"""MCP Tasks (SEP-2663) for ask_team, with real clients: FastMCP's Client with fastmcp-tasks's client half
(in memory, and over streamable HTTP across a server restart) and the official `mcp` client (over stdio,
and over HTTP). A task is the job: its id is the job id, tasks/get agrees with get_status, and a client
without the extension keeps the wait_seconds route."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest
from fastmcp import Client
from mcp.client.client import Client as McpClient
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp_types import CallToolResult, Request, RequestParams, Result
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ConfigDict, Field

from conclave.app.server import create_app
from conclave.app.tasks import TASKS
from conclave.backends.retry import RetryPolicy
from conclave.jobs.read.views import JobView
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.processes import HTTP_TOKEN, http_server, official_http, stdio_params
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, install, voter, write_team

pytestmark = pytest.mark.anyio
ENV = {KEY_ENV: "test-key-0123456789"}
FAST = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05)
ASK = {"task": "What is 6 * 7?", "team": "fake-trio"}


@pytest.fixture
def task_clients() -> Iterator[None]:
    """fastmcp-tasks's client half on FastMCP's Client for this test only (importing the package turns
    it on for every Client in the process; the other tests' clients stay without tasks)."""
    from fastmcp.client import extension_hooks

    before = list(extension_hooks._internal_client_extension_factories)
    import fastmcp_tasks.client

    extension_hooks.register_internal_client_extension_factory(
        fastmcp_tasks.client._build_tasks_client_extension
    )
    yield
    extension_hooks._internal_client_extension_factories[:] = before


@pytest.fixture
def fakes() -> Iterator[FakeProviders]:
    with FakeProviders() as running:
        install(running.script, TRIO, voter(delay=0.4))
        yield running


def trio_preset(tmp_path: Path, fakes: FakeProviders) -> Path:
    """The fake team as the user's preset `fake-trio` (XDG_CONFIG_HOME=tmp_path/config)."""
    config = tmp_path / "config"
    write_team(config / "conclave" / "teams" / "fake-trio.yaml", fakes, TRIO, name="fake-trio")
    return config


# The official mcp client: its own small extension declares the capability and the claimed handle -----
class Handle(Result):
    model_config = ConfigDict(populate_by_name=True)
    result_type: Literal["task"] = Field(alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str


class Polled(Result):
    model_config = ConfigDict(populate_by_name=True)
    result_type: Literal["complete"] = Field(alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str
    status_message: str | None = Field(default=None, alias="statusMessage")
    result: dict[str, Any] | None = None


class TaskId(RequestParams):
    model_config = ConfigDict(populate_by_name=True)
    task_id: str = Field(serialization_alias="taskId")


class TaskGet(Request[TaskId, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskId


class TasksAd(ClientExtension):
    identifier = TASKS

    def claims(self) -> tuple[ResultClaim[Any], ...]:
        return (
            ResultClaim(
                result_type="task",
                model=Handle,
                resolve=self._keep,
                protocol_versions=frozenset(MODERN_PROTOCOL_VERSIONS),
            ),
        )

    async def _keep(self, handle: Handle, ctx: ClaimContext) -> CallToolResult:
        raise AssertionError("the test follows the task itself (allow_claimed=True)")


async def follow_with_mcp(
    client: McpClient, arguments: dict[str, Any]
) -> tuple[Handle, list[Polled], JobView]:
    """ask_team as a task through the official client; every tasks/get until done; get_status's view."""
    handle = await client.session.call_tool("ask_team", arguments, allow_claimed=True)
    assert isinstance(handle, Handle), handle
    polls: list[Polled] = []
    with anyio.fail_after(60):
        while not polls or polls[-1].status == "working":
            polls.append(
                await client.session.send_request(TaskGet(params=TaskId(task_id=handle.task_id)), Polled)
            )
            await anyio.sleep(0.2)
    status = await client.session.call_tool("get_status", {"job_id": handle.task_id})
    return handle, polls, JobView.model_validate(status.structured_content)


def same_view(task_result: dict[str, Any] | None, status: JobView) -> None:
    assert task_result is not None
    view = JobView.model_validate(task_result["structuredContent"])
    assert view.state == status.state == "completed" and view.answer == status.answer
    # web_url names the page on whichever server answers (its port changes with a restart)
    assert view.model_dump(exclude={"elapsed_s", "web_url"}) == status.model_dump(
        exclude={"elapsed_s", "web_url"}
    )
    assert task_result["content"][0]["text"].startswith(f"Job {status.job_id}")


# In memory: FastMCP's Client with tasks ---------------------------------------------------------------
async def test_fastmcp_client_gets_a_handle_at_once_and_the_task_is_the_job(
    tmp_path: Path, fakes: FakeProviders, task_clients: None
) -> None:
    from fastmcp_tasks import call_tool_task

    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO, name="fake-trio"))
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        async with Client(create_app(service, service.settings)) as client:
            task = await call_tool_task(client, "ask_team", {"task": "What is 6 * 7?", "team": team})
            first = await task.status()
            assert first.status == "working" and not (await service.lookup.view(task.task_id)).done
            messages = {first.status_message}
            with anyio.fail_after(60):
                while (now := await task.status()).status == "working":
                    messages.add(now.status_message)
                    await anyio.sleep(0.1)
            assert len(messages) > 1, "the status never moved"
            done = await task.result()
            status = await client.call_tool("get_status", {"job_id": task.task_id})
            same_view(
                done.structured_content
                and {
                    "structuredContent": done.structured_content,
                    "content": [{"text": done.content[0].text}],
                },
                JobView.model_validate(status.structured_content),
            )
            # a plain call_tool is tasked too, and fastmcp-tasks polls it to the final result for the caller
            plain = await client.call_tool(
                "ask_team", {"task": "And 7 * 6?", "team": team, "wait_seconds": 0}
            )
            assert JobView.model_validate(plain.structured_content).state == "completed"
        async with Client(create_app(service, service.settings), mode="legacy") as legacy:
            old = await legacy.call_tool("ask_team", {"task": "Again?", "team": team, "wait_seconds": 0})
            assert not JobView.model_validate(old.structured_content).done  # no tasks: today's route


async def test_a_client_without_the_extension_keeps_the_wait_seconds_route(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO, name="fake-trio"))
    async with (
        JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service,
        Client(create_app(service, service.settings)) as client,
    ):
        result = await client.call_tool(
            "ask_team", {"task": "What is 6 * 7?", "team": team, "wait_seconds": 0}
        )
        view = JobView.model_validate(result.structured_content)
        assert not view.done and "get_status" in view.next


# Over HTTP, across a restart ---------------------------------------------------------------------------
async def test_over_http_a_task_outlives_its_server(
    tmp_path: Path, fakes: FakeProviders, task_clients: None
) -> None:
    from fastmcp_tasks import call_tool_task

    env = {
        "CONCLAVE_HOME": str(tmp_path / "home"),
        "XDG_CONFIG_HOME": str(trio_preset(tmp_path, fakes)),
        **ENV,
    }
    with http_server(tmp_path, env) as url:
        async with Client(url, auth=HTTP_TOKEN) as client:
            task = await call_tool_task(client, "ask_team", ASK)
            assert (await task.status()).status == "working"
            done = await task.wait(timeout=60)
            status = JobView.model_validate(
                (await client.call_tool("get_status", {"job_id": task.task_id})).structured_content
            )
            same_view(done.result, status)
        async with McpClient(
            official_http(url), extensions=[TasksAd()]
        ) as official:  # the official client, same server
            _handle, polls, view = await follow_with_mcp(official, ASK)
            assert polls[0].status == "working" and polls[-1].status == "completed"
            same_view(polls[-1].result, view)
    with http_server(tmp_path, env) as url:  # a new server process on the same store
        async with Client(url, auth=HTTP_TOKEN) as client:
            again = await client.session.send_request(TaskGet(params=TaskId(task_id=task.task_id)), Polled)
            assert again.status == "completed"
            same_view(again.result, status)


# Over stdio: the official mcp client ------------------------------------------------------------------
async def test_official_client_over_stdio_follows_a_task(tmp_path: Path, fakes: FakeProviders) -> None:
    trio_preset(tmp_path, fakes)
    async with McpClient(stdio_params(tmp_path), extensions=[TasksAd()]) as client:
        handle, polls, view = await follow_with_mcp(client, ASK)
    assert handle.task_id == view.job_id and polls[0].status == "working"
    assert len({poll.status_message for poll in polls}) > 1  # the status moved as the job did
    same_view(polls[-1].result, view)
