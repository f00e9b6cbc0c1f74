"""Each CLI's run cut short, in its container, through its egress proxy, against the fakes: Codex
(OpenAI Responses), Gemini CLI (the Gemini API) and Copilot CLI (its own-key provider, Anthropic-style),
as test_cli_killed_runs.py does for Claude Code.

- A cancelled job, while the CLI waits on its model with a `setsid` child of its own running, leaves
  no CLI process and no container, and the run is charged what its provider billed (each member logs
  in with a key: its egress proxy counts every response, sandbox/egress.py).
- A budget reached mid-run, from what the proxy has counted so far (each response's usage as the
  provider billed it), stops the job and kills the run; each member's charge is exactly its fake's bill.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import anyio
import docker
import pytest

from conclave.jobs.read.views import JobView
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.clis.test_cli_members_e2e import (
    ENV,
    FAST,
    KEY,
    _host_processes,
)
from tests.fakes.calc_task import TASK
from tests.fakes.cli_worker import CliWorker
from tests.fakes.container_processes import container_processes
from tests.fakes.environment import environment_of
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders

pytestmark = pytest.mark.anyio
WIRES = {"codex": "responses", "gemini": "gemini", "copilot": "anthropic", "claude-code": "anthropic"}
HEADLESS = {"codex": "codex exec", "gemini": "gemini -p", "copilot": "copilot -p", "claude": "claude -p"}


def _team(path: Path, fakes: FakeProviders, cli: str, extra: str = "") -> str:
    path.write_text(
        f"agents:\n  - model: cli/{cli}:fake-model\n    base_url: {fakes.base_url(WIRES[cli], cli)}\n"
        f"    api_key_env: {KEY}\ncoordination: {{final: reuse{extra}}}\nsandbox: {{memory: 2g}}\n"
    )
    return str(path)


def _waiting(worker: CliWorker, waits: list[int]) -> object:
    """The CLI's model: its shell command first, then every later call hangs (the CLI waits on it)."""

    def respond(request: RecordedRequest) -> Reply:
        reply = worker(request)
        if worker.tool_results:
            waits.append(1)
            return Reply(text="late", delay=300)
        return reply

    return respond


async def _ended(service: JobService, view: JobView) -> JobView:
    with anyio.fail_after(120):  # far under the fake's 300 s hang: the run was killed, not finished
        while not view.done:
            view = await service.wait(view.job_id, 5)
    return view


def _left(job_id: str, cli: str, marker: str) -> tuple[list[object], list[str]]:
    containers = docker.from_env().containers.list(
        all=True, ignore_removed=True, filters={"label": f"conclave.job={job_id}"}
    )
    running = [
        line for line in _host_processes() if marker in line or (HEADLESS[cli] in line and "Fix" in line)
    ]
    return containers, running


@pytest.mark.parametrize("cli", ["codex", "gemini", "copilot"])
async def test_a_cancelled_job_kills_the_cli_and_charges_its_run(
    clis_image: str, tmp_path: Path, fakes: FakeProviders, project: Path, cli: str
) -> None:
    marker = f"conclave-cancel-{cli}"
    worker = CliWorker(WIRES[cli], f"setsid sh -c 'sleep 600; echo {marker}' >/dev/null 2>&1 & echo ok", "x")
    waits: list[int] = []
    fakes.script.set_default(cli, _waiting(worker, waits))
    team = _team(tmp_path / "team.yaml", fakes, cli)
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        view = await service.submit(JobRequest(task=TASK, team=team, context_paths=[{"path": str(project)}]))
        with anyio.fail_after(400):
            while not waits:
                await anyio.sleep(0.5)
        running = docker.from_env().containers.list(
            ignore_removed=True, filters={"label": f"conclave.job={view.job_id}"}
        )
        # the CLI runs (its `setsid` child too, unless the CLI's shell tool ended it with the command)
        assert running and HEADLESS[cli] in container_processes(running[0])
        view = await _ended(service, await service.cancel(view.job_id))
    assert view.state == "cancelled"
    assert _left(view.job_id, cli, marker) == ([], [])
    usage = view.agents[0].usage
    # charged what its proxy counted of the responses it carried: at most the bill (a request the fake
    # held when the job was cancelled is billed by neither)
    assert 0 < usage.input_tokens <= fakes.script.bill[cli][0], (usage, fakes.script.bill[cli])


@pytest.mark.parametrize("cli", ["codex", "gemini", "copilot", "claude-code"])
async def test_a_budget_reached_mid_run_stops_the_job_and_kills_the_run(
    clis_image: str, tmp_path: Path, fakes: FakeProviders, project: Path, cli: str
) -> None:
    """A long task (its prompt alone is ~6k tokens of estimate) and max_tokens 4000: the run is charged
    while the CLI waits on its model, the budget stops the job, and the run is killed (the fake would
    hang 300 s). Claude Code's first response starts (its input billed), then stalls."""
    task = TASK + "\n\nNotes:\n" + "Keep the change small and run the tests. " * 600
    marker = f"conclave-budget-{cli}"
    if cli == "claude-code":  # its side calls (not streamed) answer at once
        fakes.script.set_default(cli, Reply(text="late", stall=300))
    else:
        worker = CliWorker(WIRES[cli], f"setsid sh -c 'sleep 600; echo {marker}' >/dev/null 2>&1 &", "x")
        fakes.script.set_default(cli, _waiting(worker, []))
    team = _team(tmp_path / "team.yaml", fakes, cli, ", max_tokens: 4000")
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        view = await service.submit(JobRequest(task=task, team=team, context_paths=[{"path": str(project)}]))
        with anyio.fail_after(400):
            view = await _ended(service, view)
    assert view.result and (view.result.reason or "").startswith("budget reached: "), view.text()
    assert _left(view.job_id, "claude" if cli == "claude-code" else cli, marker) == ([], [])
    usage = view.agents[0].usage
    assert usage.input_tokens + usage.output_tokens >= 4000
    billed = fakes.script.bill.get(cli, (0, 0, 0))
    # what its proxy counted of the responses it carried, each CLI alike: exactly the bill, which holds
    # the prompt (the task at four characters a token) and the CLI's own system prompt and tools
    assert (usage.input_tokens, usage.output_tokens) == billed[:2], (usage, billed)
    assert usage.input_tokens > len(task) // 4, (usage, len(task))


async def test_a_run_that_never_reached_its_provider_is_charged_nothing(
    clis_image: str, tmp_path: Path, fakes: FakeProviders, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing listens at Codex's base_url, so its proxy answers every attempt 502 and no provider ever
    sees a request; the job is cancelled while Codex retries (or after it gave up). Its stream had
    started (thread.started, turn.started), which once earned the run an estimate of four characters a
    token: e2e's Codex decision run killed as stale before its request left was charged 173 tokens the
    fake never billed. A run whose proxy admitted no connection is charged nothing (clis/member.py)."""
    caplog.set_level(logging.INFO, logger="conclave.sandbox.egress")
    listener = socket.create_server(("127.0.0.1", 0))  # for the submit's reachability probe only
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    team = tmp_path / "team.yaml"
    team.write_text(
        f"agents:\n  - model: cli/codex:fake-model\n    base_url: {url}\n    api_key_env: {KEY}\n"
        "coordination: {final: reuse}\nsandbox: {memory: 2g}\n"
    )
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        with listener:
            view = await service.submit(
                JobRequest(task=TASK, team=str(team), context_paths=[{"path": str(project)}])
            )
        with anyio.fail_after(120):  # Codex's request reached its proxy, which found nothing there
            while not any("unreachable" in record.getMessage() for record in caplog.records):
                await anyio.sleep(0.05)  # a condition polled under a limit, not a guess at how long
        if not (await service.lookup.view(view.job_id)).done:
            view = await service.cancel(view.job_id)
        view = await _ended(service, view)
    assert _left(view.job_id, "codex", "never-a-marker") == ([], [])
    usage = view.agents[0].usage
    assert usage.calls >= 1 and (usage.input_tokens, usage.output_tokens) == (0, 0), usage
