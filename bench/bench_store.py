"""Benchmark (not a test): many jobs at once at the default settings, and get_status while they run.

    python bench/bench_store.py [--jobs 16] [--label after] [--commit TEXT] [--out bench/results/store.json]

Each job is the scripted invalidation transcript of tests/test_orchestrator.py (three providers; ann
answers at once and votes, bob answers at 0.3 s, cy at 1.5 s, the critical path; bob revises after
seeing cy's answer, which clears the votes; everyone votes for bob's answer, bob presents), on the
fake providers through the real SDKs. The fakes run in a child process, as real providers are
elsewhere, so the event loop measured is the server's alone.

After a warm-up job (the SDKs' first imports take seconds here), one job alone, then `--jobs` jobs
submitted at once; then the same again while get_status is called on
every running job in turn (the service's `view`, which the tool calls with wait_seconds=0, and the
real tool through an in-memory MCP client) and each call's latency is kept. The wall time of the jobs
together is taken in a run of its own, with no one polling (the polling is CPU of its own).
Reported: wall time of one job alone, of all the jobs together and the ratio, get_status p50/p99.
Run it on two commits with different labels and the same `--out` for a before/after pair; the file
keeps one entry per label.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' fakes

from tests.fakes.script import RecordedRequest, Reply  # noqa: E402
from tests.fakes.team import KEY_ENV, decide, is_presentation, own_letter, vote_labels  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "store.json"
TASK = "What is 6 times 7?"
ENV = {KEY_ENV: "bench-key-0123456789"}
FIRST = {"ann": 0.05, "bob": 0.3, "cy": 1.5}  # cy's 1.5 s is the critical path
SAMPLE_GAP_S = 0.005


def members(job: int) -> list[tuple[str, str]]:
    return [("openai", f"ann{job}"), ("anthropic", f"bob{job}"), ("gemini", f"cy{job}")]


def responder(job: int, role: str, bobs: dict[int, str]) -> Any:
    """tests/test_orchestrator.py's `scripted(..., first_delay=1.5, revise=True)`, reading the letters
    from the prompts (the job ids, hence the letters, are the service's)."""

    def respond(request: RecordedRequest) -> Reply:
        if is_presentation(request):
            return Reply(text=f"FINAL by {role}: 42", delay=0.05)
        own = own_letter(request) or "?"
        if role == "bob":
            bobs[job] = own
        labels = vote_labels(request)
        mine = [label for label in labels if label.startswith(own)]
        if not mine:
            return Reply(tool_calls=[("new_answer", {"content": f"{role} v1: 42"})], delay=FIRST[role])
        bob = bobs.get(job, "?")
        if role == "bob" and len(labels) == 3 and mine == [f"{bob}1"]:
            return Reply(tool_calls=[("new_answer", {"content": "bob v2: 42, with cy's check"})], delay=0.05)
        target = next((label for label in labels if label.startswith(bob)), mine[0])
        return decide("vote", {"answer": target, "reason": f"{target} is right"}, request)

    return respond


def serve_fakes(jobs: int) -> None:
    """The child process: the fake providers with every job's script, until stdin closes."""
    from tests.fakes.server import FakeProviders

    with FakeProviders() as fakes:
        bobs: dict[int, str] = {}
        for job in range(jobs):
            for _, agent in members(job):
                fakes.script.set_default(agent, responder(job, agent.rstrip("0123456789"), bobs))
        print(fakes.port, flush=True)
        sys.stdin.read()


class RemoteFakes:
    """The child's fake providers, as team files name them."""

    def __init__(self, port: int) -> None:
        self.port = port

    def base_url(self, provider: str, agent: str) -> str:
        from tests.fakes.server import PREFIXES

        return f"http://127.0.0.1:{self.port}" + PREFIXES[provider].format(agent=agent)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_jobs(
    root: Path, fakes: RemoteFakes, first: int, count: int, sampled: bool = False
) -> dict[str, Any]:
    """`count` jobs (fake agents `first`..) submitted at once; with `sampled`, get_status called on them
    until all are done."""
    from fastmcp import Client

    from conclave.app.server import create_app
    from conclave.jobs.service import JobService
    from conclave.settings import Settings
    from tests.fakes.team import write_team

    settings = Settings(home=root / f"state-{first}")  # the defaults, but for where state lives
    teams = [write_team(root / f"team-{job}.yaml", fakes, members(job))  # type: ignore[arg-type]
             for job in range(first, first + count)]
    service_ms: list[float] = []
    tool_ms: list[float] = []
    async with (
        JobService.open(settings, environ=ENV) as service,
        Client(create_app(service, settings)) as client,
    ):
        started, cpu = time.monotonic(), _cpu_s()
        ids = [(await service.submit(TASK, str(team))).job_id for team in teams]
        finished: dict[str, float] = {}

        async def finish(job_id: str) -> None:
            with anyio.fail_after(300):
                while not (await service.wait(job_id, 10)).done:
                    pass
            finished[job_id] = time.monotonic() - started

        async def sample() -> None:
            while len(finished) < len(ids):
                for job_id in ids:
                    if job_id in finished:
                        continue
                    begin = time.perf_counter()
                    await service.view(job_id)
                    service_ms.append((time.perf_counter() - begin) * 1000)
                    begin = time.perf_counter()
                    await client.call_tool("get_status", {"job_id": job_id})
                    tool_ms.append((time.perf_counter() - begin) * 1000)
                    await anyio.sleep(SAMPLE_GAP_S)

        async with anyio.create_task_group() as tg:
            for job_id in ids:
                tg.start_soon(finish, job_id)
            if sampled:
                tg.start_soon(sample)
        cpu = _cpu_s() - cpu
        views = [await service.view(job_id) for job_id in ids]
    bad = [view.job_id for view in views if view.state != "completed" or not view.result.consensus]
    if bad:
        raise SystemExit(f"jobs did not complete with consensus: {bad}")
    return {
        "wall_s": round(max(finished.values()), 3),
        "job_s_median": round(statistics.median(finished.values()), 3),
        "cpu_s": round(cpu, 2),
        "service_ms": service_ms,
        "tool_ms": tool_ms,
    }


def _cpu_s() -> float:
    """This process's CPU time: the machine is shared, so wall times move with the others' load."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def summary(samples: list[float]) -> dict[str, float]:
    return {"p50": round(percentile(samples, 0.5), 2), "p99": round(percentile(samples, 0.99), 2),
            "calls": len(samples)}


async def measure(jobs: int, port: int) -> dict[str, Any]:
    fakes = RemoteFakes(port)
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        await run_jobs(Path(tmp), fakes, 0, 1)  # a warm-up: the SDKs' imports and first connections
        alone = await run_jobs(Path(tmp), fakes, 1, 1)
        together = await run_jobs(Path(tmp), fakes, 2, jobs)  # the wall time, with no one polling
        polled = await run_jobs(Path(tmp), fakes, 2 + jobs, jobs, sampled=True)
    return {
        "one_job_s": alone["wall_s"],
        "jobs": jobs,
        "all_jobs_s": together["wall_s"],
        "job_s_median": together["job_s_median"],
        "cpu_s_all_jobs": together["cpu_s"],
        "max_jobs": int(os.environ.get("CONCLAVE_MAX_JOBS", "0")) or "default",
        "all_over_one": round(together["wall_s"] / alone["wall_s"], 2),
        "get_status_view_ms": summary(polled["service_ms"]),
        "get_status_tool_ms": summary(polled["tool_ms"]),
        "all_jobs_polled_s": polled["wall_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--label", default="after", help="e.g. before / after")
    parser.add_argument("--commit", default="", help="what was measured, for the record")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--serve-fakes", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fakes is not None:
        serve_fakes(args.serve_fakes)
        return
    child = subprocess.Popen([sys.executable, __file__, "--serve-fakes", str(2 * args.jobs + 2)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        result = anyio.run(measure, args.jobs, port)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)
    view, tool = result["get_status_view_ms"], result["get_status_tool_ms"]
    print(f"{args.label}: one job {result['one_job_s']} s; {args.jobs} at once {result['all_jobs_s']} s "
          f"(x{result['all_over_one']}); get_status p50/p99 {view['p50']}/{view['p99']} ms (service), "
          f"{tool['p50']}/{tool['p99']} ms (MCP tool)")
    data = json.loads(args.out.read_text()) if args.out.exists() else {}
    data.setdefault("runs", {})[args.label] = {
        **result, "commit": args.commit, "python": platform.python_version(),
        "machine": f"{platform.machine()}, 2 cores (shared with other engineers' test runs)"}
    runs = data["runs"]
    if "before" in runs and "after" in runs:
        data["after_over_before"] = {
            "all_jobs_s": round(runs["after"]["all_jobs_s"] / runs["before"]["all_jobs_s"], 2),
            "get_status_view_p50": round(runs["after"]["get_status_view_ms"]["p50"]
                                         / runs["before"]["get_status_view_ms"]["p50"], 2),
            "get_status_view_p99": round(runs["after"]["get_status_view_ms"]["p99"]
                                         / runs["before"]["get_status_view_ms"]["p99"], 2),
        }
    args.out.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
