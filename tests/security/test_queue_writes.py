"""A write to the queue carries data, never code (docs/SECURITY.md): whoever can write to the queue's
Redis (a client with its password, or any client of one without) writes what a pickle would run into
every key the queue's processes read (its stream, its later messages, Docket's strike list and parked
messages), as a plain `XADD`/`ZADD`/`HSET` would; no worker, front or `conclave doctor` runs it. And a
front or worker refuses a queue that asks for no password unless the operator says it is private.
A real redis-server (tests/redis.py), a real worker and front in this process, the scripted fakes."""

from __future__ import annotations

import logging
import os
import pickle
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest
import redis as redis_py
import yaml
from pydantic import SecretStr
from redis.connection import parse_url

from conclave.cli.doctor import run_checks
from conclave.errors import QueueUnavailable
from conclave.jobs.environment import JobEnvironment
from conclave.jobs.queue import JobQueue
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.jobs.worker import drain_workers, run_worker
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, install, voter, write_team
from tests.fakes.waits import until_done
from tests.redis import Redis, redis_server

pytestmark = pytest.mark.anyio
ENV = {KEY_ENV: "test-key-0123456789"}
DEPLOY = Path(__file__).resolve().parents[2] / "docs" / "deploy"
PLACES = ("stream", "later", "strike")  # where a marker is planted: each makes its own folder


class Mkdir:
    """Unpickled, it makes a folder: the marker that code from the queue ran."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[object, tuple[str, int, bool]]:
        return os.makedirs, (self.path, 0o700, True)  # as often as it is loaded


def plant(redis: Redis, markers: Path, due: datetime) -> None:
    """Write pickles into the queue's keys ("conclave:..."), in Docket's message shape and in a plain
    one, the later ones due at `due`: what an attacker with write access to Redis would send."""
    client = redis_py.Redis.from_url(redis.url().get_secret_value())
    args = {place: pickle.dumps((Mkdir(markers / place),)) for place in PLACES}
    message = {
        "when": due.isoformat(),
        "function": "conclave_job",
        "kwargs": pickle.dumps({}),
        "attempt": "1",
        "generation": "0",
    }
    client.xadd(
        "conclave:stream", {**message, "key": "evil-now", "args": args["stream"], "job": args["stream"]}
    )
    client.hset("conclave:evil-later", mapping={**message, "key": "evil-later", "args": args["later"]})
    client.zadd("conclave:queue", {"evil-later": due.timestamp()})
    strike = {"direction": "strike", "function": "conclave_job", "parameter": "job_id", "operator": "=="}
    client.xadd("conclave:strikes", {**strike, "value": pickle.dumps(Mkdir(markers / "strike"))})
    client.close()


def ran(markers: Path) -> list[str]:
    return [place for place in PLACES if (markers / place).exists()]


async def test_a_pickle_written_into_the_queue_runs_in_no_worker_and_the_worker_refuses_it(
    tmp_path: Path, fakes: FakeProviders, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    install(fakes.script, TRIO, voter())
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    markers = tmp_path / "markers"
    markers.mkdir()
    plant(redis, markers, datetime.now(UTC) - timedelta(seconds=1))  # due: a worker takes them at once
    settings = Settings(home=tmp_path / "state", queue_url=redis.url(), heartbeat_s=0.2)
    caplog.set_level(logging.WARNING, logger="conclave.jobs.queue")
    with anyio.fail_after(120):  # a hang guard, not a speed
        async with JobService.serve(environment_of(settings, ENV)) as front, anyio.create_task_group() as tg:
            tg.start_soon(lambda: run_worker(JobEnvironment.of(settings, ENV)))
            job = await front.submit(JobRequest(task="What is 6 * 7?", team=team))
            done = await until_done(front, job)  # its message came after the planted ones
            await drain_workers(settings, ["all"])
    assert ran(markers) == []
    assert done.state == "completed", done.phase
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert any("conclave:stream" in line and "not a job id" in line for line in refused), refused
    assert any("conclave:queue" in line for line in refused), refused
    client = redis_py.Redis.from_url(redis.url().get_secret_value())
    assert client.xlen("conclave:stream") == 0 and client.zcard("conclave:queue") == 0  # refused: dropped
    client.close()


def test_doctor_counts_planted_messages_due_in_hours_and_runs_none(tmp_path: Path, redis: Redis) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    plant(redis, markers, datetime.now(UTC) + timedelta(hours=3))
    settings = Settings(home=tmp_path / "state", queue_url=redis.url())
    probes = {p.name: p for p in run_checks(settings, {})}
    assert ran(markers) == []
    queue = probes["job queue"]
    assert "2 messages waiting, 0 being run" in queue.detail, queue.detail  # counted, none loaded


async def test_a_front_or_worker_refuses_a_queue_without_a_password_unless_it_is_private(
    tmp_path: Path,
) -> None:
    with redis_server(password=None) as open_redis:
        settings = Settings(home=tmp_path / "state", queue_url=open_redis.url())
        refusal = r"CONCLAVE_QUEUE_URL=unix://.*gives no password.*CONCLAVE_QUEUE_PRIVATE=1"
        with pytest.raises(QueueUnavailable, match=refusal):
            async with JobService.serve(environment_of(settings, ENV)):
                pass
        with pytest.raises(QueueUnavailable, match=refusal):
            await run_worker(JobEnvironment.of(settings, ENV))
        private = Settings(home=tmp_path / "state", queue_url=open_redis.url(), queue_private=True)
        async with JobService.serve(environment_of(private, ENV)) as front:
            assert (await front.readiness()).queue == "ok"
        with anyio.fail_after(60), anyio.CancelScope() as scope:  # a hang guard
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: run_worker(JobEnvironment.of(private, ENV)))
                async with JobQueue.open(open_redis.url(), private=True) as queue:
                    while not await queue.workers(private.stale_after_s):
                        await anyio.sleep(0.05)  # sleep-ok: until the worker lists itself
                await drain_workers(private, ["all"])
        assert not scope.cancelled_caught
    # a password in the URL is authentication; a wrong one is said as Redis says it, the password masked
    with redis_server() as locked:
        wrong = SecretStr(f"unix://:not-it@{locked.socket}")
        with pytest.raises(QueueUnavailable, match=r"unix://:\*\*\*@.*could not be reached") as caught:
            async with JobQueue.open(wrong):
                pass
        assert "not-it" not in str(caught.value)


def test_the_deploy_files_give_redis_a_password_and_every_queue_url_carries_it() -> None:
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    assert "--requirepass" in " ".join(str(arg) for arg in services["redis"]["command"])
    envs = {name: service.get("environment", {}) for name, service in services.items()}
    urls = {name: env["CONCLAVE_QUEUE_URL"] for name, env in envs.items() if "CONCLAVE_QUEUE_URL" in env}
    assert {"front-1", "front-2", "worker"} <= set(urls)
    assert all(url.startswith("redis://:${REDIS_PASSWORD:?") for url in urls.values()), urls
    assert not any("CONCLAVE_QUEUE_PRIVATE" in env for env in envs.values())

    documents = [
        d for path in (DEPLOY / "k8s").glob("*.yaml") for d in yaml.safe_load_all(path.read_text()) if d
    ]
    [secret] = [d for d in documents if d["kind"] == "Secret"]
    password = secret["stringData"]["redis-password"]
    assert parse_url(secret["stringData"]["queue-url"]).get("password") == password
    containers = {
        c["name"]: c
        for d in documents
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    redis = containers["redis"]
    assert redis["args"][-2:] == ["--requirepass", "$(REDIS_PASSWORD)"]
    [given] = [e for e in redis["env"] if e["name"] == "REDIS_PASSWORD"]
    assert given["valueFrom"]["secretKeyRef"] == {"name": "conclave", "key": "redis-password"}
    queue_envs = [
        e for c in containers.values() for e in c.get("env", []) if e["name"] == "CONCLAVE_QUEUE_URL"
    ]
    assert len(queue_envs) >= 2  # the fronts' and the workers'
    assert all(e["valueFrom"]["secretKeyRef"] == {"name": "conclave", "key": "queue-url"} for e in queue_envs)
