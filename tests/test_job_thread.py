"""The jobs run on an event loop of their own (jobs/run/job_thread.py): an MCP call is served while the jobs'
loop is busy, and what crosses between the loops (a job started, a call, its error) arrives."""

from __future__ import annotations

import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from fastmcp import Client

from conclave.app.server import create_app
from conclave.backends.base import Backend, Request, StreamEvent
from conclave.coordination.agents import ApiAgent
from conclave.coordination.members import endpoint_factory
from conclave.jobs.environment import JobEnvironment
from conclave.jobs.request import JobRequest
from conclave.jobs.run.job_thread import SWITCH_S, JobThread
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.agents import given_agents
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, install, voter, write_team
from tests.fakes.waits import until_done

pytestmark = pytest.mark.anyio
ENV = {KEY_ENV: "test-key-0123456789"}
HOLD_S = 10  # the longest the jobs' loop is held: past it the test fails (the call waited for it)


class Stalling:
    """A real backend whose first call holds the thread of the event loop that makes it (as a burst of
    SDK work does) until `release` is set, or HOLD_S pass (then `held_out` is set)."""

    def __init__(self, backend: Backend, stalled: threading.Event, release: threading.Event) -> None:
        self.provider = backend.provider
        self._backend, self._stalled, self._release = backend, stalled, release
        self.held_out = threading.Event()

    def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        if not self._stalled.is_set():
            self._stalled.set()
            if not self._release.wait(HOLD_S):  # blocking, on purpose: the loop that runs the job stops
                self.held_out.set()
        return self._backend.stream(request)

    async def aclose(self) -> None:
        await self._backend.aclose()


async def test_get_status_answers_while_the_jobs_loop_is_held(tmp_path: Path, fakes: FakeProviders) -> None:
    install(fakes.script, TRIO, voter())
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    settings = Settings(home=tmp_path / "state")
    stalled, release = threading.Event(), threading.Event()
    real = endpoint_factory(ENV)
    made: list[Stalling] = []

    def factory(spec):  # type: ignore[no-untyped-def]
        agent = real(spec)
        assert isinstance(agent, ApiAgent)
        made.append(Stalling(agent.backend, stalled, release))
        return ApiAgent(made[-1])

    async with (
        JobService.serve(given_agents(JobEnvironment.of(settings, ENV), factory)) as service,
        Client(create_app(service, settings)) as client,
    ):
        job = await service.submit(JobRequest(task="What is 6 times 7?", team=team))
        try:
            with anyio.fail_after(HOLD_S):
                await anyio.to_thread.run_sync(stalled.wait)
            # the jobs' loop is held now; on one loop with the jobs, nothing below would run until HOLD_S
            status = await client.call_tool("get_status", {"job_id": job.job_id})
            view = await service.lookup.view(job.job_id)
        finally:
            release.set()
        assert not any(backend.held_out.is_set() for backend in made), "get_status waited for the jobs"
        assert status.structured_content is not None and status.structured_content["state"] == "running"
        assert view.state == "running"
        done = await until_done(service, view)
        assert done.state == "completed" and done.result.consensus


async def test_calls_run_in_order_on_the_jobs_loop_and_errors_come_back() -> None:
    loops: list[int] = []

    @asynccontextmanager
    async def side() -> AsyncIterator[str]:
        yield "the jobs' side"

    async def where(tag: int) -> int:
        loops.append(threading.get_ident())
        return tag

    async def fails() -> None:
        raise ValueError("from the jobs' loop")

    before = sys.getswitchinterval()
    async with JobThread.open(side) as (thread, value):
        assert value == "the jobs' side"
        assert sys.getswitchinterval() == min(before, SWITCH_S)  # the loops take turns in 1 ms slices
        thread.start(where, 0)
        assert [await thread.call(where, n) for n in (1, 2)] == [1, 2]
        with pytest.raises(ValueError, match="from the jobs' loop"):
            await thread.call(fails)
    assert len(loops) == 3 and set(loops) != {threading.get_ident()} and len(set(loops)) == 1
    assert sys.getswitchinterval() == before
