"""Benchmark (not a test): many jobs at once at the default settings, and get_status while they run.

    python bench/bench_store.py [--jobs 16] [--before REV] [--rounds 3] [--out bench/results/store.json]
    python bench/bench_store.py --databases [--jobs 16] [--rounds 3]    # SQLite against PostgreSQL

Each job is the scripted invalidation transcript of tests/test_orchestrator.py (three providers; ann
answers at once and votes, bob answers at 0.3 s, cy at 1.5 s, the critical path; bob revises after
seeing cy's answer, which clears the votes; everyone votes for bob's answer, bob presents), on the
fake providers through the real SDKs. The fakes run in a child process, as real providers are
elsewhere, so the event loop measured is the server's alone.

After a warm-up job (the SDKs' first imports take seconds here; get_status is called during it, so the
in-memory client imports its validator's modules then too), one job alone, then `--jobs` jobs
submitted at once; then the same again while get_status is called on
every running job in turn (the service's `view`, which the tool calls with wait_seconds=0, and the
real tool through an in-memory MCP client, which lists the tools once connected, as clients do) and
each call's latency is kept. The wall time of the jobs
together is taken in a run of its own, with no one polling (the polling is CPU of its own).
Reported: wall time of one job alone, of all the jobs together and the ratio, get_status p50/p99.

With `--databases`, the two sides are this tree on its SQLite file and on PostgreSQL (a throwaway
cluster of Debian's server, tests/postgres.py, with fsync on; a fresh schema per service), and each
round also measures the store alone: events written through the AsyncStore's writer (queued as
running jobs queue them, one event of each job per batch) and job rows read by 16 callers in its
reader threads, per second
(bench/results/store-postgres.json).

Before and after come from the same run: with `--before REV`, that commit's server (git archive, imported
in place of this tree's) and this tree's are measured in turns, `--rounds` times each, each round in a
fresh process, alternating which goes first; the medians are reported, with the load average around
each round (the machine is shared: a round under a load spike shows in it).
"""

from __future__ import annotations

import argparse
import contextlib
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

from bench.submitting import open_service, store_job, submit
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.team import KEY_DESTINATION, KEY_ENV, decide, is_presentation, own_letter, vote_labels

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


def database_url(postgres: Path | None) -> Any:
    """A fresh schema of the bench's PostgreSQL (its socket folder), or None for the SQLite file."""
    if postgres is None:
        return contextlib.nullcontext(None)
    from tests.postgres import Cluster

    return Cluster(postgres).schema()


async def run_jobs(
    root: Path,
    fakes: RemoteFakes,
    first: int,
    count: int,
    sampled: bool = False,
    postgres: Path | None = None,
) -> dict[str, Any]:
    """`count` jobs (fake agents `first`..) submitted at once; with `sampled`, get_status called on them
    until all are done. `postgres`: the store in a fresh schema of that cluster."""
    with database_url(postgres) as url:
        return await _run_jobs(root, fakes, first, count, sampled, url)


async def _run_jobs(
    root: Path, fakes: RemoteFakes, first: int, count: int, sampled: bool, url: Any
) -> dict[str, Any]:
    from fastmcp import Client

    from conclave.app.server import create_app
    from conclave.settings import Settings
    from tests.fakes.team import write_team

    settings = Settings(
        home=root / f"state-{first}", database_url=url, key_destinations=(KEY_DESTINATION,)
    )  # the defaults, but for the store
    teams = [
        write_team(root / f"team-{job}.yaml", fakes, members(job))  # type: ignore[arg-type]
        for job in range(first, first + count)
    ]
    service_ms: list[float] = []
    tool_ms: list[float] = []
    async with (
        open_service(settings, ENV) as service,
        Client(create_app(service, settings)) as client,
    ):
        await client.list_tools()  # as a client does once connected: the tools' schemas it validates with
        started, cpu = time.monotonic(), _cpu_s()
        ids = [(await submit(service, TASK, str(team))).job_id for team in teams]
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
                    await service.lookup.view(job_id)
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
        views = [await service.lookup.view(job_id) for job_id in ids]
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
    return {
        "p50": round(percentile(samples, 0.5), 2),
        "p99": round(percentile(samples, 0.99), 2),
        "calls": len(samples),
    }


STORE_EVENTS = 250  # per job, in the store-alone measure
STORE_READS = 4000


async def store_alone(root: Path, jobs: int, postgres: Path | None) -> dict[str, Any]:
    """Events written and job rows read per second through the AsyncStore, nothing else running."""
    from conclave.backends.base import Usage
    from conclave.coordination.reports import AgentProgress, Progress, UsageEvent
    from conclave.jobs.store.async_store import AsyncStore
    from conclave.jobs.store.sql import Store

    with database_url(postgres) as url:
        sync = Store(url if url is not None else root / "store-alone" / "conclave.db")
        ids = [f"cj-{index:012x}" for index in range(jobs)]
        for job_id in ids:
            store_job(sync, job_id, TASK)
        try:
            async with AsyncStore.open(sync) as store:
                begin = time.perf_counter()
                for turn in range(STORE_EVENTS):
                    for job_id in ids:
                        usage = Usage(calls=turn, input_tokens=100 * turn, output_tokens=10 * turn)
                        agents = [
                            AgentProgress(letter=letter, model="openai/m", state="working", usage=usage)
                            for letter in "ABC"
                        ]
                        event = UsageEvent(
                            letter="A", model="openai/m", charge=Usage(input_tokens=100), total=usage
                        )
                        await store.record(job_id, event, Progress(phase="working", agents=agents), None)
                    await store.write(None, lambda: None)  # a batch: each job's event of this turn
                written = time.perf_counter() - begin
                begin = time.perf_counter()
                async with anyio.create_task_group() as tg:
                    for reader in range(16):
                        tg.start_soon(_read_rows, store, ids, reader)
                read = time.perf_counter() - begin
        finally:
            sync.close()
    return {
        "events_per_s": round(jobs * STORE_EVENTS / written),
        "rows_read_per_s": round(STORE_READS / read),
    }


async def _read_rows(store: Any, ids: list[str], reader: int) -> None:
    for index in range(reader, STORE_READS, 16):
        assert await store.job(ids[index % len(ids)]) is not None


async def measure(jobs: int, port: int, postgres: Path | None = None) -> dict[str, Any]:
    fakes = RemoteFakes(port)
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        # a warm-up: the SDKs' imports and first connections, the MCP client's first validation (it imports
        # jsonschema then)
        await run_jobs(Path(tmp), fakes, 0, 1, sampled=True, postgres=postgres)
        alone = await run_jobs(Path(tmp), fakes, 1, 1, postgres=postgres)
        together = await run_jobs(Path(tmp), fakes, 2, jobs, postgres=postgres)  # no one polling
        polled = await run_jobs(Path(tmp), fakes, 2 + jobs, jobs, sampled=True, postgres=postgres)
        store = await store_alone(Path(tmp), jobs, postgres) if postgres is not None or ALONE else {}
    return {
        **store,
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


ALONE = "--databases" in sys.argv or "--store-alone" in sys.argv


def measure_here(jobs: int, postgres: Path | None = None) -> dict[str, Any]:
    """One round in this process: the fakes in a child, then `measure`."""
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve-fakes", str(2 * jobs + 2)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        load = os.getloadavg()
        result = anyio.run(measure, jobs, port, postgres)
        return {
            **result,
            "loadavg_before": [round(x, 2) for x in load],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        }
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)


def use_source(tree: Path) -> None:
    """Import `conclave` from `tree` (a checkout's root) instead of this one: a package folder of links,
    as .ci/mypy.sh builds, put first on the path (the editable install's finder comes after it)."""
    package = Path(tempfile.mkdtemp(prefix="bench-store-src-")) / "conclave"
    package.mkdir()
    for entry in (tree / "server").iterdir():
        (package / entry.name).symlink_to(entry)
    for name in ("tools", "configs", "skills"):
        (package / name).symlink_to(tree / name)
    sys.path.insert(0, str(package.parent))


def checkout(rev: str) -> tuple[Path, str]:
    """`rev`'s tree in a temporary folder (git archive), and its short hash."""
    root = Path(__file__).resolve().parents[1]
    short = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=root, check=True, capture_output=True, text=True
    ).stdout.strip()
    tree = Path(tempfile.mkdtemp(prefix=f"bench-store-{short}-"))
    archive = subprocess.run(
        ["git", "archive", rev, "server", "tools", "configs", "skills"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree, short


def round_in_child(jobs: int, source: Path | None, postgres: Path | None = None) -> dict[str, Any]:
    command = [sys.executable, __file__, "--round", "--jobs", str(jobs)]
    if source is not None:
        command += ["--source", str(source)]
    if postgres is not None:
        command += ["--postgres", str(postgres)]
    elif ALONE:
        command += ["--store-alone"]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def median(key: str, sub: str | None = None) -> float:
        return round(statistics.median(r[key][sub] if sub else r[key] for r in rounds), 3)

    alone = {key: median(key) for key in ("events_per_s", "rows_read_per_s") if key in rounds[0]}
    return {
        **alone,
        "one_job_s": median("one_job_s"),
        "all_jobs_s": median("all_jobs_s"),
        "all_over_one": median("all_over_one"),
        "cpu_s_all_jobs": median("cpu_s_all_jobs"),
        "get_status_view_ms": {
            "p50": median("get_status_view_ms", "p50"),
            "p99": median("get_status_view_ms", "p99"),
        },
        "get_status_tool_ms": {
            "p50": median("get_status_tool_ms", "p50"),
            "p99": median("get_status_tool_ms", "p99"),
        },
        "rounds": len(rounds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--before", help="the commit to compare with, measured in the same run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--serve-fakes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--round", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--source", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--databases", action="store_true", help="SQLite against PostgreSQL, this tree")
    parser.add_argument("--postgres", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--store-alone", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.databases:
        compare_databases(args)
        return
    if args.serve_fakes is not None:
        serve_fakes(args.serve_fakes)
        return
    if args.round:
        if args.source is not None:
            use_source(args.source)
        print(json.dumps(measure_here(args.jobs, args.postgres)))
        return
    root = Path(__file__).resolve().parents[1]
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=root, check=True, capture_output=True, text=True
    ).stdout.strip()
    sides: list[tuple[str, Path | None, str]] = [("after", None, f"{head} (this tree)")]
    if args.before:
        tree, short = checkout(args.before)
        sides.insert(0, ("before", tree, short))
    rounds: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in sides}
    for number in range(args.rounds):
        for label, source, _ in sides if number % 2 == 0 else sides[::-1]:
            result = round_in_child(args.jobs, source)
            rounds[label].append(result)
            view, tool = result["get_status_view_ms"], result["get_status_tool_ms"]
            print(
                f"round {number + 1} {label}: one job {result['one_job_s']} s; {args.jobs} at once "
                f"{result['all_jobs_s']} s (x{result['all_over_one']}); get_status p50/p99 {view['p50']}/"
                f"{view['p99']} ms (service), {tool['p50']}/{tool['p99']} ms (MCP tool); "
                f"load {result['loadavg_before'][0]}",
                flush=True,
            )
    data: dict[str, Any] = {"runs": {}, "rounds": rounds}
    for label, _, commit in sides:
        data["runs"][label] = {
            **medians(rounds[label]),
            "jobs": args.jobs,
            "commit": commit,
            "max_jobs": int(os.environ.get("CONCLAVE_MAX_JOBS", "0")) or "default",
            "python": platform.python_version(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            # the machine may be shared: its load, as each round began, says how much
            "loadavg_1m": sorted(r["loadavg_before"][0] for r in rounds[label]),
            "all_over_one_worst": max(r["all_over_one"] for r in rounds[label]),
            "get_status_tool_p99_worst": max(r["get_status_tool_ms"]["p99"] for r in rounds[label]),
        }
    if "before" in rounds:
        before, after = data["runs"]["before"], data["runs"]["after"]
        data["after_over_before"] = {
            "all_jobs_s": round(after["all_jobs_s"] / before["all_jobs_s"], 2),
            "all_over_one": round(after["all_over_one"] / before["all_over_one"], 2),
            "get_status_tool_p50": round(
                after["get_status_tool_ms"]["p50"] / before["get_status_tool_ms"]["p50"], 2
            ),
            "get_status_tool_p99": round(
                after["get_status_tool_ms"]["p99"] / before["get_status_tool_ms"]["p99"], 2
            ),
        }
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps({key: data[key] for key in ("runs", "after_over_before") if key in data}, indent=1))


def compare_databases(args: argparse.Namespace) -> None:
    """This tree on SQLite and on PostgreSQL, in alternating rounds; PostgreSQL over SQLite as ratios."""
    from tests.postgres import cluster

    out = args.out if args.out != RESULTS else RESULTS.with_name("store-postgres.json")
    root = Path(__file__).resolve().parents[1]
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=root, check=True, capture_output=True, text=True
    ).stdout.strip()
    rounds: dict[str, list[dict[str, Any]]] = {"sqlite": [], "postgres": []}
    with cluster(fsync=True) as running:
        sides: list[tuple[str, Path | None]] = [("sqlite", None), ("postgres", running.socket_dir)]
        for number in range(args.rounds):
            for label, postgres in sides if number % 2 == 0 else sides[::-1]:
                result = round_in_child(args.jobs, None, postgres)
                rounds[label].append(result)
                tool = result["get_status_tool_ms"]
                print(
                    f"round {number + 1} {label}: {result['events_per_s']} events/s,"
                    f" {result['rows_read_per_s']} rows/s; one job {result['one_job_s']} s;"
                    f" {args.jobs} at once {result['all_jobs_s']} s; get_status p50/p99"
                    f" {tool['p50']}/{tool['p99']} ms; load {result['loadavg_before'][0]}",
                    flush=True,
                )
    data: dict[str, Any] = {"commit": head, "runs": {}, "rounds": rounds}
    for label in rounds:
        data["runs"][label] = {
            **medians(rounds[label]),
            "jobs": args.jobs,
            "python": platform.python_version(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "loadavg_1m": sorted(r["loadavg_before"][0] for r in rounds[label]),
        }
    pg, lite = data["runs"]["postgres"], data["runs"]["sqlite"]
    data["postgres_over_sqlite"] = {
        "events_per_s": round(pg["events_per_s"] / lite["events_per_s"], 2),
        "rows_read_per_s": round(pg["rows_read_per_s"] / lite["rows_read_per_s"], 2),
        "all_jobs_s": round(pg["all_jobs_s"] / lite["all_jobs_s"], 2),
        "get_status_tool_p50": round(pg["get_status_tool_ms"]["p50"] / lite["get_status_tool_ms"]["p50"], 2),
        "get_status_tool_p99": round(pg["get_status_tool_ms"]["p99"] / lite["get_status_tool_ms"]["p99"], 2),
        "get_status_view_p50": round(pg["get_status_view_ms"]["p50"] / lite["get_status_view_ms"]["p50"], 2),
        "get_status_view_p99": round(pg["get_status_view_ms"]["p99"] / lite["get_status_view_ms"]["p99"], 2),
    }
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps({key: data[key] for key in ("runs", "postgres_over_sqlite")}, indent=1))


if __name__ == "__main__":
    main()
