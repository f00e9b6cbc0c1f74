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
import fcntl
import json
import os
import platform
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import anyio

from conclave.backends import bundled, create_backend, llama_server
from conclave.backends.base import Message, Request
from conclave.backends.llama_server import LocalServers, ServerOptions
from conclave.backends.local import model_file
from conclave.backends.retry import RetryPolicy, complete
from conclave.config.models import AgentSpec, Team
from conclave.config.presets import resolve_team
from conclave.coordination.agents import AgentFactory
from conclave.coordination.answers import answer_key, matches
from conclave.coordination.members import endpoint_factory, endpoint_of
from conclave.jobs.environment import JobEnvironment
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings

sys.path.insert(0, str(Path(__file__).parent))
from report import rows, table

HERE = Path(__file__).parent
QUESTIONS = HERE / "questions" / "heldout.jsonl"
MODES = ("member", "sc", "team")
SC_SAMPLES, SC_TEMPERATURE, SC_MAX = 3, 0.7, 40
ORDER_SEED = 20261123


def load(path: Path, split: str, limit: int | None) -> list[dict[str, Any]]:
    questions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if split != "all":
        questions = [q for q in questions if q.get("split", "test") == split]
    if limit:  # a random sample (fixed by ORDER_SEED), kept in file order: the file groups questions by kind
        keep = {q["id"] for q in random.Random(ORDER_SEED).sample(questions, min(limit, len(questions)))}
        questions = [q for q in questions if q["id"] in keep]
    return questions


def run_order(questions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The order runs go through the questions: shuffled by a fixed seed, so that a run cut short has
    covered a random sample of them, not the first kinds of the file."""
    return random.Random(ORDER_SEED).sample(questions, len(questions))


def correct(answer: str | None, question: dict[str, Any]) -> bool:
    return bool(answer) and any(
        matches(answer or "", expected, question["question"]) for expected in question["answers"]
    )


async def ask(
    backend: Any, spec: AgentSpec, question: str, temperature: float, seed: int | None
) -> dict[str, Any]:
    request = Request(
        system=spec.system_prompt or "",
        messages=(Message("user", question),),
        temperature=temperature,
        max_tokens=spec.max_tokens,
        seed=seed,
    )
    started = time.perf_counter()
    completion = await complete(backend, request, RetryPolicy(max_attempts=spec.max_attempts))
    return {
        "answer": completion.text.strip(),
        "in": completion.usage.input_tokens,
        "out": completion.usage.output_tokens,
        "s": round(time.perf_counter() - started, 3),
    }


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


async def members_and_sc(
    team: Team, questions: list[dict[str, Any]], modes: set[str], out: dict[str, Any], save: Any
) -> None:
    async with LocalServers() as pool:
        # the bare backends: the baselines call the model directly, outside any turn
        backends = [create_backend(endpoint_of(spec, os.environ), local_servers=pool) for spec in team.agents]
        try:
            entries = [
                out["per_question"].setdefault(str(q["id"]), {"question": q["question"]}) for q in questions
            ]
            spec0, backend0 = team.agents[0], backends[0]

            async def sample(question: dict[str, Any], entry: dict[str, Any], wanted: int) -> None:
                samples = entry.setdefault("sc_samples", [])
                while len(samples) < wanted:
                    seed = (spec0.seed or 0) + 100 + len(samples)
                    samples.append(await ask(backend0, spec0, question["question"], SC_TEMPERATURE, seed))

            # Per question, each member and the 3 samples together: a run cut short leaves every baseline
            # on the same questions. Then the cost-matched samples, whose number the team's tokens set.
            for index, (question, entry) in enumerate(zip(questions, entries, strict=True)):
                for number, (spec, backend) in enumerate(zip(team.agents, backends, strict=True)):
                    if (
                        "member" in modes and f"member {number + 1}" not in entry
                    ):  # a resumed run keeps its own
                        entry[f"member {number + 1}"] = await ask(
                            backend, spec, question["question"], 0.0, spec.seed
                        )
                if "sc" in modes:
                    await sample(question, entry, SC_SAMPLES)
                save()
                print(
                    f"[{index + 1}/{len(questions)}] {'+'.join(sorted(modes - {'team'}))}: "
                    f"{question['question']}",
                    flush=True,
                )
            if "sc" in modes:
                wanted = matched_samples(entries) or SC_SAMPLES
                for index, (question, entry) in enumerate(zip(questions, entries, strict=True)):
                    await sample(question, entry, wanted)
                    save()
                    print(f"[{index + 1}/{len(questions)}] sc@{wanted}: {question['question']}", flush=True)
        finally:
            for backend in backends:
                await backend.aclose()


@dataclass(frozen=True)
class HeldServers:
    """Real agents whose local model servers are the bench's pool, held across questions (production's
    `EndpointAgents` starts them in the service's own pool, which stops one no job uses)."""

    pool: LocalServers
    probes: ClassVar[bool] = True

    def factory(self, local_servers: LocalServers) -> AgentFactory:
        return endpoint_factory(os.environ, self.pool)


async def team_runs(
    team: Team, team_name: str, questions: list[dict[str, Any]], out: dict[str, Any], save: Any
) -> None:
    """Each question as a job of a real JobService, the way `conclave ask` submits it; the bench holds one
    reference to each local model's server for the whole run, so a job does not start and stop the
    llama.cpp server around itself (the same server and scorer, only not reloaded per question)."""
    options = {
        ServerOptions(model_file(a.model_name, a.model_path), bundled.chat_format(a.model_name, a.model_path))
        for a in team.agents
        if a.provider == "local"
    }
    with tempfile.TemporaryDirectory(prefix="conclave-quality-") as home:
        async with LocalServers() as pool:
            held = [await pool.acquire(option) for option in options]
            try:
                jobs = JobEnvironment.of(Settings(home=Path(home)), dict(os.environ))
                async with JobService.serve(replace(jobs, agents=HeldServers(pool))) as service:
                    for index, question in enumerate(questions):
                        entry = out["per_question"].setdefault(
                            str(question["id"]), {"question": question["question"]}
                        )
                        if "team" in entry:  # a resumed run keeps what it has
                            continue
                        started = time.perf_counter()
                        view = await service.submit(JobRequest(task=question["question"], team=team_name))
                        while not view.done:
                            view = await service.wait(view.job_id, 30)
                        wall = time.perf_counter() - started
                        ended = view.result  # None for a job cancelled or interrupted before it ended
                        entry["team"] = {
                            "answer": view.answer,
                            "state": view.state,
                            "consensus": ended.consensus if ended else None,
                            "winner": ended.winner if ended else None,
                            "reason": ended.reason if ended else None,
                            "in": view.usage.input_tokens,
                            "out": view.usage.output_tokens,
                            "s": round(wall, 3),
                        }
                        save()
                        ok = view.state == "completed" and correct(view.answer, question)
                        print(
                            f"[{index + 1}/{len(questions)}] team {'ok ' if ok else 'BAD'} {wall:5.1f}s "
                            f"{question['question']} -> {(view.answer or '')[:70]!r}",
                            flush=True,
                        )
            finally:
                for server in held:
                    await pool.release(server)


def outcomes(
    questions: list[dict[str, Any]], per_question: dict[str, Any]
) -> dict[str, list[dict[str, Any]]]:
    """Per mode, one record per question it ran on ({i, ok, in, out, s}; i is the question's index). A mode
    that has not run on every question yet is labelled with how many it covers (a run cut short, or
    self-consistency's cost-matched samples still under way): its rows compare like with like."""
    entries = [per_question.get(str(q["id"]), {}) for q in questions]
    modes: dict[str, list[dict[str, Any]]] = {}

    def add(label: str, records: list[dict[str, Any]]) -> None:
        if records:
            modes[
                label + ("" if len(records) == len(questions) else f" [{len(records)} of {len(questions)}]")
            ] = records

    labels = sorted({k for e in entries for k in e if k.startswith("member ")})
    for label in [*labels, "team"]:
        add(
            label,
            [
                {
                    **e[label],
                    "i": i,
                    "ok": e[label].get("state", "completed") == "completed"
                    and correct(e[label]["answer"], q),
                }
                for i, (e, q) in enumerate(zip(entries, questions, strict=True))
                if label in e
            ],
        )
    matched = matched_samples(entries)
    for n in sorted({SC_SAMPLES, *([matched] if matched else [])}):
        records = []
        for i, (e, q) in enumerate(zip(entries, questions, strict=True)):
            samples = e.get("sc_samples", [])[:n]
            if len(samples) == n:
                records.append(
                    {
                        "i": i,
                        "ok": correct(majority(samples, q["question"]), q),
                        "in": sum(s["in"] for s in samples),
                        "out": sum(s["out"] for s in samples),
                        "s": sum(s["s"] for s in samples),
                    }
                )
        add(f"sc@{n}" + (" (cost-matched)" if n == matched and n != SC_SAMPLES else ""), records)
    return modes


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--team", default="local", help="a preset name or a team file (default: local)")
    parser.add_argument(
        "--split",
        choices=("dev", "test", "all"),
        default="dev",
        help="which questions: dev (tune here), test (report only), all",
    )
    parser.add_argument(
        "--limit",
        type=int,
        help="a random sample of N questions (fixed seed), e.g. for a quick look or a short trial",
    )
    parser.add_argument(
        "--only", default=",".join(MODES), help="modes to run, comma-separated: member,sc,team"
    )
    parser.add_argument("--questions", type=Path, default=QUESTIONS)
    parser.add_argument(
        "--reverse",
        action="store_true",
        help="members and samples from the last question back (a second process on a free core)",
    )
    parser.add_argument(
        "--label", default="", help="a suffix for the result file (e.g. a design under trial)"
    )
    parser.add_argument(
        "--repeat-penalty",
        type=float,
        help=f"the local server's repeat penalty for this run (default {llama_server.REPEAT_PENALTY})",
    )
    args = parser.parse_args()
    if args.repeat_penalty is not None:  # read by ServerOptions.settings() when a server starts
        llama_server.REPEAT_PENALTY = args.repeat_penalty
    modes = {mode.strip() for mode in args.only.split(",") if mode.strip()}
    if not modes <= set(MODES):
        parser.error(f"--only takes {', '.join(MODES)}")
    team = resolve_team(args.team, os.environ)
    questions = load(args.questions, args.split, args.limit)
    suffix = (
        f"-{args.split}"
        + (f"-limit{args.limit}" if args.limit else "")
        + (f"-{args.label}" if args.label else "")
    )
    path = HERE / "results" / f"quality-{team.name}{suffix}.json"
    ids = [q["id"] for q in questions]
    out: dict[str, Any] = {"per_question": {}}
    load_before = os.getloadavg()

    def save() -> list[dict[str, Any]]:
        """Merge this run's records into the result file under a lock (runs of other modes may share it:
        team and members at once on two cores) and write it with its table; a rerun resumes from it."""
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            earlier = json.loads(path.read_text()) if path.exists() else {}
            merged = earlier.get("per_question", {}) if earlier.get("question_ids") == ids else {}
            for qid, entry in out["per_question"].items():
                into = merged.setdefault(qid, {})
                for key, value in entry.items():
                    if key != "sc_samples" or len(value) >= len(into.get(key, [])):
                        into[key] = value
            for qid, entry in merged.items():  # this run sees the others' records (same objects kept)
                out["per_question"].setdefault(qid, {}).update(entry)
            ordered = rows(outcomes(questions, merged))
            result = {
                "team": team.name,
                "agents": [agent.model_dump(exclude_defaults=True) for agent in team.agents],
                "coordination": team.coordination.model_dump(),
                "repeat_penalty": llama_server.REPEAT_PENALTY,
                "questions": args.questions.name,
                "split": args.split,
                "question_ids": ids,
                "rows": ordered,
                "machine": {
                    "cpus": os.cpu_count(),
                    "processor": platform.processor() or platform.machine(),
                    "python": sys.version.split()[0],
                    "load_average_before": load_before,
                },
                "per_question": merged,
            }
            path.parent.mkdir(parents=True, exist_ok=True)
            path.with_suffix(".tmp").write_text(json.dumps(result, indent=1) + "\n")
            path.with_suffix(".tmp").replace(path)
            return ordered

    save()  # loads what an earlier run of these questions left
    if "team" in modes:  # first: the cost-matched self-consistency takes its size from the team's tokens
        await team_runs(team, args.team, run_order(questions), out, save)
    if modes & {"member", "sc"}:
        await members_and_sc(
            team, run_order(questions)[::-1] if args.reverse else run_order(questions), modes, out, save
        )
    print(table(save()))
    print(f"wrote {path}")


if __name__ == "__main__":
    anyio.run(main)
