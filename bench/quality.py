"""Does the team answer better than one call to its own models, at equal cost? Accuracy, interval, tokens.

    python bench/quality.py --split test                 # the `local` team on the test split (report)
    python bench/quality.py --split dev                  # the dev split: tune personas, designs here only
    python bench/quality.py --team frontier --split test # any preset or team file; keys from the environment
    python bench/quality.py --split dev --limit 10 --only member,sc  # a quick look

Questions: bench/questions/heldout.jsonl (bench/make_questions.py; split into `dev` and `test` by a fixed
seed; none of bench/questions.jsonl, where the `local` personas were chosen). Answers are checked by
normalised match (conclave.coordination.answers.matches). Modes:
- team: the team through the real JobService (what `ask_team` and `conclave ask` run), its final answer;
- member: each agent of the team alone, one greedy call (temperature 0) with its persona as the system
  prompt and the question as the user's message;
- sc: self-consistency on the first agent, samples at temperature 0.7, the majority by normalised final
  answer (ties to the first sample): `sc@3`, and `sc@K (cost-matched)` with as many samples as the
  team's mean tokens per question buy (K from the team's and the samples' measured tokens).
Every row has its accuracy with a 95% Wilson interval, its tokens (input + output) per question and its
accuracy per 1k tokens; the team is compared with each baseline by an exact McNemar test on the same
questions. Writes bench/results/quality-<team>-<split>.json, keeping earlier runs' modes on the same
questions, and prints the table.
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

sys.path.insert(0, str(Path(__file__).parent))
from stats import mcnemar, wilson  # noqa: E402  (bench/ is not a package)

HERE = Path(__file__).parent
QUESTIONS = HERE / "questions" / "heldout.jsonl"
MODES = ("member", "sc", "team")
SC_SAMPLES, SC_TEMPERATURE, SC_MAX = 3, 0.7, 40


def load(path: Path, split: str, limit: int | None) -> list[dict[str, Any]]:
    questions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if split != "all":
        questions = [q for q in questions if q.get("split", "test") == split]
    return questions[:limit] if limit else questions


def correct(answer: str | None, question: dict[str, Any]) -> bool:
    return bool(answer) and any(matches(answer or "", expected, question["question"]) for expected in question["answers"])


async def ask(backend: Any, spec: AgentSpec, question: str, temperature: float, seed: int | None) -> dict[str, Any]:
    request = Request(system=spec.system_prompt or "", messages=(Message("user", question),),
                      temperature=temperature, max_tokens=spec.max_tokens, seed=seed)
    started = time.perf_counter()
    completion = await complete(backend, request, RetryPolicy(max_attempts=spec.max_attempts))
    return {"answer": completion.text.strip(), "in": completion.usage.input_tokens,
            "out": completion.usage.output_tokens, "s": round(time.perf_counter() - started, 3)}


def majority(samples: list[dict[str, Any]], question: str) -> str:
    """Self-consistency's pick: the most common normalised final answer, ties to the earliest sample."""
    keys = [answer_key(sample["answer"], question) for sample in samples]
    top = Counter(keys).most_common(1)[0][1]
    return str(samples[next(i for i, key in enumerate(keys) if keys.count(key) == top)]["answer"])


def matched_samples(entries: list[dict[str, Any]]) -> int | None:
    """How many self-consistency samples cost what the team costs per question (None before both ran)."""
    team = [e["team"] for e in entries if "team" in e]
    samples = [s for e in entries for s in e.get("sc_samples", [])[:SC_SAMPLES]]
    if not team or not samples:
        return None
    per_team = sum(t["in"] + t["out"] for t in team) / len(team)
    per_sample = sum(s["in"] + s["out"] for s in samples) / len(samples)
    return max(SC_SAMPLES, min(SC_MAX, round(per_team / max(per_sample, 1))))


async def members_and_sc(team: Team, questions: list[dict[str, Any]], modes: set[str], out: dict[str, Any]) -> None:
    async with LocalServers() as pool:
        make = endpoint_factory(os.environ, pool)
        backends = [make(spec) for spec in team.agents]
        try:
            entries = [out["per_question"].setdefault(str(q["id"]), {"question": q["question"]}) for q in questions]
            if "member" in modes:
                for index, (question, entry) in enumerate(zip(questions, entries, strict=True)):
                    for number, (spec, backend) in enumerate(zip(team.agents, backends, strict=True)):
                        entry[f"member {number + 1}"] = await ask(backend, spec, question["question"], 0.0, spec.seed)
                    print(f"[{index + 1}/{len(questions)}] members: {question['question']}", flush=True)
            if "sc" in modes:
                spec, backend = team.agents[0], backends[0]
                for want in (SC_SAMPLES, None):  # the 3-sample baseline first: it sets the cost-matched K
                    wanted = want or matched_samples(entries) or SC_SAMPLES
                    for index, (question, entry) in enumerate(zip(questions, entries, strict=True)):
                        samples = entry.setdefault("sc_samples", [])
                        while len(samples) < wanted:
                            seed = (spec.seed or 0) + 100 + len(samples)
                            samples.append(await ask(backend, spec, question["question"], SC_TEMPERATURE, seed))
                        print(f"[{index + 1}/{len(questions)}] sc@{wanted}: {question['question']}", flush=True)
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
                entry = out["per_question"].setdefault(str(question["id"]), {"question": question["question"]})
                ended = view.result  # None for a job cancelled or interrupted before it ended
                entry["team"] = {"answer": view.answer, "state": view.state,
                                 "consensus": ended.consensus if ended else None,
                                 "winner": ended.winner if ended else None, "reason": ended.reason if ended else None,
                                 "in": view.usage.input_tokens,
                                 "out": view.usage.output_tokens, "s": round(wall, 3)}
                ok = view.state == "completed" and correct(view.answer, question)
                print(f"[{index + 1}/{len(questions)}] team {'ok ' if ok else 'BAD'} {wall:5.1f}s "
                      f"{question['question']} -> {(view.answer or '')[:70]!r}", flush=True)


def outcomes(questions: list[dict[str, Any]], per_question: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per mode, one record per question ({ok, in, out, s}); a mode appears only if it ran on all of them."""
    entries = [per_question.get(str(q["id"]), {}) for q in questions]
    modes: dict[str, list[dict[str, Any]]] = {}
    labels = sorted({k for e in entries for k in e if k.startswith("member ")})
    for label in [*labels, "team"]:
        if all(label in e for e in entries):
            modes[label] = [{**e[label], "ok": e[label].get("state", "completed") == "completed"
                             and correct(e[label]["answer"], q)} for e, q in zip(entries, questions, strict=True)]
    counts = sorted({len(e.get("sc_samples", [])) for e in entries})
    matched = matched_samples(entries)
    for n in sorted({SC_SAMPLES, *([matched] if matched else [])}):
        if counts and counts[0] >= n:
            label = f"sc@{n}" + (" (cost-matched)" if n == matched and n != SC_SAMPLES else "")
            modes[label] = []
            for e, q in zip(entries, questions, strict=True):
                samples = e["sc_samples"][:n]
                modes[label].append({"ok": correct(majority(samples, q["question"]), q),
                                     "in": sum(s["in"] for s in samples), "out": sum(s["out"] for s in samples),
                                     "s": sum(s["s"] for s in samples)})
    return modes


def rows(modes: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    team = [r["ok"] for r in modes.get("team", [])]
    out = []
    for label, records in modes.items():
        asked, right = len(records), sum(r["ok"] for r in records)
        tokens = sum(r["in"] + r["out"] for r in records)
        low, high = wilson(right, asked)
        row: dict[str, Any] = {
            "mode": label, "correct": right, "asked": asked, "accuracy": round(right / asked, 3),
            "ci95": [round(low, 3), round(high, 3)], "input_tokens": sum(r["in"] for r in records),
            "output_tokens": sum(r["out"] for r in records), "tokens_per_question": round(tokens / asked, 1),
            "accuracy_per_1k_tokens": round((right / asked) / (tokens / asked / 1000), 3) if tokens else None,
            "seconds": round(sum(r["s"] for r in records), 1),
        }
        if team and label != "team":
            row["team_vs_this"] = mcnemar(team, [r["ok"] for r in records])
        out.append(row)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'mode':<22} {'correct':>9} {'accuracy':>8} {'95% interval':>14} {'tok/q':>7} {'acc/1k tok':>10} "
             f"{'team vs this: +/- (p)':>22}"]
    for row in rows:
        versus = row.get("team_vs_this")
        paired = f"+{versus['a_only']}/-{versus['b_only']} (p={versus['p_value']:.3f})" if versus else ""
        low, high = row["ci95"]
        lines.append(f"{row['mode']:<22} {row['correct']:>4}/{row['asked']:<4} {row['accuracy']:>8.3f} "
                     f"{f'{low:.2f}-{high:.2f}':>14} {row['tokens_per_question']:>7.0f} "
                     f"{row['accuracy_per_1k_tokens'] or 0:>10.3f} {paired:>22}")
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--team", default="local", help="a preset name or a team file (default: local)")
    parser.add_argument("--split", choices=("dev", "test", "all"), default="dev",
                        help="which questions: dev (tune here), test (report only), all")
    parser.add_argument("--limit", type=int, help="only the first N questions")
    parser.add_argument("--only", default=",".join(MODES), help="modes to run, comma-separated: member,sc,team")
    parser.add_argument("--questions", type=Path, default=QUESTIONS)
    parser.add_argument("--label", default="", help="a suffix for the result file (e.g. a design under trial)")
    args = parser.parse_args()
    modes = {mode.strip() for mode in args.only.split(",") if mode.strip()}
    if not modes <= set(MODES):
        parser.error(f"--only takes {', '.join(MODES)}")
    team = resolve_team(args.team, os.environ)
    questions = load(args.questions, args.split, args.limit)
    suffix = f"-{args.split}" + (f"-limit{args.limit}" if args.limit else "") + (f"-{args.label}" if args.label else "")
    path = HERE / "results" / f"quality-{team.name}{suffix}.json"
    earlier = json.loads(path.read_text()) if path.exists() else {}
    same = earlier.get("question_ids") == [q["id"] for q in questions]
    out: dict[str, Any] = {"per_question": earlier.get("per_question", {}) if same else {}}
    load_before = os.getloadavg()
    if "team" in modes:  # first: the cost-matched self-consistency takes its size from the team's tokens
        await team_runs(args.team, questions, out)
    if modes & {"member", "sc"}:
        await members_and_sc(team, questions, modes, out)
    ordered = rows(outcomes(questions, out["per_question"]))
    result = {
        "team": team.name, "agents": [agent.model_dump(exclude_defaults=True) for agent in team.agents],
        "coordination": team.coordination.model_dump(), "questions": args.questions.name, "split": args.split,
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
