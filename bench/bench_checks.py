"""What checks and commands cost, before and after a change, measured in the same run.

    python bench/bench_checks.py [--before REF] [--rounds N] [--out FILE]  # REF: the code to compare with

The code at REF is exported (`git archive`) to a temporary folder, and each measurement runs in a child
process, on that code and on this checkout's, alternately (`--rounds` times each, which goes first
alternating too, each figure the median over the rounds), so the machine's load hits both alike.
Measured, against the real Docker engine and the fake providers through the real SDKs:
- `run_command`: a warm container's `exec("true")`, p50 and p90 (sandbox/container.py), beside one bare
  engine exec of `true` (create, start, inspect: the floor any command pays);
- a check's cost beyond its command: `Verifier.run` of `true` on an answer's snapshot, wall time (the
  command itself takes nothing), the job's warm container started ahead as the orchestrator does;
- the same for a job's first check when its answer comes at once: a fresh Verifier per sample, its
  `warm` started and the check run at the same moment, on a server whose check pool (where the code has
  one: coordination/check_pool.py) was filled before the job, as a running server's is; with one check
  at a time on the server, and with two (the default), where the job warms two containers; where the
  code keeps the caller's files' run across jobs (coordination/baselines.py), the server's kept runs are
  passed too, and `first_sample_ms` is the first job, on files new to the server;
- beside these two wall times, the process's CPU time over the same span (all its threads; the engine's
  and the container's are not in it), which the machine's load moves far less;
- the end-to-end job of tests/test_verify.py (three agents fix calc.py and vote, bench/bench_verify.py)
  with and without `verify`: model requests and tokens, their ratios with/without, and per answer the
  check's overhead from the job's events (check_started to checked, less the command's duration), over
  the three jobs on one server (each job's project a new folder with the same files) and for the first.
Writes bench/results/checks.json.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "checks.json"
PACKAGES = {
    "conclave": "server",
    "conclave.configs": "configs",
    "conclave.skills": "skills",
    "conclave.tools": "tools",
}
EXECS, CHECKS, FIRSTS, JOBS = 30, 12, 8, 3
# checks at once on the server (CONCLAVE_VERIFY_CONCURRENCY, 2 by default; the pool and the containers a
# job warms follow it): at 1 a job's first check and the caller's files' run share one container in turn
FIRST_CONCURRENCY = (1, 2)
LATENCIES = (0.0, 1.0)


class _Tree(importlib.abc.MetaPathFinder):
    """Imports `conclave` from the given source tree, ahead of the installed (editable) one."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in PACKAGES:
            return None
        folder = self.root / PACKAGES[fullname]
        return importlib.util.spec_from_file_location(
            fullname, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )


def job_folder(root: Path, job_id: str) -> Any:
    """What the tree's `Workspaces` takes for job `job_id` under `root`: its `JobFolder`, or in code from
    before files/job_folder.py the folder's path."""
    try:
        from conclave.files.job_folder import JobFolder
    except ImportError:
        return root / job_id
    return JobFolder(root, job_id)


# The child: one measurement on one tree --------------------------------------------------------------
async def run_command() -> dict[str, float]:
    import anyio.to_thread

    from conclave.config.models import SandboxSpec
    from conclave.sandbox.container import Sandbox
    from conclave.sandbox.engine import connect

    samples, floor = [], []
    with tempfile.TemporaryDirectory() as tmp:
        sandbox = Sandbox(connect())
        try:
            await sandbox.start(Path(tmp), {}, "cj-bench", "A", SandboxSpec())
            await sandbox.exec("true", timeout_s=10)
            api, user = sandbox._client.api, f"{sandbox.uid}:{sandbox.gid}"

            def bare() -> None:  # one engine exec of `true` and nothing else: what any command costs
                exec_id = api.exec_create(sandbox.container.id, ["true"], user=user)
                api.exec_start(exec_id["Id"])
                api.exec_inspect(exec_id["Id"])

            for _ in range(EXECS):  # alternately, so the load hits both alike
                started = time.perf_counter()
                assert (await sandbox.exec("true", timeout_s=10)).exit_code == 0
                samples.append(time.perf_counter() - started)
                started = time.perf_counter()
                await anyio.to_thread.run_sync(bare)
                floor.append(time.perf_counter() - started)
        finally:
            await sandbox.stop()
    return {
        "p50_ms": round(statistics.median(samples) * 1000, 1),
        "p90_ms": round(statistics.quantiles(samples, n=10)[-1] * 1000, 1),
        "bare_engine_exec_p50_ms": round(statistics.median(floor) * 1000, 1),
    }


async def check_cost() -> dict[str, float]:
    import anyio

    from conclave.config.models import SandboxSpec
    from conclave.coordination.verification import Verifier
    from conclave.files.contexts import ContextPath
    from conclave.files.workspaces import Workspaces
    from conclave.sandbox.container import container_user

    samples, cpus = [], []
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp, "proj")
        project.mkdir()
        for i in range(20):
            (project / f"m{i}.py").write_text(f"X = {i}\n")
        (project / "test_m.py").write_text("def test_x():\n    assert True\n")
        workspaces = Workspaces(job_folder(Path(tmp), "job"), agent_owner=container_user())
        await workspaces.prepare([ContextPath(path=str(project))])
        await workspaces.create(["A"])
        await workspaces.snapshot("A", "A1")
        verifier = Verifier(
            "cj-bench",
            "true",
            workspaces,
            SandboxSpec(),
            timeout_s=30,
            limiter=anyio.CapacityLimiter(1),
            **kept_runs(Path(tmp, "home")),
        )
        try:
            if hasattr(verifier, "warm"):  # as the orchestrator does beside the first turns
                await verifier.warm()
            for _ in range(CHECKS):
                started, cpu = time.perf_counter(), time.process_time()
                run = await verifier.run("A1")
                samples.append(time.perf_counter() - started)
                cpus.append(time.process_time() - cpu)
                assert run.check.passed, run.output
        finally:
            if hasattr(verifier, "close"):
                await verifier.close()
    return {
        "p50_ms": round(statistics.median(samples) * 1000, 1),
        "p90_ms": round(statistics.quantiles(samples, n=10)[-1] * 1000, 1),
        "cpu_p50_ms": round(statistics.median(cpus) * 1000, 2),
    }


async def first_check(concurrency: int) -> dict[str, float]:
    import anyio
    import anyio.to_thread

    from conclave.config.models import SandboxSpec
    from conclave.coordination.verification import Verifier
    from conclave.files.contexts import ContextPath
    from conclave.files.workspaces import Workspaces
    from conclave.sandbox.container import container_user

    try:
        from conclave.coordination.check_pool import CheckPool
    except ImportError:
        CheckPool = None  # the code before has no pool
    samples, cpus = [], []
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp, "proj")
        project.mkdir()
        for i in range(20):
            (project / f"m{i}.py").write_text(f"X = {i}\n")
        async with anyio.create_task_group() as tg:
            pool = None
            if CheckPool is not None:
                pool = CheckPool(Path(tmp, "home"), container_user(), concurrency)
                tg.start_soon(pool.keep, SandboxSpec())
            for n in range(FIRSTS):
                with anyio.fail_after(60):  # a running server's pool is filled between jobs
                    while pool is not None and pool.ready(SandboxSpec()) < concurrency:
                        await anyio.sleep(0.02)
                workspaces = Workspaces(job_folder(Path(tmp), f"job{n}"), agent_owner=container_user())
                await workspaces.prepare([ContextPath(path=str(project))])
                await workspaces.create(["A"])
                await workspaces.snapshot("A", "A1")
                extra: dict[str, Any] = {"pool": pool} if pool is not None else {}
                extra.update(kept_runs(Path(tmp, "home")))  # the server's, the first sample's kept
                verifier = Verifier(
                    f"cj-bench{n}",
                    "true",
                    workspaces,
                    SandboxSpec(),
                    timeout_s=30,
                    limiter=anyio.CapacityLimiter(concurrency),
                    **extra,
                )
                try:
                    async with anyio.create_task_group() as job:
                        # as the orchestrator does at the job's start for a team of `concurrency` or more
                        job.start_soon(verifier.warm, concurrency)
                        started, cpu = time.perf_counter(), time.process_time()
                        run = await verifier.run("A1")  # an answer that came at once
                        samples.append(time.perf_counter() - started)
                        cpus.append(time.process_time() - cpu)  # with the warming beside it
                        assert run.check.passed, run.output
                finally:
                    await verifier.close()
            tg.cancel_scope.cancel()
    return {
        "p50_ms": round(statistics.median(samples) * 1000, 1),
        "p90_ms": round(statistics.quantiles(samples, n=10)[-1] * 1000, 1),
        "first_sample_ms": round(samples[0] * 1000, 1),  # new files: the caller's files' run is made
        "cpu_p50_ms": round(statistics.median(cpus) * 1000, 2),
    }


def kept_runs(home: Path) -> dict[str, Any]:
    """The Verifier's argument for the server's kept runs of the caller's files (coordination/baselines.py),
    where the code has them."""
    try:
        from conclave.coordination.baselines import FOLDER, KeptBaselines
    except ImportError:
        return {}
    return {"kept": KeptBaselines(home / FOLDER)}


async def jobs(latency: float) -> dict[str, Any]:
    from bench.bench_verify import one_job
    from tests.fakes.calc_task import CHECK

    rows: dict[str, list[dict[str, Any]]] = {"without": [], "with": []}
    overheads: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(JOBS):  # one server home: the first job's files are new to it, the others' not
            rows["without"].append(await one_job(Path(tmp), latency, None))
            job = await one_job(Path(tmp), latency, CHECK, concurrency=3)
            rows["with"].append(job)
            overheads += job["overheads_s"]
    result: dict[str, Any] = {
        name: {key: statistics.median(job[key] for job in runs) for key in ("requests", "tokens", "wall_s")}
        for name, runs in rows.items()
    }
    result["check_overhead_per_answer_ms_p50"] = round(statistics.median(overheads) * 1000, 1)
    first = rows["with"][0]["overheads_s"]
    result["check_overhead_per_answer_first_job_ms_p50"] = round(statistics.median(first) * 1000, 1)
    result["winner_passed"] = all(job["winner_passed"] for job in rows["with"])
    return result


def child(part: str, tree: Path) -> None:
    import anyio

    sys.meta_path.insert(0, _Tree(tree))
    sys.path.insert(0, str(ROOT))  # this checkout's bench and tests (the fakes, the job's script) for both
    found = {"run_command": run_command, "check_cost": check_cost}
    if part.startswith("jobs:"):
        result = anyio.run(jobs, float(part.split(":", 1)[1]))
    elif part.startswith("first_check:"):
        result = anyio.run(first_check, int(part.split(":", 1)[1]))
    else:
        result = anyio.run(found[part])
    print(json.dumps(result))


# The parent: export the old tree, alternate the children, write the ratios --------------------------
def merged(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of one measurement as one: each number the median over the rounds, a flag true if in all."""
    result: dict[str, Any] = {}
    for key, first in runs[0].items():
        values = [run[key] for run in runs]
        if isinstance(first, dict):
            result[key] = merged(values)
        elif isinstance(first, bool):
            result[key] = all(values)
        elif isinstance(first, int | float):
            result[key] = round(statistics.median(values), 4)
        else:
            result[key] = first
    return result


def ratio(after: float, before: float) -> float:
    return round(after / before, 2) if before else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", default="main")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--child")
    parser.add_argument("--tree")
    args = parser.parse_args()
    if args.child:
        child(args.child, Path(args.tree))
        return
    sys.path.insert(0, str(ROOT))  # the parent imports no tree's conclave, only bench/
    from bench.child_run import run_child

    commit = subprocess.run(
        ["git", "rev-parse", "--short", args.before], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp)
        archive = subprocess.run(
            ["git", "archive", args.before, *sorted(set(PACKAGES.values())), "tests", "bench"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
            tar.extractall(old, filter="data")
        trees = {"before": old, "after": ROOT}
        parts = [
            "run_command",
            "check_cost",
            *(f"first_check:{n}" for n in FIRST_CONCURRENCY),
            *(f"jobs:{latency:g}" for latency in LATENCIES),
        ]
        load_before = os.getloadavg()
        found: dict[str, dict[str, Any]] = {}
        for part in parts:
            rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
            for number in range(args.rounds):
                for name in list(trees) if number % 2 == 0 else list(trees)[::-1]:
                    rounds[name].append(run_child(__file__, part, trees[name]))
                    print(part, name, rounds[name][-1], flush=True)
            found[part] = {name: merged(runs) for name, runs in rounds.items()}
    result: dict[str, Any] = {
        "before": f"{args.before} ({commit})",
        "after": "this branch",
        "run_command": {
            **found["run_command"],
            "p50_after_to_before": ratio(
                found["run_command"]["after"]["p50_ms"], found["run_command"]["before"]["p50_ms"]
            ),
        },
    }
    for name in ("before", "after"):  # the machine's load moves both; this ratio much less
        row = found["run_command"][name]
        row["p50_to_bare_engine_exec"] = ratio(row["p50_ms"], row["bare_engine_exec_p50_ms"])
    named = [("check_cost", "check_true")]
    named += [(f"first_check:{n}", f"first_check_at_once_concurrency_{n}") for n in FIRST_CONCURRENCY]
    for part, name in named:
        before, after = found[part]["before"], found[part]["after"]
        result[name] = {
            **found[part],
            "p50_after_to_before": ratio(after["p50_ms"], before["p50_ms"]),
            "cpu_p50_after_to_before": ratio(after["cpu_p50_ms"], before["cpu_p50_ms"]),
        }
    for latency in LATENCIES:
        part = found[f"jobs:{latency:g}"]
        summary = {}
        for name in ("before", "after"):
            row = part[name]
            summary[name] = {
                "requests_with_to_without": ratio(row["with"]["requests"], row["without"]["requests"]),
                "tokens_with_to_without": ratio(row["with"]["tokens"], row["without"]["tokens"]),
                "wall_with_to_without": ratio(row["with"]["wall_s"], row["without"]["wall_s"]),
                "check_overhead_per_answer_ms_p50": row["check_overhead_per_answer_ms_p50"],
                "check_overhead_per_answer_first_job_ms_p50": row[
                    "check_overhead_per_answer_first_job_ms_p50"
                ],
                "winner_passed": row["winner_passed"],
                "raw": {k: row[k] for k in ("with", "without")},
            }
        result[f"job_{latency:g}s_per_reply"] = summary
    load_after = os.getloadavg()
    result["load_average_1_5_15"] = {"at_start": load_before, "at_end": load_after}
    result["rounds"] = args.rounds
    result["note"] = (
        "before and after measured alternately in one run (each figure the median of its rounds) on a "
        "2-core machine shared with other work (load "
        "average above); check_true is Verifier.run of `true` in the job's warm container: everything a "
        "check costs beyond its command; first_check_at_once is the same for a job's first check run the "
        "moment its Verifier starts warming (the server's check pool filled before the job), with 1 and 2 "
        "checks at once on the server (CONCLAVE_VERIFY_CONCURRENCY, default 2); cpu_p50_ms is the "
        "bench process's CPU time (all its threads, not the engine's) over the same span: what the "
        "machine's load moves far less than wall time; "
        "check_overhead_per_answer is, in the end-to-end job, check_started to checked less the command's "
        "own duration (which includes the exec, or the runner's round trip)"
    )
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
