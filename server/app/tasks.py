"""MCP Tasks (SEP-2663, the `io.modelcontextprotocol/tasks` extension) for `ask_team`: a task is a job.

A client that opts in to the extension on an `ask_team` call (2026-07-28 protocol only, as the
extension is) gets a task handle at once; the task id IS the job id, and every task method reads the
job from the store, the one source of truth, so a task survives a server restart exactly as its job
does, and any server process sharing the store answers for it:

    tasks/get     queued, running, presenting  -> working, statusMessage: the job's phase
                  completed, failed, interrupted -> completed, result: ask_team's result for the
                                                  finished job, the same JobView get_status returns
                  cancelled                     -> cancelled
    tasks/cancel  cancel_job                    tasks/update  nothing to answer: an acknowledgement

A failed job is a completed task: the call did its work, and its JobView says how the job ended, as
get_status does. Clients without the extension keep the wait_seconds and get_status route.

Why not `fastmcp-tasks`'s TasksExtension: it runs the tool body on Docket, whose task record (in
memory, lost on restart, or in Redis, a second store to run) would be a second copy of the job; mapping
tasks onto jobs meant overriding every handler, and importing it turns task support on for every
FastMCP client in the process. FastMCP's extension API and mcp 2.3's claimed results (a `resultType`
outside the core vocabulary passes the runner's sieve) carry this small mapping; the tests drive it
with fastmcp-tasks's client half and with the official mcp client.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from fastmcp.server.context import Context
from fastmcp.server.dependencies import get_http_request
from fastmcp.server.extensions import MethodBinding, ServerExtension, ToolCallContinuation, ToolCallOutcome
from fastmcp.tools import ToolResult
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, decode_header_value
from mcp_types import INVALID_PARAMS, CallToolRequestParams, CallToolResult, RequestParams, Result
from mcp_types.jsonrpc import HEADER_MISMATCH, MISSING_REQUIRED_CLIENT_CAPABILITY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict, Field

from conclave.errors import ConclaveError
from conclave.jobs.read.views import JobView
from conclave.jobs.service import LOCAL, JobService
from conclave.tools._deps import tool_result

TASKS = "io.modelcontextprotocol/tasks"
TASKED_TOOLS = frozenset({"ask_team"})
POLL_MS = 2000  # a job moves in seconds; polling faster only costs the client
DAY_MS = 86_400_000


class _Task(BaseModel):
    """The task fields every SEP-2663 task result carries (camelCase on the wire)."""

    model_config = ConfigDict(populate_by_name=True)

    task_id: str = Field(serialization_alias="taskId")
    status: Literal["working", "input_required", "completed", "failed", "cancelled"]
    created_at: str = Field(serialization_alias="createdAt")
    last_updated_at: str = Field(serialization_alias="lastUpdatedAt")
    ttl_ms: int | None = Field(serialization_alias="ttlMs")
    status_message: str | None = Field(default=None, serialization_alias="statusMessage")
    poll_interval_ms: int | None = Field(default=POLL_MS, serialization_alias="pollIntervalMs")


class CreateTaskResult(_Task):
    """The handle an opted-in `tools/call` returns at once (a claimed result: `resultType: task`)."""

    result_type: Literal["task"] = Field(default="task", serialization_alias="resultType")


class GetTaskResult(_Task):
    """`tasks/get`: the task, with the tool's result inlined once it is completed."""

    result_type: Literal["complete"] = Field(default="complete", serialization_alias="resultType")
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class TaskParams(RequestParams):
    model_config = ConfigDict(populate_by_name=True)

    task_id: str = Field(alias="taskId")


class UpdateTaskParams(TaskParams):
    input_responses: dict[str, Any] = Field(default_factory=dict, alias="inputResponses")


class Acknowledged(Result):
    result_type: Literal["complete"] = Field(default="complete", serialization_alias="resultType")


class JobTasks(ServerExtension):
    """The tasks extension, with the job store behind every task (see the module docstring)."""

    identifier = TASKS

    def __init__(self, service: JobService) -> None:
        self._service = service

    def clone(self) -> JobTasks:
        return JobTasks(self._service)  # the service is shared, never copied

    def methods(self) -> Sequence[MethodBinding]:
        versions = frozenset(MODERN_PROTOCOL_VERSIONS)
        return [
            MethodBinding("tasks/get", TaskParams, self._get, versions),
            MethodBinding("tasks/update", UpdateTaskParams, self._update, versions),
            MethodBinding("tasks/cancel", TaskParams, self._cancel, versions),
        ]

    async def intercept_tool_call(
        self, params: CallToolRequestParams, context: Context, call_next: ToolCallContinuation
    ) -> ToolCallOutcome:
        """An opted-in ask_team starts its job without waiting and answers with the task at once."""
        rc = context.request_context
        modern = rc is not None and rc.protocol_version in MODERN_PROTOCOL_VERSIONS
        if params.name not in TASKED_TOOLS or not modern or context.client_extension_settings(TASKS) is None:
            return await call_next()
        if params.arguments is not None:
            params.arguments["wait_seconds"] = 0  # the caller follows the task; the tool must not wait
        outcome = await call_next()  # the tool's own checks (errors come back as they always do)
        if not isinstance(outcome, ToolResult) or outcome.is_error or not outcome.structured_content:
            return outcome
        view = await self._service.lookup.view(str(outcome.structured_content["job_id"]), _caller())
        return CreateTaskResult(**(await self._task(view, "working")).model_dump())

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> GetTaskResult:
        view = await self._job(ctx, params.task_id)
        if not view.done:
            return GetTaskResult(**(await self._task(view, "working")).model_dump())
        if view.state == "cancelled":
            return GetTaskResult(**(await self._task(view, "cancelled")).model_dump())
        return GetTaskResult(**(await self._task(view, "completed")).model_dump(), result=_call_result(view))

    async def _update(self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams) -> Acknowledged:
        await self._job(ctx, params.task_id)  # a job never asks for input: nothing to deliver
        return Acknowledged()

    async def _cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> Acknowledged:
        view = await self._job(ctx, params.task_id)
        if not view.done:
            await self._service.cancel(view.job_id, _caller())
        return Acknowledged()

    async def _job(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> JobView:
        """The job behind a task, after the extension's checks: the client declared it, the routing
        header (Mcp-Name, over HTTP) names the same task; an unknown id is the one "not found"."""
        if self.client_settings(ctx) is None:
            raise MCPError(
                MISSING_REQUIRED_CLIENT_CAPABILITY,
                f"this request needs the {TASKS} extension; the client did not declare it",
                {"requiredCapabilities": {"extensions": {TASKS: {}}}},
            )
        try:
            header = get_http_request().headers.get(MCP_NAME_HEADER)
        except RuntimeError:
            header = None  # not HTTP: no routing header
        if header is not None and decode_header_value(header) != task_id:
            raise MCPError(HEADER_MISMATCH, f"the {MCP_NAME_HEADER} header does not match taskId")
        try:
            return await self._service.lookup.view(task_id, _caller())  # another caller's job is "not found"
        except ConclaveError:
            raise MCPError(INVALID_PARAMS, f"Task {task_id} not found") from None

    async def _task(self, view: JobView, status: Literal["working", "completed", "cancelled"]) -> _Task:
        row = await self._service.store.job(view.job_id)
        assert row is not None
        updated = row.finished_at or row.heartbeat
        return _Task(
            task_id=view.job_id,
            status=status,
            created_at=_iso(row.created_at),
            last_updated_at=_iso(max(updated, row.created_at)),
            status_message=view.phase,
            ttl_ms=int(self._service.settings.gc_keep_days * DAY_MS),
        )


def _caller() -> str:
    """The caller of this request: an HTTP token's name, else the local user (as tools/_deps.py reads it)."""
    from fastmcp.server.dependencies import get_access_token

    token = get_access_token()
    return token.client_id if token is not None and token.client_id else LOCAL


def _call_result(view: JobView) -> dict[str, Any]:
    """ask_team's result for the finished job, as a CallToolResult: what get_status returns for it."""
    made = tool_result(view).to_mcp_result()
    if isinstance(made, CallToolResult):
        call = made
    elif isinstance(made, tuple):  # (content, structured content)
        call = CallToolResult(content=made[0], structured_content=made[1])
    else:
        call = CallToolResult(content=made)
    return call.model_dump(by_alias=True, mode="json", exclude_none=True)


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat()
