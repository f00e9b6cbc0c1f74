"""The sandbox's costs on each engine this machine has: bench_sandbox.py's measures (container start,
warm exec of `true`, the same with a 5,000-file workspace) on the local Docker engine and on Podman
through its API socket (the lane's, .ci/test-env.sh), with Podman's figures as ratios to Docker's.

python bench/bench_engines.py [--podman unix:///tmp/podman-lane/podman.sock]

Times on a machine shared with other work are noisy: compare ratios from one run, not across runs.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/results_file.py

from bench.bench_sandbox import measure
from bench.results_file import write_results
from conclave.sandbox.engine import connect, engine_facts

RESULTS = Path(__file__).parent / "results" / "engines.json"
COMPARED = ("container_start_s_median", "exec_true_ms_p50", "exec_true_ms_p90", "exec_true_ms_p50_5000_files")


def on(host: str | None) -> dict[str, object]:
    """bench_sandbox's measures against `host` (None: the engine chosen as usual)."""
    if host is None:
        os.environ.pop("DOCKER_HOST", None)
    else:
        os.environ["DOCKER_HOST"] = host
    facts = engine_facts(connect())
    return {**anyio.run(measure), "engine": f"{facts.name} {facts.version}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--podman", default="unix:///tmp/podman-lane/podman.sock")
    args = parser.parse_args()
    docker, podman = on(None), on(args.podman)
    ratios = {
        key: round(float(podman[key]) / float(docker[key]), 2)  # type: ignore[arg-type]
        for key in COMPARED
    }
    result = {
        "date": datetime.date.today().isoformat(),
        "note": "one run on a 2-core machine shared with other engineers' tests: noisy",
        "docker": docker,
        "podman": podman,
        "podman_over_docker": ratios,
    }
    write_results(RESULTS, result)


if __name__ == "__main__":
    main()
