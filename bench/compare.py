"""Two teams on the same questions: the team rows of two bench/quality.py result files, paired.

    python bench/compare.py bench/results/quality-local-mixed-dev-limit30.json \
        bench/results/quality-local-dev-limit30.json

Only questions both files have a team answer for are counted (runs go through the questions in the same
seeded order, so a run cut short has covered a random sample, and two such runs share their first part).
Prints each team's accuracy with its 95% Wilson interval and tokens per question, and the exact McNemar
test of the first against the second; with --json, the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from quality import QUESTIONS, correct, load
from stats import mcnemar, wilson


def team_records(path: Path) -> dict[str, dict[str, Any]]:
    result = json.loads(path.read_text())
    return {qid: entry["team"] for qid, entry in result["per_question"].items() if "team" in entry}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    questions = {str(q["id"]): q for q in load(QUESTIONS, "all", None)}
    first, second = team_records(args.first), team_records(args.second)
    common = sorted(set(first) & set(second), key=int)
    out: dict[str, Any] = {"questions": len(common), "teams": {}}
    oks = []
    for path, records in ((args.first, first), (args.second, second)):
        ok = [
            records[q]["state"] == "completed" and correct(records[q]["answer"], questions[q]) for q in common
        ]
        tokens = sum(records[q]["in"] + records[q]["out"] for q in common)
        low, high = wilson(sum(ok), len(ok))
        out["teams"][path.name] = {
            "correct": sum(ok),
            "accuracy": round(sum(ok) / max(len(ok), 1), 3),
            "ci95": [round(low, 3), round(high, 3)],
            "tokens_per_question": round(tokens / max(len(ok), 1), 1),
        }
        oks.append(ok)
    out["first_vs_second"] = mcnemar(oks[0], oks[1])
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{len(common)} questions both answered")
    for name, row in out["teams"].items():
        print(
            f"{name:<48} {row['correct']:>4}/{len(common):<4} {row['accuracy']:.3f} "
            f"({row['ci95'][0]:.2f}-{row['ci95'][1]:.2f}) {row['tokens_per_question']:>7.0f} tok/q"
        )
    versus = out["first_vs_second"]
    print(
        f"first vs second: +{versus['a_only']}/-{versus['b_only']} (exact McNemar p={versus['p_value']:.3f})"
    )


if __name__ == "__main__":
    main()
