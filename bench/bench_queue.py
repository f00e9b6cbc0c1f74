"""Benchmark (not a test): the job queue and its workers (jobs/queue.py, jobs/worker.py), as deployed on
one machine: a redis-server and a PostgreSQL of its own (tests/redis.py, tests/postgres.py), one
`conclave serve --http` front, `conclave worker` processes, the scripted trio transcript on the fakes.

    python bench/bench_queue.py [--jobs 64] [--out bench/results/queue.json]

- `one` against `three`: the jobs asked at once through the front (8 clients asking at a time), run
  by one worker and then by three, each with CONCLAVE_MAX_JOBS=2 to stand in for a machine's limit;
  seconds from the first ask to the last job's end, and the ratio three / one (goal: <= 0.4); also
  from the first job's start to the last one's end (`span`: the asking left out). 64 jobs on 6 slots
  are 11 rounds against 32 on 2, so 0.344 is the best ratio jobs of equal length allow. Where the
  time went is reported beside (bench/queue_timeline.py: each job's run and set-up, the slots' gaps,
  the CPU of each process and of the machine, the slowest jobs' events).
- get_status through the front while they run: p50 and p99 of a client polling one job after
  another, from the ask to the last job's end (goal: p99 <= 50 ms), and of the same calls once they
  have ended (`idle`). Two figures per call: `get_status_p99_ms` is the client's round trip (FastMCP's
  Client over streamable HTTP, in this process), `get_status_front_p99_ms` the front's own time for
  the same call, from its `Server-Timing` header (app/server_timing.py: from the request reaching the
  app to its reply starting). The difference is the client's stack, the loopback, and the two
  processes' waits for a CPU. Once the jobs are over, the CPU per call of the front and of this
  process (`get_status_idle_front_cpu_ms`, `..._client_cpu_ms`): counts of work, which the machine's
  load hardly moves, where the times above are mostly waits for a CPU under load.
- `three_niced`: `three` again with the workers under `nice -n 19`. As deployed, workers run on
  machines of their own; here they share the 2 cores with the front, PostgreSQL, Redis, the fakes and
  this client (and with whatever else the machine runs: see the load averages), so `three` measures a
  front that competes with its own workers for the CPU, and `three_niced` one that they yield to,
  nearer the deployment (PostgreSQL and Redis still serve the workers at normal priority). Neither
  removes the machine's other load: a p99 is only as good as the load averages beside it.
- the takeover delay after a worker's `kill -9`, once every agent has answered (mid-vote): seconds
  from the kill to the job's `resumed` event and to its end. `same_host`: the other workers see the
  dead process at their next heartbeat (CONCLAVE_HEARTBEAT_S, default 5 s); `other_host`: the killed
  worker ran under a host name of its own (`unshare --uts`), so the others judge it by its lease alone
  (CONCLAVE_STALE_AFTER_S, default 15 s, plus a heartbeat) as workers on another machine do. Both
  with the default settings (goal: <= 30 s); their replies wait 6 s, so the kill lands mid-vote.

Every reply of the fakes waits 1 s (`voter(delay=1.0)`): a job is a few seconds of waiting on its
providers and little CPU, so the workers' parallelism, not the 2 cores (shared with other work:
see the load averages), is what the ratio measures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx2
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.queue_timeline import CpuClock, process_cpu_s, slowest_jobs, timeline
from bench.results_file import write_results
from conclave.jobs.read.views import JobView
from conclave.jobs.store.sql import Store
from conclave.settings import Settings
from tests.fakes.processes import http_process, worker_process
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, install, voter, write_team
from tests.postgres import cluster
from tests.redis import redis_server

TOKEN = "bench-token-0123456789abcdef"
ASK = {"task": "What is 6 * 7?", "team": "fake-trio", "wait_seconds": 0}
MAX_JOBS = 2
ASKERS = 8  # clients asking at once, as many callers do: one client asking in turn is what it measures
# the takeover parts' reply delay: a voting turn outlasts the second worker's start, so the kill lands
# mid-vote
TAKEOVER_DELAY_S = 6.0
# (part, workers: 0 = takeover); `three_niced`: the workers under `nice -n 19` (see the docstring)
PARTS = (("one", 1), ("three", 3), ("three_niced", 3), ("same_host", 0), ("other_host", 0))
NICE = ("nice", "-n", "19")
IDLE_CALLS = 300
SERVER_TIMING = re.compile(r"\bapp;dur=([0-9.]+)")


class TimedPoller:
    """A client of its own for the polling: each call's round trip, and the front's own time for it from
    the reply's Server-Timing header (app/server_timing.py)."""

    def __init__(self, url: str) -> None:
        self.server_ms: list[float] = []

        async def kept(response: httpx2.Response) -> None:
            found = SERVER_TIMING.search(response.headers.get("server-timing", ""))
            # the calls only: the client lists the tools once, after its first call (their output schemas)
            if found and b'"method":"tools/call"' in response.request.content:
                self.server_ms.append(float(found.group(1)))

        def factory(**options: Any) -> httpx2.AsyncClient:
            return httpx2.AsyncClient(**options, event_hooks={"response": [kept]})

        transport = StreamableHttpTransport(url, auth=TOKEN, httpx_client_factory=factory)
        self.client = Client(transport)

    async def poll(self, job_id: str) -> tuple[float, float]:
        """(round trip, the front's time), in ms."""
        self.server_ms.clear()
        began = time.perf_counter()
        await view(self.client, job_id)
        spent = (time.perf_counter() - began) * 1000
        assert len(self.server_ms) == 1, self.server_ms  # one POST per call, timed by the front
        return spent, self.server_ms[0]


async def view(client: Client, job_id: str, wait: float = 0) -> JobView:
    result = await client.call_tool("get_status", {"job_id": job_id, "wait_seconds": wait})
    return JobView.model_validate(result.structured_content)


async def ask(client: Client) -> str:
    return JobView.model_validate((await client.call_tool("ask_team", ASK)).structured_content).job_id


class Deployment:
    """A front and its shared services for one part of the bench; workers are started per part."""

    def __init__(self, root: Path, env: dict[str, str], stack: ExitStack) -> None:
        self.root, self.env, self.stack = root, env, stack
        home = root / "front" / "home"
        home.mkdir(parents=True, mode=0o700)
        (home / "http-tokens.json").write_text(json.dumps({"bench": TOKEN}))
        (home / "http-tokens.json").chmod(0o600)
        front_env = {**env, "CONCLAVE_HOME": str(home), "CONCLAVE_MAX_QUEUED": "1000"}
        front_env["CONCLAVE_MAX_QUEUED_PER_CALLER"] = "1000"
        base, self.front = stack.enter_context(http_process(root / "front", front_env, token=None))
        self.url = f"{base}/mcp"
        self.workers = 0
        self.pids = {"front": self.front.pid}  # whose CPU the many-jobs parts report

    def worker(self, prefix: tuple[str, ...] = ()) -> Any:
        self.workers += 1
        folder = self.root / f"worker-{self.workers}"
        env = {**self.env, "CONCLAVE_HOME": str(folder / "home"), "CONCLAVE_MAX_JOBS": str(MAX_JOBS)}
        process = self.stack.enter_context(worker_process(folder, env, prefix))
        self.pids[f"worker-{self.workers}"] = process.pid
        return process

    def store(self) -> Store:
        return Store.of(
            Settings(
                home=self.root / "reader",
                database_url=self.env["CONCLAVE_DATABASE_URL"],
                jobs_dir=Path(self.env["CONCLAVE_JOBS_DIR"]),
            )
        )


async def many_jobs(deployment: Deployment, jobs: int) -> dict[str, Any]:
    """`jobs` asked at once; seconds to the last one's end, and get_status's latencies meanwhile."""
    latencies: list[tuple[float, float]] = []  # (round trip, the front's own time), ms
    cpu = CpuClock(dict(deployment.pids))
    poller = TimedPoller(deployment.url)
    async with Client(deployment.url, auth=TOKEN) as client, poller.client:
        start, started_at = time.perf_counter(), time.time()  # wall-time: job rows hold epoch times
        ids: list[str] = []
        limiter = anyio.CapacityLimiter(ASKERS)

        async def ask_one() -> None:
            async with limiter:
                ids.append(await ask(client))

        async with anyio.create_task_group() as asking:
            for _ in range(jobs):
                asking.start_soon(ask_one)
        asked = time.perf_counter() - start
        asking_cpu = cpu.read(asked)  # what the admissions cost the front, beside the first jobs' runs
        done = anyio.Event()

        async def poll() -> None:
            index = 0
            while not done.is_set():
                latencies.append(await poller.poll(ids[index % len(ids)]))
                index += 1
                await anyio.sleep(0.02)

        async with anyio.create_task_group() as tg:
            tg.start_soon(poll)
            views = [await wait_done(client, job_id) for job_id in ids]
            done.set()
        wall, ended_at = time.perf_counter() - start, time.time()
        used = cpu.read(wall)
        idle = []  # the same calls once nothing runs: what the front costs alone on this machine
        front_before, own = process_cpu_s(deployment.front.pid), time.process_time()
        for index in range(IDLE_CALLS):
            idle.append(await poller.poll(ids[index % len(ids)]))
        front_cpu = process_cpu_s(deployment.front.pid) - front_before
        client_cpu = time.process_time() - own
    store = deployment.store()
    try:
        rows = [row for row in (store.job(job_id) for job_id in ids) if row is not None]
        slowest, timing = slowest_jobs(store, rows), timeline(store, rows, MAX_JOBS * deployment.workers)
    finally:
        store.close()
    owners = {row.owner_pid for row in rows}
    # how many jobs ran at once, sampled every 0.1 s from the first start to the last end
    spans = [(row.started_at, row.finished_at) for row in rows if row.started_at and row.finished_at]
    first, last = min(a for a, _ in spans), max(b for _, b in spans)
    samples = [sum(a <= first + t / 10 < b for a, b in spans) for t in range(int((last - first) * 10))]
    waits = [row.started_at - row.created_at for row in rows if row.started_at]
    runs = [row.finished_at - row.started_at for row in rows if row.finished_at and row.started_at]
    return {
        # the first ask to the last job's end, by the rows' clock (this machine's): what the workers
        # took, asking included; `seen_s` is to when this bench saw it, as its waits go through the
        # jobs one after another, each seeing an end up to a front's poll (0.2 s) and a call later
        "wall_s": round(last - started_at, 2),
        "seen_s": round(wall, 2),
        "asking_s": round(asked, 2),
        "jobs_span_s": round(last - first, 2),  # the first job's start to the last one's end
        "first_start_after_first_ask_s": round(first - started_at, 2),
        "last_end_to_seen_s": round(ended_at - last, 2),
        "job_run_s_median": round(statistics.median(runs), 2),
        "running_at_once_mean": round(statistics.mean(samples), 2),
        "running_at_once_max": max(samples),
        "jobs_per_worker": sorted(Counter(row.owner_pid for row in rows).values()),
        "queue_wait_s_median": round(statistics.median(waits), 2),
        "completed": sum(v.state == "completed" for v in views),
        "workers_that_ran_jobs": len(owners),
        "get_status_calls": len(latencies),
        **percentiles("get_status", latencies),
        **percentiles("get_status_idle", idle),
        # the front's CPU per idle call: a count more than a time, so the machine's load hardly moves it
        "get_status_idle_front_cpu_ms": round(front_cpu / IDLE_CALLS * 1000, 2),
        # and this process's (the client, and the fakes' thread, idle by then)
        "get_status_idle_client_cpu_ms": round(client_cpu / IDLE_CALLS * 1000, 2),
        "timeline": timing,
        "slowest_jobs": slowest,
        "cpu": used,
        "cpu_while_asking": asking_cpu,
    }


def percentiles(name: str, samples: list[tuple[float, float]]) -> dict[str, float]:
    """p50 and p99 of the client's round trips (`NAME_p50_ms`) and of the front's own time for the same
    calls (`NAME_front_p50_ms`, its Server-Timing): the rest is the client's stack and waiting for a CPU."""
    trips, front = sorted(trip for trip, _ in samples), sorted(spent for _, spent in samples)
    at = int(0.99 * (len(samples) - 1))
    return {
        f"{name}_p50_ms": round(statistics.median(trips), 1),
        f"{name}_p99_ms": round(trips[at], 1),
        f"{name}_front_p50_ms": round(statistics.median(front), 1),
        f"{name}_front_p99_ms": round(front[at], 1),
    }


async def wait_done(client: Client, job_id: str) -> JobView:
    while not (v := await view(client, job_id, wait=45)).done:
        pass
    return v


async def takeover(deployment: Deployment, other_host: bool) -> dict[str, Any]:
    """Kill the worker running a job mid-vote; seconds to its takeover and to its end."""
    prefix = ("unshare", "--uts", "sh", "-c", 'hostname bench-other-host && exec "$@"', "sh")
    victim = deployment.worker(prefix if other_host else ())
    async with Client(deployment.url, auth=TOKEN) as client:
        job_id = await ask(client)
        while (await view(client, job_id)).state == "queued":
            await anyio.sleep(0.05)
        deployment.worker()  # the one that takes it over, started once the victim has the job
        while (v := await view(client, job_id)).progress is None or sum(
            a.answers for a in v.progress.agents
        ) < 3:
            await anyio.sleep(0.05)
        victim.send_signal(signal.SIGKILL)  # mid-vote: each turn takes TAKEOVER_DELAY_S
        killed = time.time()
        victim.wait()
        finished = await wait_done(client, job_id)
        ended = time.time()
    store = deployment.store()
    try:
        row = store.job(job_id)
        resumed = store.events(job_id, "resumed")
    finally:
        store.close()
    assert row is not None and row.started_at is not None and resumed, finished.phase
    assert row.owner_pid != victim.pid
    return {
        "to_resumed_s": round(row.started_at + resumed[0].at - killed, 2),
        "to_completed_s": round(ended - killed, 2),
        "completed": finished.state == "completed",
    }


async def run(jobs: int, parts: list[str]) -> dict[str, Any]:
    data: dict[str, Any] = {"jobs": jobs, "max_jobs_per_worker": MAX_JOBS, "reply_delay_s": 1.0}
    data["load_before"] = os.getloadavg()
    settings = Settings()
    data["heartbeat_s"], data["stale_after_s"] = settings.heartbeat_s, settings.stale_after_s
    with (
        FakeProviders() as fakes,
        tempfile.TemporaryDirectory(prefix="bench-queue-", dir="/tmp") as tmp,
        redis_server() as redis,
        cluster(fsync=True) as postgres,
    ):
        install(fakes.script, TRIO, voter(delay=1.0))
        config = Path(tmp) / "config"
        write_team(config / "conclave" / "teams" / "fake-trio.yaml", fakes, TRIO, name="fake-trio")
        for part, workers in [(p, w) for p, w in PARTS if p in parts]:
            redis.flush()
            root = Path(tmp) / part
            with ExitStack() as stack:
                url = stack.enter_context(postgres.schema())
                env = {
                    "CONCLAVE_DATABASE_URL": url.get_secret_value(),
                    "CONCLAVE_QUEUE_URL": redis.url().get_secret_value(),
                    "CONCLAVE_JOBS_DIR": str(root / "jobs"),
                    "XDG_CONFIG_HOME": str(config),
                    KEY_ENV: "k",
                    "CONCLAVE_CHECK_POOL": "0",
                    "FASTMCP_LOG_LEVEL": "WARNING",
                }
                deployment = Deployment(root, env, stack)
                load_before = os.getloadavg()
                for _ in range(workers):
                    deployment.worker(NICE if part == "three_niced" else ())
                if workers:
                    data[part] = await many_jobs(deployment, jobs)
                else:
                    install(fakes.script, TRIO, voter(delay=TAKEOVER_DELAY_S))
                    data[part] = await takeover(deployment, other_host=part == "other_host")
                data[part]["load_before"] = load_before
                data[part]["load_after"] = os.getloadavg()
    if "one" in data and "three" in data:
        data["three_over_one"] = round(data["three"]["wall_s"] / data["one"]["wall_s"], 3)
        data["three_over_one_span"] = round(data["three"]["jobs_span_s"] / data["one"]["jobs_span_s"], 3)
    data["load_after"] = os.getloadavg()
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=64)
    parser.add_argument("--parts", nargs="*", default=[part for part, _ in PARTS], help="which parts to run")
    parser.add_argument("--out", type=Path, default=Path("bench/results/queue.json"))
    args = parser.parse_args()
    write_results(args.out, anyio.run(run, args.jobs, args.parts), table=True)


if __name__ == "__main__":
    main()
