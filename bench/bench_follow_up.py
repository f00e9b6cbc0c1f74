"""What a follow-up costs in tokens against a fresh job.

On the follow-up scenario of tests/test_follow_ups.py: the fake providers through the real SDKs
(their usage is derived from the request and reply sizes), a three-agent team editing calc.py in a
project folder, no Docker.

    python bench/bench_follow_up.py

Per run: a first job; then the same new message ("the tests still fail: ...") sent two ways, as a
follow-up of the first job (the team sees the history, its files start from the earlier answer) and as
a fresh job whose task repeats the original task with the message (what a caller without follow-ups
sends). Reported: tokens in and out, model calls, and the ratio follow-up / fresh. Writes
bench/results/follow-up.json.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' fakes and scripts

from bench.results_file import in_fresh_folders, write_results
from bench.submitting import open_service
from conclave.jobs.read.views import JobView
from conclave.jobs.request import JobRequest
from conclave.settings import Settings
from tests.fakes.calc_task import CALC, TASK, TESTS
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_DESTINATION, TRIO, write_team
from tests.test_follow_ups import ENV, FAST, fixer

RESULTS = Path(__file__).parent / "results" / "follow-up.json"
RUNS = 3
MESSAGE = "The tests still fail:\nFAILED test_calc.py::test_add - assert 6 == 5\n1 failed in 0.02s"


def usage(view: JobView) -> dict[str, int]:
    return {
        "input_tokens": view.usage.input_tokens,
        "output_tokens": view.usage.output_tokens,
        "tokens": view.usage.tokens,
        "calls": view.usage.calls,
    }


async def one_run(root: Path) -> dict[str, Any]:
    project = root / "proj"
    project.mkdir()
    (project / "calc.py").write_text(CALC)
    (project / "test_calc.py").write_text(TESTS)
    with FakeProviders() as fakes:
        for _, agent in TRIO:
            fakes.script.set_default(agent, fixer)
        team = str(write_team(root / "team.yaml", fakes, TRIO, coordination={"final": "reuse"}))
        settings = Settings(home=root / "state", gc_auto=False, key_destinations=(KEY_DESTINATION,))
        async with open_service(settings, ENV, FAST) as service:
            paths = [{"path": str(project), "permission": "write"}]
            first = await service.wait(
                (await service.submit(JobRequest(task=TASK, team=team, context_paths=paths))).job_id, 50
            )
            follow = await service.wait(
                (await service.submit(JobRequest(task=MESSAGE, team=None, follow_up=first.job_id))).job_id, 50
            )
            fresh = await service.wait(
                (
                    await service.submit(
                        JobRequest(task=f"{TASK}\n\n{MESSAGE}", team=team, context_paths=paths)
                    )
                ).job_id,
                50,
            )
    assert first.state == follow.state == fresh.state == "completed", (first.state, follow.state, fresh.state)
    return {
        "first": usage(first),
        "follow_up": usage(follow),
        "fresh": usage(fresh),
        "ratio_tokens": round(follow.usage.tokens / fresh.usage.tokens, 3),
    }


async def main() -> None:
    runs = await in_fresh_folders(one_run, RUNS)
    ratios = [run["ratio_tokens"] for run in runs]
    result = {
        "runs": RUNS,
        "ratio_follow_up_to_fresh_tokens": ratios,
        "mean_ratio": round(sum(ratios) / len(ratios), 3),
        "example": runs[0],
        "note": "the fakes derive usage from request and reply sizes (about 4 characters a token); the same "
        "scripted team answers both ways in the same number of turns, so the ratio is the price of "
        "the history the follow-up carries (earlier task, answer, verdict, files changed) in every "
        "prompt, against a fresh task that only repeats the original task",
    }
    write_results(RESULTS, result)


if __name__ == "__main__":
    anyio.run(main)
