"""The job queue on Redis (jobs/queue.py) and its workers (jobs/worker.py), in one process: a front
(`JobService` with CONCLAVE_QUEUE_URL) admits and queues, a worker runs; cancels, notes and reads go
through the store. A real redis-server on a unix socket (tests/redis.py), the real SDKs, scripted fakes.
The lane with real processes (fronts, workers) is the multi-host lane under tests/lanes/."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
import redis as redis_py
from pydantic import SecretStr

from conclave.cli.doctor import run_checks
from conclave.errors import InputError, QueueUnavailable
from conclave.jobs import queue as job_queue
from conclave.jobs.environment import JobEnvironment
from conclave.jobs.queue import JobQueue
from conclave.jobs.read.views import JobView
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.jobs.worker import drain_workers, queue_report, run_worker
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.processes import worker_process
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, install, voter, write_team
from tests.fakes.waits import until_done, until_state
from tests.redis import Redis, redis_server

pytestmark = pytest.mark.anyio
ENV = {KEY_ENV: "test-key-0123456789"}


@asynccontextmanager
async def worker(settings: Settings) -> AsyncIterator[None]:
    """A worker in this process for the body's life, drained after it."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_worker(JobEnvironment.of(settings, ENV)))
        with anyio.fail_after(30):
            async with JobQueue.open(settings.queue_url) as queue:  # type: ignore[arg-type]
                while not await queue.workers(settings.stale_after_s):
                    await anyio.sleep(0.05)  # sleep-ok: until the worker lists itself
        yield
        await drain_workers(settings, ["all"])


async def test_a_bad_or_unreachable_queue_url_names_the_setting_the_value_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(QueueUnavailable, match=r"CONCLAVE_QUEUE_URL=postgresql://u:\*\*\*@h/db: .*Redis URL"):
        async with JobQueue.open(SecretStr("postgresql://u:secret@h/db")):
            pass
    gone = f"unix://:password@{tmp_path}/no.sock"
    with pytest.raises(QueueUnavailable, match=r"CONCLAVE_QUEUE_URL=unix://.*could not be reached.*unset"):
        async with JobQueue.open(SecretStr(gone)):
            pass
    with pytest.raises(QueueUnavailable, match="CONCLAVE_QUEUE_URL=\\(unset\\): workers take their jobs"):
        await run_worker(JobEnvironment.of(Settings(home=tmp_path / "state"), os.environ))


async def test_a_front_queues_a_job_a_worker_runs_it_and_the_front_reads_it(
    tmp_path: Path, fakes: FakeProviders, redis: Redis
) -> None:
    install(fakes.script, TRIO, voter(delay=1.0))  # the note arrives before the votes
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    settings = Settings(home=tmp_path / "state", queue_url=redis.url(), heartbeat_s=0.2)
    async with JobService.serve(environment_of(settings, ENV)) as front:
        queued = await front.submit(JobRequest(task="What is 6 * 7?", team=team))
        cancelled = await front.submit(JobRequest(task="What is 6 * 7?", team=team))
        # no worker yet: both wait on the queue; one is cancelled there
        assert (await front.lookup.view(queued.job_id)).state == "queued"
        assert (await front.cancel(cancelled.job_id)).state == "cancelled"
        async with worker(settings):
            await until_state(front, queued.job_id, "running")
            steered = await front.steer(queued.job_id, "keep it short")
            done = await until_done(front, queued)
    assert done.state == "completed" and done.result is not None and done.result.consensus
    assert [n.seen for n in steered.notes] == [True]  # the note reached the worker through the store


async def test_a_message_a_dead_worker_took_goes_to_another_worker(
    tmp_path: Path, fakes: FakeProviders, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that took the job's message and died before it acknowledged it: after REDELIVERY (made
    short here) a live worker claims the message and starts the job."""
    monkeypatch.setattr(job_queue, "REDELIVERY", timedelta(seconds=1))
    install(fakes.script, TRIO, voter())
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    settings = Settings(home=tmp_path / "state", queue_url=redis.url(), heartbeat_s=0.2)
    async with JobService.serve(environment_of(settings, ENV)) as front:
        job = await front.submit(JobRequest(task="What is 6 * 7?", team=team))
        dead = redis_py.Redis.from_url(redis.url().get_secret_value())
        dead.xgroup_create(job_queue.STREAM, job_queue.GROUP, id="0", mkstream=True)
        [(_stream, [(_id, fields)])] = dead.xreadgroup(job_queue.GROUP, "dead", {job_queue.STREAM: ">"})
        dead.close()
        assert fields == {b"job": job.job_id.encode()}  # the dead worker holds the only message
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: run_worker(JobEnvironment.of(settings, ENV)))
            try:
                done = await until_done(front, job, 60)  # a hang guard: without redelivery it waits forever
            finally:
                with anyio.CancelScope(shield=True):
                    await drain_workers(settings, ["all"])
    assert done.state == "completed", done.phase


async def test_a_drained_worker_finishes_its_job_takes_no_new_one_and_leaves_the_list(
    tmp_path: Path, fakes: FakeProviders, redis: Redis
) -> None:
    install(fakes.script, TRIO, voter(delay=0.5))
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    settings = Settings(home=tmp_path / "state", queue_url=redis.url(), heartbeat_s=0.2, max_jobs=2)
    async with JobService.serve(environment_of(settings, ENV)) as front:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: run_worker(JobEnvironment.of(settings, ENV)))
            first = await front.submit(JobRequest(task="What is 6 * 7?", team=team))
            await until_state(front, first.job_id, "running")
            report = await queue_report(settings)
            [live] = report.workers
            assert live.running == 1 and live.info.max_jobs == 2 and not live.info.draining
            assert live.info.host == socket.gethostname() and live.info.pid == os.getpid()
            with pytest.raises(InputError, match=r"--drain.*give a live worker's id"):
                await drain_workers(settings, ["no-such-worker"])
            assert await drain_workers(settings, [live.info.id]) == [live.info.id]
            with anyio.fail_after(30):
                while not (await queue_report(settings)).workers[0].info.draining:
                    await anyio.sleep(0.05)  # sleep-ok: until the worker's next listing says it drains
            second = await front.submit(JobRequest(task="What is 6 * 7?", team=team))
            # the worker returns once its job is done: run_worker ends, the task group with it
        done = await front.lookup.view(first.job_id)
        assert done.state == "completed", done.phase
        left = await front.lookup.view(second.job_id)
        assert left.state == "queued" and "waiting for a worker" in left.phase, left.phase
        report = await queue_report(settings)
    assert report.workers == [] and report.waiting_jobs == 1


async def test_a_front_is_ready_only_while_its_queue_answers_and_queues_nothing_without_it(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    install(fakes.script, TRIO, voter())
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    with redis_server() as own:
        settings = Settings(home=tmp_path / "state", queue_url=own.url())
        async with JobService.serve(environment_of(settings, ENV)) as front:
            ready = await front.readiness()
            assert ready.ready and ready.queue == "ok", ready
            own.cli("SHUTDOWN", "NOSAVE")
            down = await front.readiness()
            with pytest.raises(QueueUnavailable, match=r"CONCLAVE_QUEUE_URL=unix://.*nothing was queued"):
                await front.submit(JobRequest(task="What is 6 * 7?", team=team))
            [row] = await front.store.recent_jobs()
    assert not down.ready and down.queue == "failed"
    assert any(
        "CONCLAVE_QUEUE_URL=unix://" in error and "could not be reached" in error for error in down.errors
    )
    assert row.state == "cancelled" and row.phase == "not queued: Redis did not take it"


async def test_a_long_poll_at_a_front_sees_a_job_end_between_its_first_reads(
    tmp_path: Path, fakes: FakeProviders, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's write landing just after the front's first read of the job (the bench saw get_status
    wait out its 45 s for a job that had ended): the long-poll still returns at that write."""
    install(fakes.script, TRIO, voter())
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    settings = Settings(home=tmp_path / "state", queue_url=redis.url())
    async with JobService.serve(environment_of(settings, ENV)) as front:
        job = await front.submit(JobRequest(task="What is 6 * 7?", team=team))
        read = front.lookup.view

        async def view_then_a_worker_ends_it(job_id: str, caller: str | None = None) -> JobView:
            seen = await read(job_id, caller)
            if not seen.done:  # as a worker would, in the store, right after this read
                await front.store.set_state(job_id, "failed", "failed: ended elsewhere", error="x")
            return seen

        monkeypatch.setattr(front.lookup, "view", view_then_a_worker_ends_it)
        with anyio.fail_after(20):  # a hang guard: without the fix it waits out the 45 s
            done = await front.wait(job.job_id, 45)
    assert done.state == "failed"


def test_doctor_shows_the_queue_and_each_live_worker(tmp_path: Path, redis: Redis) -> None:
    settings = Settings(home=tmp_path / "state", queue_url=redis.url())
    env = {"CONCLAVE_HOME": str(settings.home), "CONCLAVE_QUEUE_URL": redis.url().get_secret_value()}
    with worker_process(tmp_path / "worker", {**env, "CONCLAVE_MAX_JOBS": "3"}) as process:
        probes = {p.name: p for p in run_checks(settings, {})}
    queue = probes["job queue"]
    assert queue.ok and queue.detail.startswith(
        f"Redis at unix://:***@{redis.socket}: 0 jobs waiting for a worker"
    )
    assert queue.detail.endswith("1 live workers")
    [worker_line] = [p for name, p in probes.items() if name.startswith("worker ")]
    assert f"(pid {process.pid})" in worker_line.detail and "0 of 3 jobs running" in worker_line.detail
    none = {p.name: p for p in run_checks(Settings(home=tmp_path / "state"), {})}["job queue"]
    assert none.ok and "CONCLAVE_QUEUE_URL unset" in none.detail
    gone = Settings(home=tmp_path / "state", queue_url=SecretStr(f"unix://{tmp_path}/none.sock"))
    down = {p.name: p for p in run_checks(gone, {})}["job queue"]
    assert not down.ok and down.detail == f"CONCLAVE_QUEUE_URL=unix://{tmp_path}/none.sock"


async def test_sigterm_drains_a_worker_process_its_job_completes_and_it_exits_0(
    tmp_path: Path, fakes: FakeProviders, redis: Redis
) -> None:
    install(fakes.script, TRIO, voter(delay=1.0))
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    settings = Settings(home=tmp_path / "state", queue_url=redis.url())
    env = {"CONCLAVE_HOME": str(settings.home), "CONCLAVE_QUEUE_URL": redis.url().get_secret_value()}
    async with JobService.serve(environment_of(settings, ENV)) as front:
        with worker_process(tmp_path / "worker", {**env, **ENV, "CONCLAVE_CHECK_POOL": "0"}) as process:
            job = await front.submit(JobRequest(task="What is 6 * 7?", team=team))
            await until_state(front, job.job_id, "running")
            process.send_signal(signal.SIGTERM)
            with anyio.fail_after(120):  # a hang guard, not a speed
                code = await anyio.to_thread.run_sync(process.wait)
        done = await front.lookup.view(job.job_id)
    log = (tmp_path / "worker" / "worker.log").read_text()
    assert code == 0, log
    assert done.state == "completed", done.phase
    assert "draining (SIGTERM)" in log and "drained, exiting" in log


async def test_a_worker_process_loads_the_provider_sdks_before_it_takes_a_job(
    tmp_path: Path, fakes: FakeProviders, redis: Redis
) -> None:
    """Its first jobs import nothing of an SDK: they started at once on its every slot and each waited
    seconds for the imports on a busy machine (bench/bench_queue.py's three workers). Python's import
    log (PYTHONPROFILEIMPORTTIME, in the worker's log) says when each module was first imported."""
    install(fakes.script, TRIO, voter())
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    settings = Settings(home=tmp_path / "state", queue_url=redis.url())
    env = {"CONCLAVE_HOME": str(settings.home), "CONCLAVE_QUEUE_URL": redis.url().get_secret_value()}
    env |= {**ENV, "CONCLAVE_CHECK_POOL": "0", "PYTHONPROFILEIMPORTTIME": "1"}
    async with JobService.serve(environment_of(settings, ENV)) as front:
        with worker_process(tmp_path / "worker", env):
            job = await front.submit(JobRequest(task="What is 6 * 7?", team=team))
            done = await until_done(front, job)
    assert done.state == "completed", done.phase
    log = (tmp_path / "worker" / "worker.log").read_text()
    before, taking, after = log.partition(" jobs at once from ")
    assert taking, log[-2000:]
    assert {"openai", "anthropic", "google.genai"} <= set(imported(before))
    assert "provider SDKs loaded in" in after.splitlines()[0] and "openai, anthropic, gemini" in after
    late = [module for module in imported(after) if module.startswith(("openai", "anthropic", "google"))]
    assert not late, late[:20]


def imported(log: str) -> list[str]:
    """The modules Python's import log (PYTHONPROFILEIMPORTTIME) names, in the order first imported."""
    return [line.rpartition("|")[2].strip() for line in log.splitlines() if line.startswith("import time:")]


async def test_a_front_without_keys_queues_a_keyed_team_and_the_worker_with_them_runs_it(
    tmp_path: Path, fakes: FakeProviders, redis: Redis
) -> None:
    """Provider keys go to workers only (docs/deploy.md): the front admits what it can know, the team and
    its caller, and says in the phase that keys are checked where the job runs."""
    install(fakes.script, TRIO, voter())
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    settings = Settings(home=tmp_path / "state", queue_url=redis.url(), heartbeat_s=0.2)
    async with JobService.serve(environment_of(settings, {})) as front:
        queued = await front.submit(JobRequest(task="What is 6 * 7?", team=team))
        assert queued.state == "queued" and "checked where it runs" in queued.phase, queued.phase
        async with worker(settings):
            done = await until_done(front, queued)
    assert done.state == "completed", done.phase


async def test_a_job_no_worker_can_run_fails_at_once_with_the_workers_reason(
    tmp_path: Path, fakes: FakeProviders, redis: Redis
) -> None:
    install(fakes.script, TRIO, voter())
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    settings = Settings(home=tmp_path / "state", queue_url=redis.url(), heartbeat_s=0.2)
    async with JobService.serve(environment_of(settings, {})) as front:
        queued = await front.submit(JobRequest(task="What is 6 * 7?", team=team))
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: run_worker(JobEnvironment.of(settings, {})))  # a worker without the key
            with anyio.fail_after(30):
                done = await until_done(front, queued)
            await drain_workers(settings, ["all"])
    assert done.state == "failed", done.phase
    assert KEY_ENV in done.phase and "checked where the job runs" in done.phase, done.phase
    assert fakes.script.requests_of("ann") == []  # nothing was sent to a provider


async def test_a_worker_with_no_team_folder_runs_a_team_that_only_the_fronts_folder_holds(
    tmp_path: Path, fakes: FakeProviders, redis: Redis
) -> None:
    """Team files go on fronts only (docs/deploy.md): the front resolves the team named by the caller from
    its own team folder and stores it with the job; the worker, whose team folder is empty and whose
    keys the front lacks, runs the stored copy."""
    install(fakes.script, TRIO, voter())
    front_config, worker_config = tmp_path / "front-config", tmp_path / "worker-config"
    write_team(front_config / "conclave" / "teams" / "fronts-trio.yaml", fakes, TRIO, name="fronts-trio")
    (worker_config / "conclave" / "teams").mkdir(parents=True)
    settings = Settings(home=tmp_path / "state", queue_url=redis.url(), heartbeat_s=0.2)
    async with JobService.serve(environment_of(settings, {"XDG_CONFIG_HOME": str(front_config)})) as front:
        queued = await front.submit(JobRequest(task="What is 6 * 7?", team="fronts-trio"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: run_worker(
                    JobEnvironment.of(settings, {**ENV, "XDG_CONFIG_HOME": str(worker_config)})
                )
            )
            with anyio.fail_after(60):
                done = await until_done(front, queued)
            await drain_workers(settings, ["all"])
    assert done.state == "completed" and done.result is not None, done.phase
    assert fakes.script.requests_of("ann"), "the worker ran the front's team against the fakes"
