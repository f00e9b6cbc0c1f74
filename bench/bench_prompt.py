"""What one agent turn costs in input tokens with three answers on the table.

Builds the real prompts (prompts.py) for agent A of a three-agent team, native tool mode, with three
answers of typical length, and counts tokens with a real BPE tokenizer: the bundled SmolLM2's (49k
vocabulary, GPT-2 style). Provider tokenizers differ by some percent; the characters are exact.
Writes bench/results/prompt.json. Run: .venv/bin/python bench/bench_prompt.py (the tokenizer comes from
llama-cpp-python, which the `local` extra no longer installs: `pip install llama-cpp-python` first).
"""

from __future__ import annotations

import json
from pathlib import Path

from conclave.backends.local import BUNDLED, model_file
from conclave.coordination import prompts
from conclave.coordination.reports import ShownAnswer

TASK = (
    "Our Flask service times out under load when it calls the payments API. Propose a fix: what to "
    "change, where, and why, and how to test it."
)
PARAGRAPH = (
    "Wrap the payments client in a connection pool with a bounded size and a per-call timeout of five "
    "seconds, retry idempotent calls twice with jittered backoff, and move the call out of the request "
    "thread into a task queue so the web worker is freed at once. "
)


def answer(words: int) -> str:
    text = []
    while sum(len(t.split()) for t in text) < words:
        text.append(PARAGRAPH)
    return "".join(text)


def main() -> None:
    from llama_cpp import Llama

    tokenizer = Llama(model_path=str(model_file(BUNDLED, None)), vocab_only=True, verbose=False)

    def tokens(text: str) -> int:
        return len(tokenizer.tokenize(text.encode(), special=True))

    rows = []
    for words in (100, 300, 800):
        shown = [
            ShownAnswer(label=f"{letter}1", letter=letter, revision=1, content=answer(words))
            for letter in "ABC"
        ]
        system = prompts.system_prompt(TASK, "A", 3, 3, "native", None)
        turn = prompts.turn_prompt("A", shown, ["A1", "B1", "C1"], True)
        tools = json.dumps([t.__dict__ for t in prompts.workflow_tools(["A1", "B1", "C1"], True)])
        total = tokens(system) + tokens(turn) + tokens(tools)
        rows.append(
            {
                "answer_words": words,
                "system_tokens": tokens(system),
                "turn_tokens": tokens(turn),
                "tool_definition_tokens": tokens(tools),
                "input_tokens": total,
                "answers_share": round(sum(tokens(a.content) for a in shown) / total, 3),
                "characters": len(system) + len(turn) + len(tools),
            }
        )
    print(f"{'words/answer':>12} {'system':>7} {'turn':>6} {'tools':>6} {'input tokens':>12} {'answers':>8}")
    for row in rows:
        print(
            f"{row['answer_words']:>12} {row['system_tokens']:>7} {row['turn_tokens']:>6} "
            f"{row['tool_definition_tokens']:>6} {row['input_tokens']:>12} {row['answers_share']:>8.0%}"
        )
    out = Path(__file__).parent / "results" / "prompt.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"tokenizer": "SmolLM2-135M (BPE, 49k)", "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
