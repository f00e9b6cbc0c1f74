"""The disk budget's overshoot during a command: how far past CONCLAVE_JOB_DISK_MB one command's writes get
before the watcher stops it (server/sandbox/disk_watch.py). Prints a table, writes JSON.

    python bench/bench_disk.py [--out FILE]   # default bench/results/disk.json

Scenarios, each against a 64 MB budget in a real container: one 600 MB write (held by `ulimit -f`),
200 files of 3 MB written as fast as `head` can, 2,000 files of 300 KB, and a writer that ignores SIGXFSZ
and keeps going with new files (dd with a loop). Also the cost: a warm `true` with and without a budget.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

from conclave.config.models import SandboxSpec
from conclave.files.disk_budget import MB
from conclave.sandbox.container import Sandbox
from conclave.sandbox.disk_watch import measure
from conclave.sandbox.engine import connect, engine_status

RESULTS = Path(__file__).parent / "results" / "disk.json"
LIMIT = 64 * MB
RUNS = 3
SCENARIOS = {
    "one_600mb_file": "head -c 600000000 /dev/zero > big.bin",
    "200_files_of_3mb": "i=0; while [ $i -lt 200 ]; do head -c 3000000 /dev/zero > f$i.bin; i=$((i+1)); done",
    "2000_files_of_300kb": "i=0; while [ $i -lt 2000 ]; do head -c 300000 /dev/zero > f$i.bin; "
    "i=$((i+1)); done",
    "parallel_4_writers": "for w in 1 2 3 4; do (i=0; while [ $i -lt 100 ]; do "
    "head -c 2000000 /dev/zero > w$w-$i.bin; i=$((i+1)); done) & done; wait",
}


async def scenario(client: object, command: str) -> dict[str, object]:
    overshoots, killed, seconds = [], 0, []
    for _ in range(RUNS):
        with tempfile.TemporaryDirectory() as tmp:
            workspace = Path(tmp)
            sandbox = Sandbox(client)
            try:
                await sandbox.start(workspace, {}, "cj-bench-disk", "A", SandboxSpec(memory="512m"))
                started = time.perf_counter()
                result = await sandbox.exec(command, timeout_s=120, max_bytes=LIMIT)
                seconds.append(time.perf_counter() - started)
                killed += any("disk budget" in note for note in result.notes)
                overshoots.append(max(measure(workspace) - LIMIT, 0) / MB)
            finally:
                await sandbox.stop()
    return {
        "overshoot_mb_max": round(max(overshoots), 1),
        "overshoot_mb_median": round(statistics.median(overshoots), 1),
        "overshoot_ratio_of_cap_max": round(max(overshoots) * MB / LIMIT, 3),
        "stopped_by_watcher": f"{killed}/{RUNS}",
        "command_s_median": round(statistics.median(seconds), 2),
    }


async def cost(client: object) -> dict[str, float]:
    samples: dict[str, list[float]] = {"without_budget": [], "with_budget": []}
    with tempfile.TemporaryDirectory() as tmp:
        sandbox = Sandbox(client)
        try:
            await sandbox.start(Path(tmp), {}, "cj-bench-disk", "A", SandboxSpec())
            await sandbox.exec("true", timeout_s=10)
            for _ in range(10):
                for key, room in (("without_budget", None), ("with_budget", LIMIT)):
                    started = time.perf_counter()
                    await sandbox.exec("true", timeout_s=10, max_bytes=room)
                    samples[key].append((time.perf_counter() - started) * 1000)
        finally:
            await sandbox.stop()
    return {f"exec_true_ms_p50_{key}": round(statistics.median(values), 1) for key, values in samples.items()}


async def main() -> None:
    client = connect()
    results = {name: await scenario(client, command) for name, command in SCENARIOS.items()}
    report = {
        "engine": engine_status().version,
        "machine": platform.machine(),
        "budget_mb": LIMIT // MB,
        "runs_per_scenario": RUNS,
        "load_average_1m_at_end": round(
            os.getloadavg()[0], 1
        ),  # this host is shared: overshoot grows with load
        "scenarios": results,
        **await cost(client),
        "before": "at b4dce12 nothing stopped a command during its run: "
        "tests/security/test_disk_budget.py measured 572 MiB (all 600 MB) written past the 64 MiB "
        "budget by each of its two attacks; the budget only "
        "refused host-side writes after the command",
    }
    print(f"{'scenario':<22} {'overshoot max MB':>17} {'median':>7} {'x cap':>6} {'stopped':>8}")
    for name, row in results.items():
        print(
            f"{name:<22} {row['overshoot_mb_max']:>17} {row['overshoot_mb_median']:>7} "
            f"{row['overshoot_ratio_of_cap_max']:>6} {row['stopped_by_watcher']:>8}"
        )
    out = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else RESULTS
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    anyio.run(main)
