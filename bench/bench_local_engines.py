"""The `local` team on llama.cpp's prebuilt server (xllamacpp, this checkout) against llama-cpp-python (the
commit before the move), on the same questions, in one run: ratios of the server's start and the job's wall.

    python3 -m venv /tmp/llcpp && /tmp/llcpp/bin/pip install 'llama-cpp-python[server]>=0.3'  # compiles
    python bench/bench_local_engines.py --llcpp /tmp/llcpp --rounds 2

Each job runs in a child process on its own source tree (bench_checks._Tree): `before` is `--before`'s
tree exported by git, with llama-cpp-python taken from the `--llcpp` venv (appended to the child's path,
and put first on its server's, which is `python -c` of our own interpreter); `after` is this checkout.
The two sides alternate, question by question, so load on the shared machine falls on both alike. A job
is the `local` preset through the Orchestrator, as `conclave ask` runs it, with the server started
before it (start_s, timed apart) and held for it. Writes bench/results/local-engines.json.
"""

from __future__ import annotations

import argparse
import io
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
sys.path.insert(0, str(ROOT))

from bench.bench_checks import PACKAGES, _Tree  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "local-engines.json"
QUESTIONS = [
    "What is the capital of France? Answer in one sentence.",  # README command 1's question
    "What is 17 + 25?",
    "Which planet is closest to the Sun?",
    "How many legs does a spider have?",
]


# The child: one job on one tree ------------------------------------------------------------------------
async def one_job(question: str) -> dict[str, Any]:
    from conclave.backends import local
    from conclave.backends.llama_server import LocalServers, ServerOptions
    from conclave.config.presets import resolve_team
    from conclave.coordination.members import endpoint_factory
    from conclave.coordination.orchestrator import Orchestrator, Shared
    from conclave.coordination.reports import JobEvent, Progress, VoteEvent

    class Sink:
        def __init__(self) -> None:
            self.events: list[JobEvent] = []

        async def record(self, event: JobEvent, progress: Progress) -> None:
            self.events.append(event)

    team = resolve_team("local", {})
    sink = Sink()
    async with LocalServers() as pool:
        started = time.perf_counter()
        held = await pool.acquire(ServerOptions(local.model_file(local.BUNDLED, None)))
        start_s = time.perf_counter() - started
        started = time.perf_counter()
        result = await Orchestrator(
            "cj-00000engines", question, team, sink, Shared(endpoint_factory({}, pool))
        ).run()
        job_s = time.perf_counter() - started
        await pool.release(held)
    votes = [event.reason for event in sink.events if isinstance(event, VoteEvent)]
    usage = [event for event in sink.events if event.kind == "usage"]
    return {
        "start_s": round(start_s, 2),
        "job_s": round(job_s, 2),
        "answer": result.answer,
        "consensus": result.consensus,
        "answers": sum(1 for event in sink.events if event.kind == "answer"),
        "scored_votes": sum(1 for reason in votes if "log-probability" in reason),
        "votes": len(votes),
        "usage_events": len(usage),
    }


def child(question: str, tree: Path, llcpp: str) -> None:
    import anyio

    if tree != ROOT:  # the old engine: llama_cpp from its own venv, after ours here, first in the server's
        site = next(Path(llcpp, "lib").glob("python3*/site-packages"))
        sys.path.append(str(site))
        os.environ["PYTHONPATH"] = str(site)
    sys.meta_path.insert(0, _Tree(tree))
    print(json.dumps(anyio.run(one_job, question)))


# The parent: export the old tree, alternate the children, write the ratios ------------------------------
def run_child(question: str, tree: Path, llcpp: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", question, "--tree", str(tree), "--llcpp", llcpp],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    if done.returncode != 0:
        raise SystemExit(f"{question!r} on {tree} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def summary(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "jobs": len(jobs),
        "start_s_median": round(statistics.median(job["start_s"] for job in jobs), 2),
        "job_s_median": round(statistics.median(job["job_s"] for job in jobs), 2),
        "job_s_total": round(sum(job["job_s"] for job in jobs), 1),
        "scored_votes": sum(job["scored_votes"] for job in jobs),
        "votes": sum(job["votes"] for job in jobs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="334d809^", help="the commit with llama-cpp-python (default)")
    parser.add_argument("--llcpp", default="/tmp/llcpp", help="a venv with llama-cpp-python[server]")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child")
    parser.add_argument("--tree")
    args = parser.parse_args()
    if args.child:
        child(args.child, Path(args.tree), args.llcpp)
        return
    commit = subprocess.run(
        ["git", "rev-parse", "--short", args.before], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    load_before = os.getloadavg()
    jobs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "archive", args.before, *sorted(set(PACKAGES.values()))],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        for round_ in range(args.rounds):
            for question in QUESTIONS:
                sides = (("before", Path(tmp)), ("after", ROOT))
                for side, tree in sides if round_ % 2 == 0 else reversed(sides):
                    job = {"question": question, **run_child(question, tree, args.llcpp)}
                    jobs[side].append(job)
                    print(side, json.dumps(job), flush=True)
    before, after = summary(jobs["before"]), summary(jobs["after"])
    result = {
        "before": f"llama-cpp-python[server] at {args.before} ({commit})",
        "after": "xllamacpp (llama.cpp's own server, prebuilt wheel), this checkout",
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "cpus": len(os.sched_getaffinity(0)),
        "summary": {"before": before, "after": after},
        "ratios_after_to_before": {
            "server_start_median": round(after["start_s_median"] / before["start_s_median"], 3),
            "job_wall_median": round(after["job_s_median"] / before["job_s_median"], 3),
            "job_wall_total": round(after["job_s_total"] / before["job_s_total"], 3),
        },
        "jobs": jobs,
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "jobs"}, indent=2))


if __name__ == "__main__":
    main()
