"""Benchmark (not a test): workspace copies, snapshots and diffs on a 5,000-file tree with 10 changed files.

    python bench/bench_workspace.py [--files 5000] [--changed 10] [--repeat 3]

Prints a table and writes bench/results/workspace.json. Each step is timed `--repeat` times on fresh
trees and the median is reported. "snapshot (full copy)" is the naive `shutil.copytree(copy2)` baseline
that the incremental snapshot (hard links for unchanged files) replaces.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio

from conclave.files.contexts import ContextPath
from conclave.files.job_folder import JobFolder
from conclave.files.workspaces import Workspaces

RESULTS = Path(__file__).parent / "results" / "workspace.json"
OLD = time.time() - 3600


def build_tree(root: Path, files: int) -> list[str]:
    """A source-like tree: `files` files of 1-6 KB in nested folders, plus an ignored build/ folder."""
    names = []
    for i in range(files - 1):
        rel = f"pkg{i % 20}/mod{i % 12}/file{i}.py"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"def f{i}_{n}(x):\n    return x + {n}\n" for n in range(30 + i % 120)))
        os.utime(path, (OLD, OLD))
        names.append(rel)
    (root / ".gitignore").write_text("build/\n*.pyc\n")
    (root / "build").mkdir()
    for i in range(200):
        (root / "build" / f"out{i}.o").write_bytes(b"\0" * 100)
    return names


def timed(step: Callable[[], object]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def one_run(work: Path, files: int, changed: int) -> dict[str, float]:
    source = work / "source"
    names = build_tree(source, files)
    spaces = Workspaces(JobFolder(work, "job"))
    contexts = [ContextPath(path=str(source), permission="write")]
    out = {}
    out["copy_context"] = timed(lambda: anyio.run(spaces.prepare, contexts))
    out["create_agent_copy"] = timed(lambda: anyio.run(spaces.create, ["A"]))
    agent = spaces.agent("A") / "source"
    for rel in names[:: max(1, len(names) // changed)][:changed]:
        with open(agent / rel, "a") as handle:
            handle.write("# changed by agent A\n")
    out["snapshot"] = timed(lambda: anyio.run(spaces.snapshot, "A", "A1"))
    naive = work / "naive"
    out["snapshot_full_copy"] = timed(lambda: shutil.copytree(agent, naive, copy_function=shutil.copy2))
    out["finalize"] = timed(lambda: anyio.run(spaces.finalize, "A1"))
    patches: dict = {}
    out["diff"] = timed(lambda: patches.update(anyio.run(spaces.diffs)))
    assert len(patches["source"].files) == changed, patches["source"].files
    out["apply"] = timed(lambda: anyio.run(spaces.apply, "source"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--changed", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    runs = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="conclave-bench-") as work:
            runs.append(one_run(Path(work), args.files, args.changed))
    medians = {step: statistics.median(run[step] for run in runs) for step in runs[0]}
    print(f"{args.files:,} files, {args.changed} changed, median of {args.repeat} runs")
    print(f"{'step':<22}{'seconds':>10}")
    for step, seconds in medians.items():
        print(f"{step:<22}{seconds:>10.3f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "files": args.files,
                "changed": args.changed,
                "repeat": args.repeat,
                "median_s": {step: round(seconds, 4) for step, seconds in medians.items()},
                "runs_s": [{step: round(seconds, 4) for step, seconds in run.items()} for run in runs],
                "machine": {
                    "python": platform.python_version(),
                    "system": platform.platform(),
                    "cpus": os.cpu_count(),
                },
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
