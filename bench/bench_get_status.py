"""What one get_status costs on an idle server, before and after a change, measured in the same run.

    python bench/bench_get_status.py [--before REV] [--rounds 5] [--out bench/results/get-status.json]

bench/bench_store.py samples get_status while 16 jobs run on the server, so its figure is mostly the
wait for the event loop and the interpreter's lock, which the jobs hold; this one asks a finished job's
status on a server doing nothing else, so the figure is the call's own work: `JobLookup.view`, the
same through the MCP tool (FastMCP's client, in memory: the tool's result built and validated against
its output schema), and the tool's result alone (`tool_result(view)`, converted as FastMCP sends it).

Each round is a child process per side (the job: three fake agents through the real SDKs, as
bench/bench_store.py's), sides alternating which goes first; each figure is the median of the rounds'
medians. With `--before REV`, that commit's server is exported (`git archive`) and imported in its
child in place of this checkout's, with this checkout's fakes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, the tests' fakes

from bench.bench_store import checkout, use_source
from bench.results_file import write_results

RESULTS = Path(__file__).parent / "results" / "get-status.json"
VIEWS, TOOLS, RESULTS_ALONE = 1500, 400, 2000


def measure() -> dict[str, float]:
    """The child: one job run to its end, then its status asked again and again."""
    import anyio

    from bench import bench_store as store_bench
    from bench.submitting import open_service, submit
    from tests.fakes.server import FakeProviders
    from tests.fakes.team import write_team

    async def run() -> dict[str, float]:
        from fastmcp import Client

        from conclave.app.server import create_app
        from conclave.settings import Settings
        from conclave.tools._deps import tool_result

        with FakeProviders() as fakes, tempfile.TemporaryDirectory() as tmp:
            bobs: dict[int, str] = {}
            for _, agent in store_bench.members(0):
                fakes.script.set_default(agent, store_bench.responder(0, agent.rstrip("0123456789"), bobs))
            team = write_team(Path(tmp) / "team.yaml", fakes, store_bench.members(0))  # type: ignore[arg-type]
            settings = Settings(home=Path(tmp) / "state", key_destinations=(store_bench.KEY_DESTINATION,))
            async with (
                open_service(settings, store_bench.ENV) as service,
                Client(create_app(service, settings)) as client,
            ):
                await client.list_tools()
                job = (await submit(service, store_bench.TASK, str(team))).job_id
                while not (await service.wait(job, 10)).done:
                    pass
                view_ms, tool_ms, result_ms = [], [], []
                for _ in range(VIEWS):
                    began = time.perf_counter()
                    view = await service.lookup.view(job)
                    view_ms.append((time.perf_counter() - began) * 1000)
                for _ in range(TOOLS):
                    began = time.perf_counter()
                    await client.call_tool("get_status", {"job_id": job})
                    tool_ms.append((time.perf_counter() - began) * 1000)
                for _ in range(RESULTS_ALONE):
                    began = time.perf_counter()
                    tool_result(view).to_mcp_result()
                    result_ms.append((time.perf_counter() - began) * 1000)
        return {
            "view_ms": statistics.median(view_ms),
            "tool_ms": statistics.median(tool_ms),
            "tool_result_ms": statistics.median(result_ms),
        }

    return anyio.run(run)


def round_in_child(source: Path | None) -> dict[str, float]:
    command = [sys.executable, __file__, "--child"] + (["--source", str(source)] if source else [])
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="the commit to compare with, measured in the same run")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--source", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.source is not None:
            use_source(args.source)
        print(json.dumps(measure()))
        return
    here = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    sides: list[tuple[str, Path | None, str]] = [("after", None, f"{here} (this tree)")]
    if args.before:
        tree, short = checkout(args.before)
        sides.insert(0, ("before", tree, short))
    rounds: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in sides}
    for number in range(args.rounds):
        order = sides if number % 2 == 0 else sides[::-1]
        for label, tree, _ in order:
            result = round_in_child(tree)
            rounds[label].append(result)
            shown = ", ".join(f"{key} {value:.3f}" for key, value in result.items())
            print(f"round {number + 1} {label}: {shown}; load {os.getloadavg()[0]:.2f}", flush=True)
    runs = {
        label: {
            **{key: round(statistics.median(r[key] for r in rounds[label]), 3) for key in rounds[label][0]},
            "rounds": rounds[label],
            "commit": commit,
        }
        for label, _, commit in sides
    }
    data: dict[str, Any] = {"runs": runs, "machine": "x86_64, 2 cores", "python": sys.version.split()[0]}
    if "before" in runs:
        before, after = runs["before"], runs["after"]
        data["after_over_before"] = {
            key: round(after[key] / before[key], 2) for key in ("view_ms", "tool_ms", "tool_result_ms")
        }
    write_results(args.out, data)


if __name__ == "__main__":
    main()
