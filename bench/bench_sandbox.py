"""Sandbox timings: container start, warm `docker exec` of `true`, and the image. Prints a table, writes JSON.

python bench/bench_sandbox.py        # builds the image first if it is missing (about a minute)
"""

from __future__ import annotations

import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/results_file.py

from bench.results_file import write_results
from conclave.config.models import SandboxSpec
from conclave.sandbox.container import Sandbox
from conclave.sandbox.engine import connect, engine_status
from conclave.sandbox.image import build_image

RESULTS = Path(__file__).parent / "results" / "sandbox.json"
STARTS, EXECS, FILES = 5, 20, 5000


async def measure() -> dict[str, object]:
    build = await build_image()
    client = connect()
    starts, execs, execs_big = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        small, big = Path(tmp, "small"), Path(tmp, "big")
        small.mkdir()
        for i in range(FILES):  # a 5,000-file workspace: what the root-only hand-over walk costs per exec
            (big / f"d{i % 50}").mkdir(parents=True, exist_ok=True)
            (big / f"d{i % 50}" / f"f{i}.txt").write_text(f"{i}\n")
        for _ in range(STARTS):
            sandbox = Sandbox(client)
            started = time.perf_counter()
            await sandbox.start(small, {}, "cj-bench", "A", SandboxSpec())
            starts.append(time.perf_counter() - started)
            await sandbox.stop()
        for workspace, samples in ((small, execs), (big, execs_big)):
            sandbox = Sandbox(client)
            try:
                await sandbox.start(workspace, {}, "cj-bench", "A", SandboxSpec())
                await sandbox.exec("true", timeout_s=10)  # warm
                for _ in range(EXECS):
                    started = time.perf_counter()
                    result = await sandbox.exec("true", timeout_s=10)
                    samples.append(time.perf_counter() - started)
                    assert result.exit_code == 0
            finally:
                await sandbox.stop()
    return {
        "engine": engine_status().version,
        "machine": platform.machine(),
        "image": build.tag,
        "image_mb": round(build.size_bytes / 1e6, 1),
        "image_built_now": build.built,
        "image_build_s": round(build.seconds, 1) if build.built else None,
        "container_start_s_median": round(statistics.median(starts), 3),
        "container_start_s_all": [round(s, 3) for s in starts],
        "exec_true_ms_p50": round(statistics.median(execs) * 1000, 1),
        "exec_true_ms_p90": round(statistics.quantiles(execs, n=10)[-1] * 1000, 1),
        f"exec_true_ms_p50_{FILES}_files": round(statistics.median(execs_big) * 1000, 1),
    }


def main() -> None:
    if not engine_status().available:
        raise SystemExit(f"no Docker engine: {engine_status().error}")
    results = anyio.run(measure)
    write_results(RESULTS, results, table=True)


if __name__ == "__main__":
    main()
