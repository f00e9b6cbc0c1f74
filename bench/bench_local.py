"""Measure the bundled local model on this machine: server start, tokens per second, a `local` team job.

    python bench/bench_local.py            # start time and tokens/s (about a minute)
    python bench/bench_local.py --job      # also the wall time of one `local` team job
    python bench/bench_local.py --threads 1 2

Writes bench/results/local.json. Generation and prompt rates are llama.cpp's own timings, which its
server returns with each reply (`timings`; the server log's `eval time` lines before); `end_to_end_tok_s`
is completion tokens over the wall time of the HTTP call, which includes prompt processing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import openai

from conclave.backends import llama_server, local
from conclave.backends.llama_server import LocalServers, ServerOptions
from conclave.config.presets import resolve_team
from conclave.coordination.members import endpoint_factory
from conclave.coordination.orchestrator import Orchestrator, Shared
from conclave.coordination.reports import JobEvent, Progress

RESULTS = Path(__file__).parent / "results" / "local.json"
PROMPTS = [
    "Write a short story of about 200 words about a lighthouse keeper.",
    "Explain in about 150 words why the sky is blue.",
    "List ten uses of a paperclip, one sentence each.",
]
TASK = "What is the capital of France? Reply in one short sentence."
_RATE = re.compile(
    r"^\s*(?:llama_perf_context_print:\s*)?(prompt eval|eval) time\s*=.*?"
    r"\(\s*[\d.]+ ms per token,\s*([\d.]+) tokens per second\)"
)


def rates(log: list[str]) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {"prompt eval": [], "eval": []}
    for line in log:
        if match := _RATE.match(line):
            found[match.group(1)].append(float(match.group(2)))
    return found


async def measure(threads: int, rounds: int) -> dict[str, Any]:
    options = ServerOptions(local.model_file(local.BUNDLED, None), n_threads=threads)
    async with LocalServers() as pool:
        started = time.perf_counter()
        server = await pool.acquire(options)
        start_s = time.perf_counter() - started
        client = openai.AsyncOpenAI(
            base_url=server.base_url, api_key=server.api_key, max_retries=0, timeout=300
        )
        calls = []
        reported: dict[str, list[float]] = {"prompt eval": [], "eval": []}
        for index in range(rounds):
            prompt = PROMPTS[index % len(PROMPTS)]
            t0 = time.perf_counter()
            reply = await client.chat.completions.create(
                model="smollm2",
                messages=[{"role": "user", "content": prompt}],
                max_tokens=256,
                temperature=0.7,
                seed=index,
            )
            wall = time.perf_counter() - t0
            usage = reply.usage
            timings = (reply.model_extra or {}).get("timings") or {}
            for name, key in (("eval", "predicted_per_second"), ("prompt eval", "prompt_per_second")):
                if key in timings:
                    reported[name].append(float(timings[key]))
            calls.append(
                {
                    "prompt_tokens": usage.prompt_tokens,
                    "completion_tokens": usage.completion_tokens,
                    "wall_s": round(wall, 3),
                }
            )
        await client.close()
        found = {name: reported[name] or logged for name, logged in rates(list(server.log)).items()}
        await pool.release(server)
    tokens = sum(c["completion_tokens"] for c in calls)
    wall = sum(c["wall_s"] for c in calls)
    return {
        "n_threads": threads,
        "server_start_s": round(start_s, 2),
        "calls": calls,
        "end_to_end_tok_s": round(tokens / wall, 1),
        "eval_tok_s_median": round(statistics.median(found["eval"]), 1) if found["eval"] else None,
        "prompt_eval_tok_s_median": round(statistics.median(found["prompt eval"]), 1)
        if found["prompt eval"]
        else None,
    }


class _Sink:
    def __init__(self) -> None:
        self.kinds: list[str] = []
        self.timeline: list[str] = []

    async def record(self, event: JobEvent, progress: Progress) -> None:
        self.kinds.append(event.kind)
        if event.kind != "usage":
            self.timeline.append(f"{event.at:7.1f} {event.letter or '-'} {event.kind}")


async def job() -> dict[str, Any]:
    team = resolve_team("local", {})
    sink = _Sink()
    started = time.perf_counter()
    async with LocalServers() as pool:
        result = await Orchestrator(
            "cj-0000000bench", TASK, team, sink, Shared(endpoint_factory({}, pool))
        ).run()
    return {
        "task": TASK,
        "wall_s": round(time.perf_counter() - started, 1),
        "timeout_s": team.coordination.timeout_s,
        "consensus": result.consensus,
        "reason": result.reason,
        "answer": result.answer,
        "answers": sink.kinds.count("answer"),
        "votes": sink.kinds.count("vote"),
        "turns": sink.kinds.count("turn_started"),
        "cancelled_turns": sink.kinds.count("turn_cancelled"),
        "timeline": sink.timeline,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="*", default=[llama_server.default_threads()])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--job", action="store_true", help="also time one `local` team job")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "model": local.BUNDLED_FILE,
        "load_average_before": os.getloadavg(),
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "processor": platform.processor() or platform.machine(),
            "python": sys.version.split()[0],
        },
        "runs": [await measure(threads, args.rounds) for threads in args.threads],
    }
    if args.job:
        results["job"] = await job()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    anyio.run(main)
