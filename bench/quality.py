"""Does the team answer better than one call to its own models? Accuracy, tokens and time on a question set.

    python bench/quality.py                              # the `local` team, every question (about an hour
                                                         # on 2 busy cores: run it with nohup)
    python bench/quality.py --team frontier              # any preset or team file; keys from the environment
    python bench/quality.py --limit 10 --only member,sc  # a quick look

For each question of bench/questions.jsonl (short questions with unambiguous answers, checked by
normalised match: conclave.coordination.answers.matches) it runs, by mode:
- member: each agent of the team alone, one greedy call (temperature 0) with a plain prompt, its persona
  as the system prompt and the question as the user's message;
- sc: plain self-consistency on the first agent: 3 samples at temperature 0.7, the majority by
  normalised final answer (ties to the first sample);
- team: the team through the real JobService (what `ask_team` and `conclave ask` run), its final answer.
Writes bench/results/quality-<team>.json (with --limit: quality-<team>-limit<N>.json), merging the modes
of earlier runs on the same questions, and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio

from conclave.backends.base import Message, Request
from conclave.backends.local import LocalServers
from conclave.backends.retry import RetryPolicy, complete
from conclave.config import AgentSpec, Team, resolve_team
from conclave.coordination.answers import answer_key, matches
from conclave.coordination.orchestrator import endpoint_factory
from conclave.jobs.service import JobService
from conclave.settings import Settings

HERE = Path(__file__).parent
QUESTIONS = HERE / "questions.jsonl"
MODES = ("member", "sc", "team")
SC_SAMPLES, SC_TEMPERATURE = 3, 0.7


def load(path: Path, limit: int | None) -> list[dict[str, Any]]:
    questions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return questions[:limit] if limit else questions


def correct(answer: str | None, question: dict[str, Any]) -> bool:
    return bool(answer) and any(matches(answer or "", expected, question["question"]) for expected in question["answers"])


class Tally:
    """One mode's totals."""

    def __init__(self) -> None:
        self.correct = self.asked = self.input_tokens = self.output_tokens = 0
        self.wall_s = 0.0

    def add(self, ok: bool, input_tokens: int, output_tokens: int, wall_s: float) -> None:
        self.asked += 1
        self.correct += ok
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.wall_s += wall_s

    def row(self, label: str) -> dict[str, Any]:
        return {"mode": label, "correct": self.correct, "asked": self.asked,
                "accuracy": round(self.correct / self.asked, 3) if self.asked else None,
                "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "wall_s": round(self.wall_s, 1)}


async def ask(backend: Any, spec: AgentSpec, question: str, temperature: float, seed: int | None) -> tuple[str, Any, float]:
    request = Request(system=spec.system_prompt or "", messages=(Message("user", question),),
                      temperature=temperature, max_tokens=spec.max_tokens, seed=seed)
    started = time.perf_counter()
    completion = await complete(backend, request, RetryPolicy(max_attempts=spec.max_attempts))
    return completion.text.strip(), completion.usage, time.perf_counter() - started


async def members_and_sc(team: Team, questions: list[dict[str, Any]], modes: set[str], out: dict[str, Any]) -> None:
    async with LocalServers() as pool:
        make = endpoint_factory(os.environ, pool)
        backends = [make(spec) for spec in team.agents]
        try:
            for index, question in enumerate(questions):
                entry = out["per_question"].setdefault(str(question["id"]), {"question": question["question"]})
                if "member" in modes:
                    for number, (spec, backend) in enumerate(zip(team.agents, backends, strict=True)):
                        text, usage, wall = await ask(backend, spec, question["question"], 0.0, spec.seed)
                        label = f"member {number + 1}"
                        entry[label] = {"answer": text, "ok": correct(text, question)}
                        out["tallies"].setdefault(label, Tally()).add(
                            entry[label]["ok"], usage.input_tokens, usage.output_tokens, wall)
                if "sc" in modes:
                    spec, backend = team.agents[0], backends[0]
                    samples, tokens, wall = [], [0, 0], 0.0
                    for sample in range(SC_SAMPLES):
                        text, usage, took = await ask(backend, spec, question["question"], SC_TEMPERATURE,
                                                      (spec.seed or 0) + 100 + sample)
                        samples.append(text)
                        tokens[0], tokens[1], wall = tokens[0] + usage.input_tokens, tokens[1] + usage.output_tokens, wall + took
                    keys = [answer_key(text, question["question"]) for text in samples]
                    top = Counter(keys).most_common(1)[0][1]
                    chosen = samples[next(i for i, key in enumerate(keys) if keys.count(key) == top)]
                    entry["sc"] = {"answer": chosen, "ok": correct(chosen, question), "samples": samples}
                    out["tallies"].setdefault("sc", Tally()).add(entry["sc"]["ok"], *tokens, wall)
                print(f"[{index + 1}/{len(questions)}] {question['question']}", flush=True)
        finally:
            for backend in backends:
                await backend.aclose()


async def team_runs(team_name: str, questions: list[dict[str, Any]], out: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory(prefix="conclave-quality-") as home:
        async with JobService.open(Settings(home=Path(home)), environ=dict(os.environ)) as service:
            for index, question in enumerate(questions):
                started = time.perf_counter()
                view = await service.submit(question["question"], team_name)
                while not view.done:
                    view = await service.wait(view.job_id, 30)
                wall = time.perf_counter() - started
                ok = view.state == "completed" and correct(view.answer, question)
                entry = out["per_question"].setdefault(str(question["id"]), {"question": question["question"]})
                entry["team"] = {"answer": view.answer, "ok": ok, "state": view.state, "consensus": view.consensus,
                                 "majority": view.majority, "winner": view.winner, "reason": view.reason}
                out["tallies"].setdefault("team", Tally()).add(ok, view.usage.input_tokens, view.usage.output_tokens, wall)
                print(f"[{index + 1}/{len(questions)}] team {'ok ' if ok else 'BAD'} {wall:5.1f}s "
                      f"{question['question']} -> {(view.answer or '')[:70]!r}", flush=True)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'mode':<12} {'correct':>9} {'accuracy':>9} {'tokens in':>10} {'tokens out':>11} {'seconds':>8}"]
    for row in rows:
        lines.append(f"{row['mode']:<12} {row['correct']:>4}/{row['asked']:<4} {row['accuracy'] or 0:>9.3f} "
                     f"{row['input_tokens']:>10} {row['output_tokens']:>11} {row['wall_s']:>8.1f}")
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--team", default="local", help="a preset name or a team file (default: local)")
    parser.add_argument("--limit", type=int, help="only the first N questions")
    parser.add_argument("--only", default=",".join(MODES), help="modes to run, comma-separated: member,sc,team")
    parser.add_argument("--questions", type=Path, default=QUESTIONS)
    args = parser.parse_args()
    modes = {mode.strip() for mode in args.only.split(",") if mode.strip()}
    if not modes <= set(MODES):
        parser.error(f"--only takes {', '.join(MODES)}")
    team = resolve_team(args.team, os.environ)
    questions = load(args.questions, args.limit)
    suffix = f"-limit{args.limit}" if args.limit else ""
    path = HERE / "results" / f"quality-{team.name}{suffix}.json"
    earlier = json.loads(path.read_text()) if path.exists() else {}
    same = earlier.get("question_ids") == [q["id"] for q in questions]
    out: dict[str, Any] = {"per_question": earlier.get("per_question", {}) if same else {}, "tallies": {}}
    load_before = os.getloadavg()
    if modes & {"member", "sc"}:
        await members_and_sc(team, questions, modes, out)
    if "team" in modes:
        await team_runs(args.team, questions, out)
    rows = {row["mode"]: row for row in (earlier.get("rows", []) if same else [])}
    rows.update({label: tally.row(label) for label, tally in out["tallies"].items()})
    ordered = sorted(rows.values(), key=lambda row: ({"sc": 1, "team": 2}.get(row["mode"], 0), row["mode"]))
    result = {
        "team": team.name, "agents": [agent.model_dump(exclude_defaults=True) for agent in team.agents],
        "coordination": team.coordination.model_dump(), "questions": str(args.questions.name),
        "question_ids": [q["id"] for q in questions], "rows": ordered,
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "python": sys.version.split()[0], "load_average_before": load_before},
        "per_question": out["per_question"],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(table(ordered))
    print(f"wrote {path}")


if __name__ == "__main__":
    anyio.run(main)
