"""What each turn design costs a team, on the fake providers: calls, tokens and wall time per job.

    python bench/bench_turns.py

A frontier model cannot be called here, so this measures only what the fakes can tell: the `single`
turn (one call ends with a native tool call, or a JSON decision) against the `split` turn (a plain
answer call, then a separate choice call) on the same scripted three-agent job, with a fixed latency
per reply standing in for a provider's. Answer quality is measured by bench/quality.py, with models.
Writes bench/results/turns.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' fakes

from conclave.backends.retry import RetryPolicy
from conclave.config.models import Team
from conclave.coordination.members import endpoint_factory
from conclave.coordination.orchestrator import Orchestrator, Shared
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, install, team_data, voter
from tests.test_orchestrator import MemorySink

RESULTS = Path(__file__).parent / "results" / "turns.json"
LATENCY_S, JOBS = 0.3, 3
DESIGNS = {
    "single, native tools": {"turn": "single", "tool_mode": "native"},
    "single, json": {"turn": "single", "tool_mode": "json"},
    "split": {"turn": "split", "tool_mode": "native"},
}


async def measure(options: dict[str, str]) -> dict[str, Any]:
    totals = {"requests": 0, "input_tokens": 0, "output_tokens": 0, "wall_s": 0.0}
    for job in range(JOBS):
        with FakeProviders() as fakes:
            install(
                fakes.script,
                TRIO,
                voter(answer=lambda request: "Paris is the capital of France.", delay=LATENCY_S),
            )
            team = Team.model_validate(team_data(fakes, TRIO, coordination={"final": "reuse"}, **options))
            sink = MemorySink()
            started = time.perf_counter()
            result = await Orchestrator(
                f"cj-00000000b{job:03d}",
                "What is the capital of France?",
                team,
                sink,
                Shared(endpoint_factory({KEY_ENV: "bench-key-0123456789"}), RetryPolicy(max_attempts=2)),
            ).run()
            totals["wall_s"] += time.perf_counter() - started
            assert result.consensus, result
            totals["requests"] += len(fakes.script.requests)
            for agent in sink.progress[-1].agents:
                totals["input_tokens"] += agent.usage.input_tokens
                totals["output_tokens"] += agent.usage.output_tokens
    return {key: round(value / JOBS, 2) for key, value in totals.items()}


async def main() -> None:
    rows = {name: await measure(options) for name, options in DESIGNS.items()}
    result = {
        "latency_per_reply_s": LATENCY_S,
        "jobs_each": JOBS,
        "per_job": rows,
        "note": "fake providers with a scripted voter: cost only; quality needs real models",
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'design':<22} {'requests':>9} {'tokens in':>10} {'tokens out':>11} {'seconds':>8}")
    for name, row in rows.items():
        print(
            f"{name:<22} {row['requests']:>9} {row['input_tokens']:>10} "
            f"{row['output_tokens']:>11} {row['wall_s']:>8}"
        )


if __name__ == "__main__":
    anyio.run(main)
