"""What verification adds to a job, on the end-to-end scenario of tests/test_verify.py: Docker and the
fake providers through the real SDKs.

    python bench/bench_verify.py

Three agents fix calc.py (one right, one wrong, one not at all) and vote; the same job runs with
`verify="python3 -m unittest -q test_calc"` and without it, alternately, at two provider latencies (the
fakes' own, and a fixed delay per reply standing in for a real model's). For each: wall time per job
(median), model requests and tokens per job. Then the concurrency of the check containers, sampled
from the Docker engine every 50 ms, at CONCLAVE_VERIFY_CONCURRENCY 1, 2 and 3. Writes
bench/results/verify.json.
"""

from __future__ import annotations

import inspect
import json
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' fakes and scripts

import docker

from bench.submitting import open_service, submit
from conclave.backends.retry import RetryPolicy
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.calc_task import CALC, CHECK, TASK, TESTS, agent
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_DESTINATION, KEY_ENV, TRIO, write_team

RESULTS = Path(__file__).parent / "results" / "verify.json"
ENV = {KEY_ENV: "bench-key-0123456789"}
RUNS = 5
LATENCIES = (0.0, 1.0)  # seconds added to every reply: none (the test's), and a stand-in for a real model
FAVOURITES = {"ann": "ann", "bob": "bob", "cy": "bob"}


def checks_of(events: list[Any]) -> tuple[dict[str, float], list[tuple[str, float, float | None, str]]]:
    """When each answer's check started, and each check's (label, end, duration, status): from the typed
    events, or from an older tree's (`--before`), whose events held their fields in a dict."""
    started: dict[str, float] = {}
    checked: list[tuple[str, float, float | None, str]] = []
    for event in events:
        if event.kind not in ("check_started", "checked"):
            continue
        data = getattr(event, "data", None)  # before the events were typed
        label = data["label"] if data is not None else event.label
        if event.kind == "check_started":
            started[label] = event.at
        elif data is not None:
            checked.append((label, event.at, data["duration_s"], data["status"]))
        else:
            checked.append((label, event.at, event.check.duration_s, event.check.status))
    return started, checked


def slowed(respond: Any, latency: float) -> Any:
    def reply(request: RecordedRequest) -> Reply:
        made = respond(request)
        made.delay += latency
        return made

    return reply


async def one_job(root: Path, latency: float, verify: str | None, concurrency: int = 2) -> dict[str, Any]:
    """One job from submit to done; the check containers' count sampled while it runs."""
    project = root / f"proj-{time.monotonic_ns()}"
    project.mkdir()
    (project / "calc.py").write_text(CALC)
    (project / "test_calc.py").write_text(TESTS)
    client = docker.from_env()
    with FakeProviders() as fakes:
        for name, favourite in FAVOURITES.items():
            fakes.script.set_default(name, slowed(agent(favourite), latency))
        team = str(write_team(root / "team.yaml", fakes, TRIO, coordination={"final": "reuse"}))
        settings = Settings(
            home=root / "state",
            verify_concurrency=concurrency,
            gc_auto=False,
            key_destinations=(KEY_DESTINATION,),
        )
        pool = {"check_pool": True} if "check_pool" in inspect.signature(JobService.open).parameters else {}
        async with open_service(settings, ENV, RetryPolicy(max_attempts=2), **pool) as service:
            if verify is not None:  # a job on a running server: its check pool, where it has one, is filled
                await pool_filled(client, concurrency)
            started = time.perf_counter()
            view = await submit(service, TASK, team, context_paths=[{"path": str(project)}], verify=verify)
            seen = 0
            while not view.done:
                labels = {"label": f"conclave.job={view.job_id}"}
                # the low-level list: no per-container inspect that races a check container's removal
                running = await anyio.to_thread.run_sync(partial(client.api.containers, filters=labels))
                seen = max(
                    seen, sum(c["Labels"].get("conclave.agent", "").startswith("check-") for c in running)
                )
                view = await service.wait(view.job_id, 0.05)
            wall = time.perf_counter() - started
            events = await service.store.events(view.job_id)
    assert view.state == "completed", view.text()
    started, checked = checks_of(events)
    durations = [duration for _, _, duration, _ in checked]
    overheads = [at - started[label] - (duration or 0) for label, at, duration, _ in checked]
    errors = [label for label, _, _, status in checked if status == "error"]
    assert not errors, errors
    return {
        "wall_s": wall,
        "requests": len(fakes.script.requests),
        "tokens": view.usage.tokens,
        "winner_passed": bool(view.winner_check and view.winner_check.startswith("passed")),
        "checks": len(durations),
        "check_command_s": durations,
        "max_check_containers": seen,
        "overheads_s": overheads,
    }


async def pool_filled(client: Any, count: int) -> None:
    """Until `count` pooled check containers of this server (coordination/check_pool.py) have their
    runner up; at once for code without a pool."""
    try:
        from conclave.coordination.check_pool import JOB_LABEL
        from conclave.sandbox.engine import PROCESS_OWNER
    except ImportError:
        return
    labels = {"label": [f"conclave.job={JOB_LABEL}", f"conclave.owner={PROCESS_OWNER.id}"]}

    def ready() -> bool:
        started = 0
        for container in client.containers.list(ignore_removed=True, filters=labels):
            rows = container.top().get("Processes") or []
            started += any("python3 -I" in " ".join(row) for row in rows)  # the last step of its start
        return started >= count

    with anyio.fail_after(60):
        while not await anyio.to_thread.run_sync(ready):
            await anyio.sleep(0.05)


def med(rows: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(row[key] for row in rows), 3)


async def main() -> None:
    result: dict[str, Any] = {"runs_each": RUNS, "verify": CHECK, "by_latency": {}, "concurrency": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for latency in LATENCIES:
            runs: dict[str, list[dict[str, Any]]] = {"without": [], "with": []}
            for _ in range(RUNS):  # alternate, so load on the shared machine hits both alike
                runs["without"].append(await one_job(root, latency, None))
                runs["with"].append(await one_job(root, latency, CHECK))
            rows = {
                name: {key: med(jobs, key) for key in ("wall_s", "requests", "tokens")}
                for name, jobs in runs.items()
            }
            rows["with"]["winner_passed"] = all(job["winner_passed"] for job in runs["with"])
            rows["with"]["check_command_s"] = round(
                statistics.median(d for job in runs["with"] for d in job["check_command_s"]), 3
            )
            keys = ("wall_s", "requests", "tokens")
            ratio = {key: round(rows["with"][key] / rows["without"][key], 2) for key in keys}
            result["by_latency"][f"{latency:g}s per reply"] = {**rows, "ratio_with_to_without": ratio}
        for concurrency in (1, 2, 3):
            jobs = [await one_job(root, 0.0, CHECK, concurrency) for _ in range(3)]
            result["concurrency"][f"CONCLAVE_VERIFY_CONCURRENCY={concurrency}"] = {
                "max_check_containers_seen": max(job["max_check_containers"] for job in jobs),
                "wall_s_median": med(jobs, "wall_s"),
            }
    result["note"] = (
        "wall time is submit to done in-process on a 2-core machine shared with other work; the "
        "check command is the test's pytest run in the job's warm check containers (as many as "
        "checks may run at once); bench/results/checks.json has before and after"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    anyio.run(main)
