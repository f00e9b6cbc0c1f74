"""A job with a coding-agent CLI member survives its server's `kill -9`: the real Claude Code, in its
container behind its egress proxy, is killed with the server mid-run (its edit made, its answer not
posted); the next server resumes the job from its folder, starts the member a new container and proxy,
and the member's turn runs again as a fresh CLI run on the files it started with, shown the current
answers (jobs/upkeep/takeover.py). Usage: what the CLI had reported before the kill is kept, every call after
it is counted once. Real `conclave serve --http` processes, real Docker, the CLI image, fake models.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import Client

from conclave.jobs.read.views import JobView
from conclave.jobs.store.sql import Store
from conclave.settings import Settings
from tests.clis.test_cli_members_e2e import KEY, api_agent
from tests.fakes.calc_task import CALC, TASK
from tests.fakes.cli_worker import WORK_MARK, CliWorker, _first_user_text, _tool_results
from tests.fakes.processes import HTTP_TOKEN, http_process
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.waits import status_of

pytestmark = pytest.mark.anyio
HELD_S = 600.0  # the CLI's answer before the kill: never sent (the fakes stop first), so never billed
FIX = "sed -i 's/return a - b/return a + b/' calc.py"
ANSWER = "Fixed add() in calc.py: it subtracted."


def held_claude(worker: CliWorker, released: threading.Event) -> Any:
    """`worker`, its work run's answer held while `released` is not set: the server dies mid-run."""

    def respond(request: RecordedRequest) -> Reply:
        reply = worker(request)
        if reply.text == ANSWER and not released.is_set():
            reply.delay = HELD_S
        return reply

    return respond


def team_file(path: Path, fakes: FakeProviders) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"""\
name: cli-pair
agents:
  - model: cli/claude-code
    base_url: {fakes.base_url("anthropic", "claude")}
    api_key_env: {KEY}
  - model: openai/gpt-fake
    base_url: {fakes.base_url("openai", "api")}
    api_key_env: {KEY}
coordination: {{max_answers_per_agent: 1, final: reuse, timeout_s: 900}}
sandbox: {{memory: 2g, cpus: 1}}
""")


def _edited(requests: list[RecordedRequest]) -> bool:
    """Whether Claude Code sent back its shell command's result (the edit is made)."""
    return any(
        r.agent == "claude"
        and WORK_MARK in _first_user_text(r.body, "anthropic")
        and _tool_results(r.body, "anthropic")
        for r in list(requests)
    )


def _usage(home: Path, job_id: str, letter: str) -> tuple[int, int]:
    store = Store.of(Settings(home=home))
    try:
        row = store.job(job_id)
        assert row is not None and row.progress is not None
        usage = next(agent.usage for agent in row.progress.agents if agent.letter == letter)
        return usage.input_tokens, usage.output_tokens
    finally:
        store.close()


async def test_kill_9_while_a_cli_member_runs_then_a_restart_resumes_it_in_a_new_container(
    clis_image: str, tmp_path: Path, project: Path
) -> None:
    home, config = tmp_path / "home", tmp_path / "config"
    released = threading.Event()
    claude = CliWorker("anthropic", FIX, ANSWER)
    ask = {"task": TASK, "team": "cli-pair", "context_paths": [{"path": str(project)}], "wait_seconds": 0}
    ask["verify"] = "pytest -q"
    with FakeProviders() as fakes:
        fakes.script.set_default("claude", held_claude(claude, released)).set_default("api", api_agent)
        team_file(config / "conclave" / "teams" / "cli-pair.yaml", fakes)
        env = {"CONCLAVE_HOME": str(home), "XDG_CONFIG_HOME": str(config), KEY: "fake-key-0123456789"}
        env["CONCLAVE_CHECK_POOL"] = "0"
        with http_process(tmp_path, env) as (base, process):
            async with Client(f"{base}/mcp", auth=HTTP_TOKEN) as client:
                asked = (await client.call_tool("ask_team", ask)).structured_content
                job_id = JobView.model_validate(asked).job_id
                with anyio.fail_after(240):
                    while (
                        (view := await status_of(client, job_id)).progress is None
                        or not all(a.answers for a in view.agents if not a.model.startswith("cli/"))
                        or not _edited(fakes.script.requests)
                    ):
                        await anyio.sleep(0.1)  # sleep-ok: polls until the API agent answered, Claude edited
                await anyio.sleep(1.0)  # sleep-ok: the store's writer commits what was reported
            process.send_signal(signal.SIGKILL)  # Claude Code's run in flight: calc.py edited, no answer
            process.wait()
            letter = next(a.letter for a in view.agents if a.model == "cli/claude-code")
            usage_before, billed_before = (
                _usage(home, job_id, letter),
                fakes.script.bill.get("claude", (0, 0, 0)),
            )
            released.set()
            with http_process(tmp_path, env) as (base, process):
                async with Client(f"{base}/mcp", auth=HTTP_TOKEN) as client:
                    with anyio.fail_after(400):  # a hang guard, not a speed
                        while not (view := await status_of(client, job_id, wait=45)).done:
                            pass
                    read = {"job_id": job_id, "path": "@diff", "limit": 100_000}
                    patch = (await client.call_tool("read_workspace", read)).structured_content
                process.terminate()
                assert process.wait(timeout=60) == 0
            billed_after = fakes.script.bill["claude"]
    assert view.state == "completed" and view.result is not None, view.text()
    # the member's turn ran again, in a fresh run on the files it started with: its edit applies again
    assert view.result.winner == f"{letter}1" and view.answer == ANSWER, view.text()
    assert patch is not None and "-    return a - b\n+    return a + b\n" in patch["content"]
    assert project.joinpath("calc.py").read_text() == CALC
    store = Store.of(Settings(home=home))
    try:
        resumes = store.events(job_id, "resumed")
    finally:
        store.close()
    assert len(resumes) == 1 and letter in resumes[0].turns
    # usage: what Claude Code reported before the kill is kept (never more than was billed; the killed
    # run's unreported part is lost with its server), and every call after it counted once
    usage_after = _usage(home, job_id, letter)
    assert usage_before[0] <= billed_before[0] and usage_before[1] <= billed_before[1]
    assert usage_after[0] - usage_before[0] == billed_after[0] - billed_before[0] > 0
    assert usage_after[1] - usage_before[1] == billed_after[1] - billed_before[1] > 0
