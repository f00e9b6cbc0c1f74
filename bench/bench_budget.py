"""A budget's stop and the usage it counts, on the budget scenario of tests/test_budgets.py: the fake
providers through the real SDKs, with a retried attempt cut after its input was billed, a stale turn
cancelled mid-stream and a call cancelled by the stop itself.

    python bench/bench_budget.py

For each run: the job's tokens against max_tokens, where it stopped, and per agent the usage Conclave
counted against what the fakes billed (the figures they sent, the moment they sent them). Writes
bench/results/budget.json.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' fakes and scripts

from bench.results_file import in_fresh_folders, write_results
from bench.submitting import open_service
from conclave.settings import Settings
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_DESTINATION, TRIO, write_team
from tests.test_budgets import BUDGET, ENV, FAST, budget_scenario, run_job

RESULTS = Path(__file__).parent / "results" / "budget.json"
RUNS = 5


async def one_run(root: Path) -> dict[str, Any]:
    with FakeProviders() as fakes:
        budget_scenario(fakes.script)
        team = str(write_team(root / "team.yaml", fakes, TRIO))
        async with open_service(
            Settings(home=root / "state", gc_auto=False, key_destinations=(KEY_DESTINATION,)), ENV, FAST
        ) as service:
            view = await run_job(service, team, max_tokens=BUDGET)
            kinds = [event.kind for event in await service.store.events(view.job_id)]
        agents = {}
        for agent in view.agents:
            name = agent.model.rsplit("-", 1)[1]
            counted = [agent.usage.input_tokens, agent.usage.output_tokens, agent.usage.cached_input_tokens]
            agents[name] = {
                "counted": counted,
                "billed": list(fakes.script.bill[name]),
                "requests": len(fakes.script.requests_of(name)),
                "attempts_counted": agent.usage.calls,
            }
    stop = kinds.index("budget_reached")
    return {
        "state": view.state,
        "reason": view.result.reason,
        "fallback": view.result.fallback,
        "winner_votes": view.result.votes,
        "tokens": view.usage.tokens,
        "max_tokens": BUDGET,
        "turns_cancelled": kinds.count("turn_cancelled"),
        "turns_started_after_stop": kinds[stop:].count("turn_started"),
        "agents": agents,
        "usage_equals_bill": all(a["counted"] == a["billed"] for a in agents.values()),
    }


async def main() -> None:
    runs = await in_fresh_folders(one_run, RUNS)
    result = {
        "runs": RUNS,
        "all_usage_equals_bill": all(run["usage_equals_bill"] for run in runs),
        "all_completed_with_budget_reason": all(
            run["state"] == "completed" and run["reason"].startswith("budget reached") for run in runs
        ),
        "example": runs[0],
        "tokens_per_run": [run["tokens"] for run in runs],
        "note": "OpenAI reports usage only at a stream's end (a call cut or cancelled before it counts "
        "nothing, and bills nothing here); Anthropic and Gemini report the input side first",
    }
    write_results(RESULTS, result)


if __name__ == "__main__":
    anyio.run(main)
