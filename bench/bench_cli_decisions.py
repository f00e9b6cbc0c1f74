"""What a CLI member's decision costs, and the whole job, before and after a change, in one run.

    python bench/bench_cli_decisions.py [--before REF] [--out FILE]  # REF: the code to compare (79cd6b7)
    python bench/bench_cli_decisions.py --before 4cd1b02 --scenarios claude_codex_default@large --out F
    python bench/bench_cli_decisions.py --shares [--tree TREE]  # this checkout (or TREE) alone

Needs Docker and the CLI image (`conclave sandbox build --clis`). The code at REF is exported (`git
archive`) to a temporary folder; each job runs in a child process, once on that code and once on this
checkout's, alternately. The scenario is issue 31's: fix `add()` in calc.py with `verify: python3 -m
pytest -q`, a team of two real CLIs in their containers and one API member, each CLI's model a scripted
fake (tests/fakes/cli_worker.py) reached only through its egress proxy:
- `trio`: `cli/claude-code` fixes add(), `cli/codex` breaks it another way, the API member changes
  nothing; the answers land in that fixed order (the API's, Codex's, then Claude's once Codex has voted),
  as in tests/clis/test_cli_members_e2e.py, so every run ends on its own and the same runs happen on both
  sides;
- `gemini_copilot`: the same with `cli/gemini` fixing and `cli/copilot` (its own-key provider on the
  Anthropic wire) breaking it.
With `--shares` it runs this checkout alone over the models users get: each CLI with the model it uses
when a team names none and with one named, on a job whose answers' diffs are small (the calc fix) and
one where they are tens of kilobytes (each CLI also writes a generated 1,500-line file of its own), the API
member voting for its own answer so the vote is not unanimous and the winner presents (`final:
present`). Per CLI member it reports its decision's and its presentation's first request as a share of
its work run's first request, in bytes and in tokens as the fake bills, and the decision's fixed part
(the request without our prompt: the CLI's instructions, tools and environment, with our system
prompt). Writes bench/results/cli-decision-shares.json.

Tokens are counted from what the fake servers received, four characters a token over each request's body
(tests/fakes/script.py `estimate_tokens`, the fakes' own bill), so they do not depend on how Conclave
reads usage. Each request is put in its run by the prompt the CLI was given: a work run (its prompt asks
for the final message), a decision run (it asks for the JSON decision), or the CLI's side calls. Records
per member its requests, input tokens received, output tokens billed and its runs, per CLI a decision's
input as a share of a work run's, and per side the winner, its check and the diff. Writes
bench/results/cli-decisions.json.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/bench_checks.py; this checkout's tests (the fakes) for both trees

from bench.bench_checks import PACKAGES, _Tree  # noqa: E402
from bench.child_run import run_child  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "cli-decisions.json"
KEY = "CONCLAVE_FAKE_KEY"
CHECK = "python3 -m pytest -q"
# scenario -> (the fixer's model and fake wire, the breaker's), the API member beside them
SCENARIOS = {
    "trio": (("cli/claude-code", "anthropic"), ("cli/codex:gpt-5.5", "responses")),
    "gemini_copilot": (
        ("cli/gemini:gemini-2.5-pro", "gemini"),
        ("cli/copilot:claude-sonnet-4.5", "anthropic"),
    ),
    # --shares: each CLI with its default model (the fixer, which wins and presents) and a named one
    "claude_codex_default": (("cli/claude-code", "anthropic"), ("cli/codex", "responses")),
    "codex_claude_named": (
        ("cli/codex:gpt-5.5", "responses"),
        ("cli/claude-code:claude-sonnet-4-5", "anthropic"),
    ),
    # Copilot CLI's own-key provider has no default model: two named ones
    "gemini_copilot_default": (("cli/gemini", "gemini"), ("cli/copilot:claude-haiku-4.5", "anthropic")),
    "copilot_gemini_named": (
        ("cli/copilot:claude-sonnet-4.5", "anthropic"),
        ("cli/gemini:gemini-2.5-pro", "gemini"),
    ),
}
SHARES = ("claude_codex_default", "codex_claude_named", "gemini_copilot_default", "copilot_gemini_named")
SHARES_RESULTS = ROOT / "bench" / "results" / "cli-decision-shares.json"
TABLE_LINES = 1500  # the large job's generated table file: about 25 kB of diff per answer


# The child: one job on one tree ----------------------------------------------------------------------
def _team(path: Path, fakes: Any, scenario: str, final: str = "reuse") -> str:
    (fixer, fixer_wire), (breaker, breaker_wire) = SCENARIOS[scenario]
    path.write_text(f"""\
name: {scenario}
agents:
  - model: {fixer}
    base_url: {fakes.base_url(fixer_wire, "fixer")}
    api_key_env: {KEY}
  - model: {breaker}
    base_url: {fakes.base_url(breaker_wire, "breaker")}
    api_key_env: {KEY}
  - model: openai/gpt-fake
    base_url: {fakes.base_url("openai", "api")}
    api_key_env: {KEY}
coordination: {{max_answers_per_agent: 1, final: {final}, timeout_s: 900}}
sandbox: {{memory: 2g, cpus: 1}}
""")
    return str(path)


def _runs(requests: list[Any], wire: str) -> dict[str, Any]:
    """A member's requests by run: (kind, its prompt) -> the runs' requests and input tokens."""
    from tests.fakes.cli_worker import DECISION_MARK, PRESENT_MARK, WORK_MARK, _first_user_text, _tool_names
    from tests.fakes.script import estimate_tokens

    runs: dict[tuple[str, str], list[int]] = defaultdict(list)
    first: dict[str, list[dict[str, int]]] = defaultdict(list)  # kind -> the requests measured
    tooled: set[str] = set()
    for request in requests:
        prompt = _first_user_text(request.body, wire)
        kind = (
            "decision"
            if DECISION_MARK in prompt
            else "presentation"
            if PRESENT_MARK in prompt
            else "work"
            if WORK_MARK in prompt
            else "side"
        )
        key = hashlib.sha256(prompt.encode()).hexdigest()
        # a work run's first request that offers tools (Gemini CLI's model router asks first, with none);
        # every request of a decision or a presentation (their router calls too)
        if kind in ("decision", "presentation") or (
            kind == "work" and key not in tooled and _tool_names(request.body)
        ):
            tooled.add(key)
            size = len(request.text().encode())
            prompt_size = len(json.dumps(prompt).encode()) - 2  # as the body carries it, escaped
            first[kind].append(
                {"bytes": size, "tokens": estimate_tokens(request.text()), "fixed_bytes": size - prompt_size}
            )
        runs[(kind, hashlib.sha256(prompt.encode()).hexdigest())].append(estimate_tokens(request.text()))
        if os.environ.get("BENCH_DUMP"):  # a folder for the request bodies, to see what a run sends
            name = f"{request.agent}-{kind}-{len(runs[(kind, hashlib.sha256(prompt.encode()).hexdigest())])}"
            (Path(os.environ["BENCH_DUMP"]) / f"{name}.json").write_text(json.dumps(request.body, indent=1))
    found: dict[str, Any] = {}
    for kind in ("work", "decision", "presentation", "side"):
        mine = [sizes for (k, _), sizes in runs.items() if k == kind]
        found[kind] = {
            "runs": len(mine),
            "requests": sum(len(sizes) for sizes in mine),
            "input_tokens": sum(sum(sizes) for sizes in mine),
            "largest_request": max((max(sizes) for sizes in mine), default=0),
            "first_requests": first.get(kind, []),
        }
    return found


async def one_job(scenario: str, job: str = "small") -> dict[str, Any]:
    import anyio

    from bench.submitting import open_service
    from conclave.backends.retry import RetryPolicy
    from conclave.settings import Settings
    from tests.fakes.calc_task import TASK, calc_project
    from tests.fakes.cli_worker import CliWorker, answer_held
    from tests.fakes.script import RecordedRequest, Reply, estimate_tokens
    from tests.fakes.server import FakeProviders
    from tests.fakes.team import decide, vote_labels

    (fixer_model, fixer_wire), (breaker_model, breaker_wire) = SCENARIOS[scenario]
    env = {KEY: "fake-key-0123456789"}

    def api_agent(request: RecordedRequest) -> Reply:
        """Answers once without touching the code, then votes for an answer whose check passed (as in
        tests/clis/test_cli_members_e2e.py, which the code before cannot import)."""
        if "(your own answer)" not in request.text():
            return decide("new_answer", {"content": "calc.py looks right to me; I changed nothing."}, request)
        passing = re.findall(r"## Answer ([A-P][0-9]+)[^\n]*verify passed", request.text())
        if shares:  # a vote for its own answer, so the winner has something to present
            own = re.findall(r"## Answer ([A-P][0-9]+) \(your own answer\)", request.text())
            return decide("vote", {"answer": (own or vote_labels(request))[0], "reason": "mine"}, request)
        label = (passing or vote_labels(request))[0]
        return decide("vote", {"answer": label, "reason": "its check passed"}, request)

    shares = scenario in SHARES
    # the large job: each CLI also writes a table of its own, tens of kB of diff per answer
    table = f" && seq 1 {TABLE_LINES} | sed 's/.*/VALUE_& = {{}}/' > table.py" if job == "large" else ""
    fixer = CliWorker(
        fixer_wire,
        "sed -i 's/return a - b/return a + b/' calc.py" + table.format("&") + " && python3 -m pytest -q",
        "Fixed add() in calc.py: it subtracted; the test passes now.",
    )
    breaker = CliWorker(
        breaker_wire,
        "sed -i 's/return a - b/return a * b/' calc.py" + table.format("& + 1"),
        "add() now multiplies.",
    )
    api_in, breaker_voted = threading.Event(), threading.Event()
    started = time.perf_counter()
    with FakeProviders() as fakes, tempfile.TemporaryDirectory() as tmp:
        project = calc_project(Path(tmp))
        fakes.script.set_default("fixer", answer_held(fixer, breaker_voted))
        fakes.script.set_default("breaker", answer_held(breaker, api_in)).set_default("api", api_agent)
        team = _team(Path(tmp) / "team.yaml", fakes, scenario, "present" if shares else "reuse")
        retry = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.05)
        settings: dict[str, Any] = {"home": Path(tmp) / "state"}
        if "key_destinations" in Settings.model_fields:  # a team outside the user's folder, as tests do
            settings["key_destinations"] = (f"{KEY}=127.0.0.1:*",)
        async with open_service(Settings(**settings), env, retry) as service:
            asked = {"task": TASK, "team": team, "context_paths": [{"path": str(project)}], "verify": CHECK}
            try:
                from conclave.jobs.request import JobRequest
            except ImportError:  # older code (4cd1b02): submit takes the request's fields
                view = await service.submit(**asked)
            else:
                view = await service.submit(JobRequest(**asked))
            try:
                with anyio.fail_after(600):
                    while not breaker_voted.is_set() and not view.done:
                        view = await service.wait(view.job_id, 10)
                        for agent in view.agents:
                            if agent.model == "openai/gpt-fake" and agent.answers:
                                api_in.set()
                            if agent.model == breaker_model and agent.vote:
                                breaker_voted.set()
                with anyio.fail_after(600):  # the job's end (tests/fakes/waits.py needs the newest code)
                    while not view.done:
                        view = await service.wait(view.job_id, 10)
            finally:
                api_in.set()
                breaker_voted.set()
            patch = (await service.lookup.read(view.job_id, "@diff", None, 0, 100_000)).content
        wall = time.perf_counter() - started
        models = {"fixer": fixer_model, "breaker": breaker_model, "api": "openai/gpt-fake"}
        wires = {"fixer": fixer_wire, "breaker": breaker_wire, "api": "openai"}
        members: dict[str, Any] = {}
        for name, model in models.items():
            requests = fakes.script.requests_of(name)
            billed = fakes.script.bill.get(name, (0, 0, 0))
            members[model] = {
                "requests": len(requests),
                "input_tokens": sum(estimate_tokens(request.text()) for request in requests),
                "output_tokens": billed[1],
                **({"runs": _runs(requests, wires[name])} if model.startswith("cli/") else {}),
            }
    by_letter = {agent.letter: agent.model for agent in view.agents}
    winner = view.result.winner if view.result else None
    checks = view.checks()
    return {
        "state": view.state,
        "winner": by_letter.get(winner[0]) if winner else None,
        "winner_check": checks.get(winner, "") if winner else "",
        "diff": patch,
        "wall_s": round(wall, 1),
        "members": members,
        "total_tokens": sum(m["input_tokens"] + m["output_tokens"] for m in members.values()),
    }


def child(scenario: str, tree: Path) -> None:
    import anyio

    sys.meta_path.insert(0, _Tree(tree))
    name, _, job = scenario.partition("@")  # a --shares job: SCENARIO@small or SCENARIO@large
    print(json.dumps(anyio.run(one_job, name, job or "small")))


# The parent: export the old tree, alternate the children, write the shares ----------------------------
def shares(job: dict[str, Any]) -> dict[str, Any]:
    """Per CLI: a decision run's input tokens as a share of a work run's (each per run)."""
    found = {}
    for model, member in job["members"].items():
        runs = member.get("runs")
        if not runs or not runs["work"]["runs"]:
            continue
        work = runs["work"]["input_tokens"] / runs["work"]["runs"]
        decision = (
            runs["decision"]["input_tokens"] / runs["decision"]["runs"] if runs["decision"]["runs"] else 0
        )
        found[model] = {
            "work_run_input": round(work),
            "decision_run_input": round(decision),
            "decision_runs": runs["decision"]["runs"],
            "decision_to_work": round(decision / work, 3),
        }
    return found


def first_shares(job: dict[str, Any]) -> dict[str, Any]:
    """Per CLI member: its work run's first request, and its largest decision's and its presentation's
    first request as shares of it (bytes, tokens as the fake bills, and the fixed part's bytes)."""
    found: dict[str, Any] = {}
    for model, member in job["members"].items():
        runs = member.get("runs")
        if not runs or not runs["work"]["first_requests"]:
            continue
        work = runs["work"]["first_requests"][0]
        row: dict[str, Any] = {"work_first_request": work, "input_tokens": member["input_tokens"]}
        for kind in ("decision", "presentation"):
            firsts = runs[kind]["first_requests"]
            if not firsts:
                row[kind] = None
                continue
            largest = max(firsts, key=lambda request: int(request["bytes"]))
            row[kind] = {
                **largest,
                "runs": len(firsts),
                "share_bytes": round(largest["bytes"] / work["bytes"], 3),
                "share_tokens": round(largest["tokens"] / work["tokens"], 3),
                "fixed_share_bytes": round(largest["fixed_bytes"] / work["bytes"], 3),
            }
        found[model] = row
    return found


def run_shares(out: Path, tree: Path) -> None:
    """--shares: every SHARES scenario on a small and a large job, on one tree (this checkout's, or
    `--tree`: e.g. a commit's code exported with `git archive`)."""
    load_before = os.getloadavg()
    result: dict[str, Any] = {"code": "this branch" if tree == ROOT else str(tree), "jobs": {}}
    for scenario in SHARES:
        for job in ("small", "large"):
            done = run_child(__file__, f"{scenario}@{job}", tree)
            result["jobs"][f"{scenario}@{job}"] = {
                "state": done["state"],
                "winner": done["winner"],
                "wall_s": done["wall_s"],
                "diff_bytes": len(done["diff"].encode()),
                "members": first_shares(done),
            }
            print(scenario, job, json.dumps(result["jobs"][f"{scenario}@{job}"]), flush=True)
    result["load_average_1_5_15"] = {"at_start": list(load_before), "at_end": list(os.getloadavg())}
    result["note"] = (
        "bytes are each request body as the fake server received it, tokens four characters a token over "
        "it (the fakes' bill). The work run's measure is its first request that offers tools (later ones "
        "add its own tool calls; Gemini CLI's model router asks first, with no tools); a decision's and a "
        "presentation's is their largest request, a router call's included. fixed_bytes: the request "
        "without the prompt Conclave gave (the CLI's instructions, tools, environment and our system "
        "prompt). Each CLI is the fixer (it wins and presents) in one scenario and the breaker in the "
        "other."
    )
    out.write_text(json.dumps(result, indent=2) + "\n")


def _patch(diff: str) -> str:
    """The diff without its heading lines (`# proj: /tmp/...` names the job's own temporary folder)."""
    return "".join(line for line in diff.splitlines(keepends=True) if not line.startswith("# "))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", default="79cd6b7")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--child")
    parser.add_argument("--tree")
    parser.add_argument("--shares", action="store_true")
    args = parser.parse_args()
    if args.child:
        child(args.child, Path(args.tree))
        return
    if args.shares:
        run_shares(
            args.out if args.out != RESULTS else SHARES_RESULTS, Path(args.tree) if args.tree else ROOT
        )
        return
    commit = subprocess.run(
        ["git", "rev-parse", "--short", args.before], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    found: dict[str, dict[str, Any]] = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "archive", args.before, *sorted(set(PACKAGES.values()))],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        for scenario in args.scenarios.split(","):
            found[scenario] = {}
            for side, tree in (("before", Path(tmp)), ("after", Path(args.tree) if args.tree else ROOT)):
                found[scenario][side] = job = run_child(__file__, scenario, tree)
                print(scenario, side, json.dumps({k: v for k, v in job.items() if k != "diff"}), flush=True)
    result: dict[str, Any] = {"before": f"{args.before} ({commit})", "after": "this branch"}
    for scenario, sides in found.items():
        before, after = sides["before"], sides["after"]
        result[scenario] = {
            "decision_share_of_work_run": {side: shares(job) for side, job in sides.items()},
            "total_tokens": {side: job["total_tokens"] for side, job in sides.items()},
            "total_after_to_before": round(after["total_tokens"] / before["total_tokens"], 3),
            "tokens_per_member": {
                side: {m: v["input_tokens"] + v["output_tokens"] for m, v in job["members"].items()}
                for side, job in sides.items()
            },
            "same_winner_diff_and_check": before["winner"] == after["winner"]
            and _patch(before["diff"]) == _patch(after["diff"])
            and before["winner_check"].split(" in ")[0] == after["winner_check"].split(" in ")[0],
            "raw": sides,
        }
    result["load_average_1_5_15"] = {"at_start": list(load_before), "at_end": list(os.getloadavg())}
    result["note"] = (
        "tokens are what the fake servers received (four characters a token over each request body) and "
        "billed as output; the fakes keep no prompt cache, so cached input is not measured here. Runs are "
        "told apart by the prompt the CLI was given. One job per side; the scripted order makes the same "
        "runs happen on both sides, and the CLIs' own system prompts and tools are fixed for a version, so "
        "token counts barely move between runs (wall seconds do, on the shared 2-core machine)."
    )
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "raw"}, indent=2, default=str))


if __name__ == "__main__":
    main()
