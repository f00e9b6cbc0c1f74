"""Benchmark (not a test): how long a job waits to be taken over after its server is `kill -9`ed.

    python bench/bench_takeover.py [--rounds 3] [--out bench/results/takeover.json]

Each round runs the scripted trio transcript (tests/fakes/team.py `voter`, 1 s a reply) on a real
`conclave serve --http` and kills it with SIGKILL once every agent has answered (the agents are in
their voting turns). Two ways to go on:
- `restart`: a new server is started on the same state folder (the single-process default); it takes
  the job over before it serves, since the owner's process is dead;
- `peer`: a second server was already running on the same state folder; it takes the job over at its
  next heartbeat (CONCLAVE_HEARTBEAT_S, 5 s).
Two kinds of job: `plain` (the trio's question, no files) and `files` (tests/fakes/calc_task.py: the
trio fixes a failing test in a project, each agent in its Docker sandbox, `verify` checking each
answer, 1 s a reply): a files job's resume also rebuilds its workspaces from its snapshots and starts
new containers and checks (jobs/upkeep/takeover.py).
Reported per way and kind, median and worst of the rounds: seconds from the kill to the job's
`resumed` event (its wall time: the job's start plus the event's offset), and to its completion, and
the files job's medians as ratios of the plain job's. A server on another
machine judges a dead owner by its lease alone, so there the bound is the lease plus a heartbeat
(15 + 5 s by default), reported as the settings give it. The machine is shared: times are noisy, the
restart's include a cold process start (imports), the part a faster machine shrinks most.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import anyio
from fastmcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_file import write_results
from conclave.jobs.read.views import JobView
from conclave.jobs.store.sql import Store
from conclave.settings import Settings
from tests.fakes.calc_task import CHECK, TASK, agent, calc_project
from tests.fakes.processes import HTTP_TOKEN, http_process
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, install, voter, write_team

ASK = {"task": "What is 6 * 7?", "team": "fake-trio", "wait_seconds": 0}
KINDS = ("plain", "files")
DOCKER = {"memory": "256m", "cpus": 1, "pids": 64}


def slowed(respond: Any, delay: float) -> Any:
    """`respond`, each reply `delay` seconds late (the agents are still voting when the server dies)."""

    def slow(request: RecordedRequest) -> Reply:
        reply: Reply = respond(request)
        reply.delay = delay
        return reply

    return slow


def job_of(kind: str, root: Path, fakes: FakeProviders, teams: Path) -> dict[str, Any]:
    """The team file and the ask_team arguments of a job of `kind`; the fakes scripted for it."""
    if kind == "plain":
        install(fakes.script, TRIO, voter(delay=1.0))
        write_team(teams / "fake-trio.yaml", fakes, TRIO, name="fake-trio")
        return ASK
    for _, name in TRIO:
        fakes.script.set_default(name, slowed(agent("ann"), 1.0))
    write_team(teams / "fake-files.yaml", fakes, TRIO, name="fake-files", sandbox=DOCKER)
    project = calc_project(root)
    paths = [{"path": str(project), "permission": "write"}]
    return {"task": TASK, "team": "fake-files", "context_paths": paths, "verify": CHECK, "wait_seconds": 0}


@contextmanager
def server(root: Path, name: str, env: dict[str, str]) -> Iterator[tuple[str, Any]]:
    folder = root / name
    folder.mkdir()
    with http_process(folder, env) as (base, process):
        yield f"{base}/mcp", process


async def view(client: Client, job_id: str, wait: float = 0) -> JobView:
    result = await client.call_tool("get_status", {"job_id": job_id, "wait_seconds": wait})
    return JobView.model_validate(result.structured_content)


async def one_round(way: str, kind: str, root: Path, fakes: FakeProviders) -> dict[str, float]:
    home, config = root / "home", root / "config"
    ask = job_of(kind, root, fakes, config / "conclave" / "teams")
    env = {
        "CONCLAVE_HOME": str(home),
        "XDG_CONFIG_HOME": str(config),
        KEY_ENV: "k",
        "CONCLAVE_CHECK_POOL": "0",
        "CONCLAVE_ALLOWED_ROOTS": str(root),  # the files job's project, beside each server's folder
    }
    with ExitStack() as stack:
        url, first = stack.enter_context(server(root, "first", env))
        peer_url = stack.enter_context(server(root, "peer", env))[0] if way == "peer" else None
        async with Client(url, auth=HTTP_TOKEN) as client:
            job_id = JobView.model_validate(
                (await client.call_tool("ask_team", ask)).structured_content
            ).job_id
            while (v := await view(client, job_id)).progress is None or sum(
                a.answers for a in v.progress.agents
            ) < 3:
                await anyio.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        killed = time.time()
        first.wait()
        if peer_url is None:
            peer_url = stack.enter_context(server(root, "restarted", env))[0]
        async with Client(peer_url, auth=HTTP_TOKEN) as client:
            while not (done := await view(client, job_id, wait=45)).done:
                pass
        ended = time.time()
    store = Store(Settings(home=home).db_path)
    try:
        row = store.job(job_id)
        resumed = store.events(job_id, "resumed")
    finally:
        store.close()
    assert row is not None and row.started_at is not None and resumed, (way, done.state)
    return {
        "to_resumed_s": round(row.started_at + resumed[0].at - killed, 2),
        "to_completed_s": round(ended - killed, 2),
        "completed": float(done.state == "completed"),
    }


async def run(rounds: int) -> dict[str, Any]:
    data: dict[str, Any] = {"rounds": rounds, "load_before": os.getloadavg()[0]}
    with FakeProviders() as fakes, tempfile.TemporaryDirectory() as tmp:
        for way in ("restart", "peer"):
            for kind in KINDS:
                seen = []
                for index in range(rounds):
                    root = Path(tmp) / f"{way}-{kind}-{index}"
                    root.mkdir()
                    seen.append(await one_round(way, kind, root, fakes))
                name = way if kind == "plain" else f"{way}_{kind}"  # the plain job's keys as before
                for key in ("to_resumed_s", "to_completed_s"):
                    values = [s[key] for s in seen]
                    data[f"{name}_{key}_median"] = statistics.median(values)
                    data[f"{name}_{key}_max"] = max(values)
                data[f"{name}_completed"] = sum(s["completed"] for s in seen)
            for key in ("to_resumed_s", "to_completed_s"):
                ratio = data[f"{way}_files_{key}_median"] / data[f"{way}_{key}_median"]
                data[f"{way}_files_over_plain_{key}"] = round(ratio, 2)
    settings = Settings()
    data["other_machine_bound_s"] = settings.stale_after_s + settings.heartbeat_s
    data["load_after"] = os.getloadavg()[0]
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/results/takeover.json"))
    args = parser.parse_args()
    write_results(args.out, anyio.run(run, args.rounds), table=True)


if __name__ == "__main__":
    main()
