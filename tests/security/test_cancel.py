"""Cancelling a job whose agent is inside a tool call that blocks: cancel_job ends the job within seconds
(worker threads that may block are abandoned, never waited for)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from conclave.files.agent_tools import AgentTools
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, is_presentation, write_team
from tests.security.conftest import SPEC, within

pytestmark = pytest.mark.anyio
SOLO = (("openai", "ann"),)


def test_a_cancelled_call_does_not_wait_for_a_blocked_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stalled, entered = threading.Event(), threading.Event()

    def stuck(self: AgentTools, args: Any) -> str:  # a file call stuck in the kernel (a hung mount, say)
        entered.set()
        stalled.wait(60)
        return "too late"

    monkeypatch.setattr(AgentTools, "_write_file", stuck)
    tools = AgentTools(tmp_path, peers=dict)

    async def cancel_it() -> bool:
        with anyio.move_on_after(0.5) as scope:
            await tools.handlers()["write_file"]({"path": "a.txt", "content": "x"})
        return scope.cancelled_caught

    try:
        assert within(10, cancel_it) is True
        assert entered.is_set()
    finally:
        stalled.set()


async def test_cancel_job_ends_a_job_blocked_in_a_tool_within_seconds(
    docker_image: str, tmp_path: Path, fakes: FakeProviders
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "a.txt").write_text("a\n")

    def agent(request: RecordedRequest) -> Reply:
        if is_presentation(request):
            return Reply(text="final")
        text = request.text()
        if "--- stdout ---" not in text and "exit code" not in text:
            return Reply(tool_calls=[("run_command", {"command": "mkfifo pipe && echo made"})])
        return (
            Reply(tool_calls=[("write_file", {"path": "pipe", "content": "x"})], delay=0.0)
            if "wrote" not in text
            else Reply(text="", delay=60)
        )

    fakes.script.set_default("ann", agent)
    sandbox = {"memory": SPEC.memory, "pids": SPEC.pids}
    team = str(write_team(tmp_path / "team.yaml", fakes, SOLO, sandbox=sandbox))
    home = tmp_path / "state"
    async with JobService.serve(environment_of(Settings(home=home), {KEY_ENV: "k-0123456789"})) as service:
        try:
            view = await service.submit(
                JobRequest(task="Write to the pipe", team=team, context_paths=[{"path": str(project)}])
            )
            with anyio.fail_after(60):
                while len(fakes.script.requests_of("ann")) < 2:  # the FIFO is made, write_file is asked for
                    await anyio.sleep(0.1)
            # sleep-ok: lets write_file block on the FIFO; the cancel must end the job at any moment
            await anyio.sleep(1.0)
            view = await service.cancel(view.job_id)
            assert view.state == "cancelled", view.text()
        finally:
            for fifo in home.glob("jobs/*/agents/*/proj/pipe"):  # release a writer left blocked in open()
                if not fifo.is_file():
                    os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
