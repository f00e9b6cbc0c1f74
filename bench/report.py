"""The table of a bench/quality.py result: each mode's accuracy, interval, tokens; the team paired with it.

    python bench/report.py bench/results/quality-local-test.json            # every question each mode ran on
    python bench/report.py bench/results/quality-local-test.json --prefix   # a run cut short: see below

With --prefix, only the questions of the longest stretch of the run order (quality.run_order, a seeded
shuffle) that the team finished are counted: a random sample of the split, whatever else an earlier,
differently ordered run left in the file. Each mode is then reported on the part of that sample it
covers, and the team is paired with it on the questions both answered.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from stats import mcnemar, wilson


def rows(modes: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    team = next(
        ({r["i"]: r["ok"] for r in records} for label, records in modes.items() if label.startswith("team")),
        {},
    )
    out = []
    for label, records in modes.items():
        asked, right = len(records), sum(r["ok"] for r in records)
        tokens = sum(r["in"] + r["out"] for r in records)
        low, high = wilson(right, asked)
        row: dict[str, Any] = {
            "mode": label,
            "correct": right,
            "asked": asked,
            "accuracy": round(right / asked, 3),
            "ci95": [round(low, 3), round(high, 3)],
            "input_tokens": sum(r["in"] for r in records),
            "output_tokens": sum(r["out"] for r in records),
            "tokens_per_question": round(tokens / asked, 1),
            "accuracy_per_1k_tokens": round((right / asked) / (tokens / asked / 1000), 3) if tokens else None,
            "seconds": round(sum(r["s"] for r in records), 1),
        }
        both = [r for r in records if r["i"] in team]  # the paired test runs on the questions both answered
        if team and not label.startswith("team") and both:
            row["team_vs_this"] = {
                **mcnemar([team[r["i"]] for r in both], [r["ok"] for r in both]),
                "questions": len(both),
            }
        out.append(row)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'mode':<34} {'correct':>9} {'accuracy':>8} {'95% interval':>14} {'tok/q':>7} "
        f"{'acc/1k tok':>10} "
        f"{'team vs this: +/- (p)':>22}"
    ]
    for row in rows:
        versus = row.get("team_vs_this")
        paired = f"+{versus['a_only']}/-{versus['b_only']} (p={versus['p_value']:.3f})" if versus else ""
        low, high = row["ci95"]
        lines.append(
            f"{row['mode']:<34} {row['correct']:>4}/{row['asked']:<4} {row['accuracy']:>8.3f} "
            f"{f'{low:.2f}-{high:.2f}':>14} {row['tokens_per_question']:>7.0f} "
            f"{row['accuracy_per_1k_tokens'] or 0:>10.3f} {paired:>22}"
        )
    return "\n".join(lines)


def main() -> None:
    from quality import QUESTIONS, load, outcomes, run_order

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", type=Path)
    parser.add_argument(
        "--prefix", action="store_true", help="only the run order's stretch the team finished"
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    result = json.loads(args.result.read_text())
    by_id = {q["id"]: q for q in load(QUESTIONS, "all", None)}
    questions = [by_id[i] for i in result["question_ids"]]
    per_question = result["per_question"]
    if args.prefix:
        done = 0
        for question in run_order(questions):
            if "team" not in per_question.get(str(question["id"]), {}):
                break
            done += 1
        keep = {q["id"] for q in run_order(questions)[:done]}
        questions = [q for q in questions if q["id"] in keep]
        print(f"the first {done} of {len(result['question_ids'])} questions in the run order")
    ordered = rows(outcomes(questions, per_question))
    print(table(ordered))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "source": args.result.name,
                    "prefix": args.prefix,
                    "question_ids": [q["id"] for q in questions],
                    "rows": ordered,
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
