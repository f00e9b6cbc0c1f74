"""Waiting for a job in a test, always with a time limit: a hung job fails its test, it never hangs CI."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import anyio
from fastmcp import Client

from conclave.coordination.reports import AgentProgress
from conclave.jobs.read.views import JobView
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from tests.fakes.calc_task import TASK

JOB_LIMIT_S = 120.0
CLI_JOB_LIMIT_S = 800.0  # a job of CLI members: their containers, and real CLIs started for every run


async def until_done(service: JobService, view: JobView, limit_s: float = JOB_LIMIT_S) -> JobView:
    """Long-poll the job until it is done; TimeoutError after `limit_s`."""
    with anyio.fail_after(limit_s):
        while not view.done:
            view = await service.wait(view.job_id, 10)
    return view


async def until_cli_done(service: JobService, view: JobView) -> JobView:
    """`until_done` for a job of CLI members (tests/clis/)."""
    return await until_done(service, view, CLI_JOB_LIMIT_S)


# a gate a scripted model's reply waits on, and when the job's picture opens it
Gates = Mapping[threading.Event, Callable[[AgentProgress], bool]]


async def until_cli_done_opening(
    service: JobService, view: JobView, gates: Gates, limit_s: float = 400.0
) -> JobView:
    """`until_cli_done`, opening each gate as soon as an agent of the job is as it says (e.g. has
    answered, has voted): a test orders when replies land without sleeping. Every gate opens when the
    wait ends, however it ends: a reply still held would hold the job."""
    try:
        with anyio.fail_after(limit_s):
            while not all(gate.is_set() for gate in gates) and not view.done:
                view = await service.wait(view.job_id, 10)
                for gate, opens in gates.items():
                    if any(opens(agent) for agent in view.agents):
                        gate.set()
        return await until_cli_done(service, view)
    finally:
        for gate in gates:
            gate.set()


async def cli_job(service: JobService, team: str | Path, project: Path, verify: str | None = None) -> JobView:
    """The calc task (tests/fakes/calc_task.py) for `team` on `project`, submitted and waited for as a
    job of CLI members."""
    request = JobRequest(task=TASK, team=str(team), context_paths=[{"path": str(project)}], verify=verify)
    return await until_cli_done(service, await service.submit(request))


async def until_state(service: JobService, job_id: str, state: str, limit_s: float = 30.0) -> JobView:
    """Until the job reaches `state` (e.g. running: it holds a slot); TimeoutError after `limit_s`."""
    with anyio.fail_after(limit_s):
        while (view := await service.lookup.view(job_id)).state != state:
            await anyio.sleep(0.02)  # a condition polled under a limit, not a guess at how long it takes
    return view


async def status_of(client: Client, job_id: str, wait: float = 0) -> JobView:
    """The job's view through an MCP client's `get_status`."""
    result = await client.call_tool("get_status", {"job_id": job_id, "wait_seconds": wait})
    return JobView.model_validate(result.structured_content)


async def done_through(client: Client, job_id: str, limit_s: float = 180.0) -> JobView:
    """The job's view once it is done, long-polling `get_status` through an MCP client."""
    with anyio.fail_after(limit_s):  # a hang guard, not a speed
        while not (view := await status_of(client, job_id, wait=45)).done:
            pass
    return view


async def answered_through(client: Client, job_id: str, answers: int, limit_s: float = 60.0) -> JobView:
    """The job's view once its agents have posted `answers` answers in all, polling `get_status`."""
    with anyio.fail_after(limit_s):
        while (view := await status_of(client, job_id)).progress is None or sum(
            agent.answers for agent in view.progress.agents
        ) < answers:
            await anyio.sleep(0.05)  # a condition polled under a limit, not a guess at how long it takes
    return view
