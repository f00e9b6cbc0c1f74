"""The multi-host lane, on one machine: a real redis-server (the queue, tests/redis.py), a real
PostgreSQL (the store, tests/postgres.py), one jobs' folder they all mount, two `conclave serve --http`
fronts and three `conclave worker` processes, each with a state folder of its own as a host would have;
the real SDKs against scripted fakes (tests/fakes/), real MCP clients, and the real Docker engine for
a job with files.

- a worker killed with `kill -9` mid-job: another takes the job over (its lease: jobs/upkeep/takeover.py) and
  completes it, every answer kept, each provider call counted once, the result of an uninterrupted run;
- one caller's 30 queued jobs neither refuse another caller's job nor hold it back past one job's end,
  and jobs asked at either front run, spread over the workers;
- a job with files, a check and `apply` asked at one front: its worker killed with a turn in flight,
  another worker rebuilds its workspaces from the shared jobs' folder (files/workspaces.py `restore`)
  and completes it with the checks, diff and applied files of an uninterrupted run.
"""

from __future__ import annotations

import json
import signal
import threading
from contextlib import ExitStack
from pathlib import Path

import anyio
import pytest
from fastmcp import Client
from pydantic import SecretStr

from conclave.jobs.read.views import JobView
from conclave.jobs.store.sql import AnswerRow, JobRow, Store
from conclave.settings import Settings
from tests.fakes.calc_task import CALC, agent, calc_project
from tests.fakes.processes import http_process, worker_process
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, install, voter, write_team
from tests.fakes.waits import answered_through, done_through, status_of
from tests.postgres import Cluster
from tests.redis import Redis
from tests.test_resume_files import DOCKER, _patch_body, held_bob, until_bob_edited
from tests.test_resume_files import _ask as _ask_files

pytestmark = pytest.mark.anyio
ALICE, BOB = "alice-token-0123456789abcdef", "bob-token-0123456789abcdef"
ASK = {"task": "What is 6 * 7?", "team": "fake-trio", "wait_seconds": 0}
WORKERS = 3
# jobs that started this close to bob's ask or start were taken as he asked, or took slots freed with
# his (the jobs of one worker end together); a job here lasts about 2 s
TOGETHER_S = 0.5


def _shared(url: SecretStr, redis: Redis, jobs: Path, config: Path) -> dict[str, str]:
    """What every front and worker of the deployment is given: one store, one queue, one jobs' folder."""
    return {
        "CONCLAVE_DATABASE_URL": url.get_secret_value(),
        "CONCLAVE_QUEUE_URL": redis.url().get_secret_value(),
        "CONCLAVE_JOBS_DIR": str(jobs),
        "XDG_CONFIG_HOME": str(config),
        KEY_ENV: "test-key",
        "CONCLAVE_CHECK_POOL": "0",
        "CONCLAVE_HEARTBEAT_S": "1",
        "FASTMCP_LOG_LEVEL": "WARNING",
    }


class Deployment:
    """What the test reads of the shared store, as any host would."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def row(self, job_id: str) -> JobRow:
        store = Store.of(self.settings)
        try:
            row = store.job(job_id)
            assert row is not None
            return row
        finally:
            store.close()

    def answers_and_calls(self, job_id: str) -> tuple[list[AnswerRow], int]:
        row = self.row(job_id)
        store = Store.of(self.settings)
        try:
            calls = sum(agent.usage.calls for agent in row.progress.agents) if row.progress else 0
            return store.answers(job_id), calls
        finally:
            store.close()


async def _ask(client: Client) -> JobView:
    return JobView.model_validate((await client.call_tool("ask_team", ASK)).structured_content)


async def test_two_fronts_three_workers_a_worker_killed_mid_job_and_fair_shares(
    tmp_path: Path, postgres_cluster: Cluster, redis: Redis
) -> None:
    config, jobs = tmp_path / "config", tmp_path / "jobs"
    with ExitStack() as stack, FakeProviders() as fakes:
        url = stack.enter_context(postgres_cluster.schema())
        install(fakes.script, TRIO, voter(delay=1.0))
        write_team(config / "conclave" / "teams" / "fake-trio.yaml", fakes, TRIO, name="fake-trio")
        shared = _shared(url, redis, jobs, config)
        fronts = []
        for name in ("front-1", "front-2"):
            home = tmp_path / name / "home"
            home.mkdir(parents=True, mode=0o700)
            tokens = home / "http-tokens.json"
            tokens.write_text(json.dumps({"alice": ALICE, "bob": BOB}))
            tokens.chmod(0o600)
            env = {**shared, "CONCLAVE_HOME": str(home), "CONCLAVE_MAX_QUEUED": "30"}
            env["CONCLAVE_MAX_QUEUED_PER_CALLER"] = "30"
            base, _ = stack.enter_context(http_process(tmp_path / name, env, token=None))
            fronts.append(f"{base}/mcp")
        workers = {}
        for index in range(WORKERS):
            folder = tmp_path / f"worker-{index}"
            env = {**shared, "CONCLAVE_HOME": str(folder / "home"), "CONCLAVE_MAX_JOBS": "2"}
            process = stack.enter_context(worker_process(folder, env))
            workers[process.pid] = process
        deployment = Deployment(Settings(home=tmp_path / "reader", database_url=url, jobs_dir=jobs))

        # 1. a job asked at front 1; its worker killed mid-vote; read on at front 2
        async with Client(fronts[0], auth=ALICE) as one, Client(fronts[1], auth=ALICE) as two:
            asked = await _ask(one)
            await answered_through(two, asked.job_id, 3)
            owner = deployment.row(asked.job_id)
            killed = workers.pop(owner.owner_pid)
            killed.send_signal(signal.SIGKILL)  # mid-job: the agents are in their voting turns
            killed.wait()
            fakes.settle()  # what the killed process had sent is recorded before the count
            requests_before = len(fakes.script.requests)
            answers_before, calls_before = deployment.answers_and_calls(asked.job_id)
            resumed = await done_through(two, asked.job_id)
            requests_after = len(fakes.script.requests) - requests_before  # the resumed job's alone
            taken_by = deployment.row(asked.job_id).owner_pid
            # the same transcript, never interrupted
            whole = await done_through(one, (await _ask(one)).job_id)
        assert resumed.state == "completed", resumed.phase
        assert taken_by in workers  # one of the live workers finished it
        answers_after, calls_after = deployment.answers_and_calls(asked.job_id)
        assert len(answers_before) == 3
        assert answers_after[: len(answers_before)] == answers_before  # every answer kept as it was
        assert [a.label for a in answers_after] == [a.label for a in answers_before]  # none again
        # each call counted once: the calls charged before the kill, plus every request made after it
        assert calls_after == resumed.usage.calls == calls_before + requests_after
        same = {"winner", "consensus", "tally", "votes", "voters", "fallback", "failed"}
        assert resumed.result is not None and whole.result is not None
        assert resumed.result.model_dump(include=same) == whole.result.model_dump(include=same)

        # 2. alice's 30 queued jobs at front 1, bob's one at front 2 (shorter jobs: 4 slots, 31 jobs)
        install(fakes.script, TRIO, voter(delay=0.6))
        async with Client(fronts[0], auth=ALICE) as alice, Client(fronts[1], auth=BOB) as bob:
            mine = [await _ask(alice) for _ in range(30)]
            with anyio.fail_after(60):
                while (await status_of(alice, mine[0].job_id)).state == "queued":
                    await anyio.sleep(0.1)  # sleep-ok: until alice's first job runs
            bobs = await _ask(bob)  # admitted though alice's line is full
            assert bobs.state == "queued" and "waiting for a worker" in bobs.phase, bobs.phase
            bobs_done = await done_through(bob, bobs.job_id)
            views = [await done_through(alice, job.job_id) for job in mine]
        assert bobs_done.state == "completed" and all(view.state == "completed" for view in views)
        rows = {job.job_id: deployment.row(job.job_id) for job in [*mine, bobs]}
        bob_row = rows[bobs.job_id]
        assert bob_row.started_at is not None
        # the first slots freed after bob asked took bob's job: no alice job started between his ask and
        # his job's start, but those taken as he asked and those that took slots freed with his
        ahead = [
            r.id
            for r in rows.values()
            if r.started_at
            and bob_row.created_at + TOGETHER_S < r.started_at < bob_row.started_at - TOGETHER_S
        ]
        assert ahead == []
        # so bob waited at most for one running job's end, not for alice's line
        lengths = [r.finished_at - r.started_at for r in rows.values() if r.finished_at and r.started_at]
        assert bob_row.started_at - bob_row.created_at <= max(lengths)
        # spread over the workers left: each of them ran some
        assert {r.owner_pid for r in rows.values()} == set(workers)


def _front_env(home: Path, shared: dict[str, str]) -> dict[str, str]:
    home.mkdir(parents=True, mode=0o700)
    tokens = home / "http-tokens.json"
    tokens.write_text(json.dumps({"alice": ALICE}))
    tokens.chmod(0o600)
    return {**shared, "CONCLAVE_HOME": str(home)}


async def _patch(client: Client, job_id: str) -> str:
    read = await client.call_tool("read_workspace", {"job_id": job_id, "path": "@diff", "limit": 100_000})
    assert read.structured_content is not None
    return str(read.structured_content["content"])


@pytest.mark.usefixtures("docker_image")
async def test_a_job_with_files_survives_its_worker(
    tmp_path: Path, postgres_cluster: Cluster, redis: Redis
) -> None:
    config, jobs = tmp_path / "config", tmp_path / "jobs"
    project = calc_project(tmp_path)
    (tmp_path / "again").mkdir()
    again = calc_project(tmp_path / "again")  # the same project, for the uninterrupted run
    released = threading.Event()
    with ExitStack() as stack, FakeProviders() as fakes:
        url = stack.enter_context(postgres_cluster.schema())
        fakes.script.set_default("ann", agent("ann"))
        fakes.script.set_default("bob", held_bob(released))
        fakes.script.set_default("cy", agent("ann"))
        teams = config / "conclave" / "teams"
        write_team(teams / "fake-files.yaml", fakes, TRIO, name="fake-files", sandbox=DOCKER)
        shared = _shared(url, redis, jobs, config) | {"CONCLAVE_ALLOWED_ROOTS": str(tmp_path)}
        base, _ = stack.enter_context(
            http_process(tmp_path / "front", _front_env(tmp_path / "front" / "home", shared), token=None)
        )
        workers = {}
        for index in range(2):
            folder = tmp_path / f"worker-{index}"
            env = {**shared, "CONCLAVE_HOME": str(folder / "home"), "CONCLAVE_MAX_JOBS": "1"}
            process = stack.enter_context(worker_process(folder, env))
            workers[process.pid] = process
        deployment = Deployment(Settings(home=tmp_path / "reader", database_url=url, jobs_dir=jobs))
        async with Client(f"{base}/mcp", auth=ALICE) as client:
            asked = await client.call_tool("ask_team", _ask_files(project))
            job_id = JobView.model_validate(asked.structured_content).job_id
            await until_bob_edited(client, job_id, fakes)
            killed = workers.pop(deployment.row(job_id).owner_pid)
            killed.send_signal(signal.SIGKILL)  # bob's turn in flight: calc.py edited, no answer yet
            killed.wait()
            released.set()
            fakes.settle()  # what the killed process had sent is recorded before the count
            requests_before = len(fakes.script.requests)
            answers_before, calls_before = deployment.answers_and_calls(job_id)
            assert project.joinpath("calc.py").read_text() == CALC  # nothing applied before the kill
            resumed = await done_through(client, job_id)
            requests_after = len(fakes.script.requests) - requests_before  # the resumed job's alone
            patch = await _patch(client, job_id)
            whole_id = JobView.model_validate(
                (await client.call_tool("ask_team", _ask_files(again))).structured_content
            ).job_id
            whole = await done_through(client, whole_id)
            whole_patch = await _patch(client, whole_id)
        taken_by = deployment.row(job_id).owner_pid
        answers_after, calls_after = deployment.answers_and_calls(job_id)
    assert resumed.state == "completed", resumed.phase
    assert taken_by in workers  # the live worker finished it
    assert answers_after[: len(answers_before)] == answers_before  # every answer kept as it was
    assert calls_after == resumed.usage.calls == calls_before + requests_after  # each call counted once
    for done in (resumed, whole):
        checks = {label: text.split(" ")[0] for label, text in done.checks().items()}
        assert sorted(checks.values()) == ["failed", "failed", "passed"], done.text()
    assert _patch_body(patch) == _patch_body(whole_patch)
    assert "-    return a - b\n+    return a + b\n" in patch
    assert project.joinpath("calc.py").read_bytes() == again.joinpath("calc.py").read_bytes()
    assert project.joinpath("calc.py").read_text() == CALC.replace("a - b", "a + b")
