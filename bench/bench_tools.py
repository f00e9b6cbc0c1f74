"""Benchmark (not a test): one warm work-tool call (`read_file`, `write_file`, `edit_file`, `search`).

    python bench/bench_tools.py [--calls 200] [--label after] [--out bench/results/tools.json]

Each call goes through the agent's tool handler as a turn makes it (argument checks, the worker thread,
the path walk, the read or write), on a workspace of 200 files in nested folders, after 20 warm-up calls;
the median of `--calls` calls is reported in microseconds. Run it on two commits with different labels
and the same `--out` to record a before/after pair; the file keeps one entry per label and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from conclave.files.agent_tools import AgentTools

RESULTS = Path(__file__).parent / "results" / "tools.json"
WARMUP = 20
CALLS = {
    "read_file": {"path": "src/pkg3/mod1/file13.py"},
    "write_file": {"path": "src/pkg3/mod1/out.py", "content": "x = 1\n" * 200},
    "edit_file": {
        "path": "src/pkg3/mod1/file13.py",
        "old_text": "return x + 7",
        "new_text": "return x + 7",
        "replace_all": True,
    },
    "search": {"pattern": r"def f13_1\b", "path": "src/pkg3"},
}


def build_workspace(root: Path) -> None:
    for i in range(200):
        path = root / "src" / f"pkg{i % 10}" / f"mod{i % 3}" / f"file{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"def f{i}_{n}(x):\n    return x + {n}\n" for n in range(60)))


async def measure(tools: AgentTools, name: str, args: dict[str, Any], calls: int) -> list[float]:
    handler = tools.handlers()[name]
    for _ in range(WARMUP):
        await handler(dict(args))
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        result = await handler(dict(args))
        samples.append(time.perf_counter() - start)
        if result.startswith("Error:"):
            raise SystemExit(f"{name} failed: {result}")
    return samples


async def run(calls: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp) / "ws"
        build_workspace(workspace)
        owner = (os.getuid(), os.getgid())
        tools = AgentTools(workspace, peers=dict, owner=owner)
        return {
            name: statistics.median(await measure(tools, name, args, calls)) * 1e6
            for name, args in CALLS.items()
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--label", default="after", help="e.g. before / after")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    medians = anyio.run(run, args.calls)
    print(f"{'tool':<12} median of {args.calls} warm calls ({args.label})")
    for name, micros in medians.items():
        print(f"{name:<12} {micros:>9.0f} us")
    data = json.loads(args.out.read_text()) if args.out.exists() else {}
    data.setdefault("runs", {})[args.label] = {
        "median_us": {name: round(value, 1) for name, value in medians.items()},
        "calls": args.calls,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared with other test runs)",
    }
    runs = data["runs"]
    if "before" in runs and "after" in runs:
        before, after = runs["before"]["median_us"], runs["after"]["median_us"]
        data["after_over_before"] = {
            name: round(after[name] / before[name], 2) for name in after if name in before
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
