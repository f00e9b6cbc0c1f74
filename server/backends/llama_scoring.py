"""How likely a llama.cpp model finds a reply (the `local` backend's `score`), and its token counts.

    scorer = LlamaScorer(model_file)                  # shared per model by LocalServers
    scores, usage = scorer.score(request, ["Paris.", "London."])   # blocking: run it in a worker thread

A score is the mean log-probability per token the model gives a reply after the request rendered with
the GGUF's own chat template, as the server renders it for a chat call. The model is loaded in this
process for it (its weights are mapped from the same file as the server's, so they are shared through
the page cache): llama.cpp's server can echo prompt log-probabilities too, but its Python side sorts
the whole vocabulary for every token, about 40 ms a token on these machines, ten times the evaluation.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from conclave.backends.base import Request, Usage

SCORE_CTX = 2048  # prompt + reply; a longer prompt is cut from its start, a longer reply at its end
SCORE_THREADS = 1  # the server runs beside it on the same cores
MEMO_SIZE = 512  # (prompt, reply) scores kept: a job's re-votes score the same answers again


def count(tokenizer: Any, text: str) -> int:
    """How many tokens `text` has for this model."""
    return len(tokenizer.tokenize(text.encode(), add_bos=False, special=True))


def render(tokenizer: Any, request: Request, chat_format: str | None = None) -> str:
    """`request` as the model sees it, up to the start of its reply (the GGUF's own chat template, or the
    llama.cpp chat format the server was given for it: bundled.py)."""
    from llama_cpp import llama_chat_format
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    # llama_cpp types each message as its own TypedDict; these are plain role/content pairs.
    messages: list[Any] = [{"role": "system", "content": request.system}] if request.system else []
    messages += [{"role": message.role, "content": message.content} for message in request.messages]
    if chat_format:
        formatter = getattr(llama_chat_format, f"format_{chat_format.replace('-', '_')}")
        return str(formatter(messages=messages).prompt)
    template = tokenizer.metadata.get("tokenizer.chat_template")
    if not template:  # a GGUF without a template: the text as it is
        return "\n\n".join(message["content"] for message in messages) + "\n\n"

    def token(token_id: int) -> str:
        return bytes(tokenizer.detokenize([token_id], special=True)).decode(errors="ignore")

    formatter = Jinja2ChatFormatter(
        template,
        eos_token=token(tokenizer.token_eos()),
        bos_token=token(tokenizer.token_bos()),
        add_generation_prompt=True,
    )
    return str(formatter(messages=messages).prompt)


class LlamaScorer:
    """One model loaded for scoring; thread-safe (one evaluation at a time), loaded on first use."""

    def __init__(self, model: Path, n_ctx: int = SCORE_CTX, *, chat_format: str | None = None) -> None:
        self.model, self.n_ctx, self.chat_format = model, n_ctx, chat_format
        self._llama: Any = None
        self._lock = threading.Lock()
        self._memo: dict[tuple[tuple[int, ...], tuple[int, ...]], float] = {}  # (prompt, reply) -> score

    def score(self, request: Request, candidates: list[str]) -> tuple[list[float], Usage]:
        """Each candidate's mean token log-probability as the reply to `request` (blocking).

        Only what is new is evaluated: the prompt from where it stops sharing the tokens already in the
        model's cache (the previous prompt's), and the candidates not scored after this prompt before.
        The usage counts the tokens evaluated, so a re-vote on the same answers costs nothing.
        """
        with self._lock:
            llama = self._load()
            prompt = render(llama, request, self.chat_format)
            head = llama.tokenize(prompt.encode(), add_bos=True, special=True)
            tails = [
                llama.tokenize(text.encode(), add_bos=False, special=False) or [llama.token_eos()]
                for text in candidates
            ]
            room = self.n_ctx - 1 - min(max(map(len, tails)), self.n_ctx // 2)
            head = head[-room:]
            key = tuple(head)
            missing = [tail for tail in tails if (key, tuple(tail)) not in self._memo]
            evaluated = 0
            if missing:
                evaluated = self._prefill(llama, head)
                for tail in missing:
                    tail = tail[: self.n_ctx - 1 - len(head)]
                    self._remember((key, tuple(tail)), self._mean(llama, len(head), tail))
                    evaluated += len(tail)
            scores = [self._memo[(key, tuple(tail[: self.n_ctx - 1 - len(head)]))] for tail in tails]
            return scores, Usage(evaluated, 0)

    @staticmethod
    def _prefill(llama: Any, head: list[int]) -> int:
        """Evaluate `head`, keeping the cached tokens it shares with what was evaluated before (the
        last one is always evaluated again: its logits score the first token of a reply)."""
        cached = list(llama.input_ids[: llama.n_tokens])
        common = 0
        for old, new in zip(cached, head[:-1], strict=False):
            if old != new:
                break
            common += 1
        llama.n_tokens = common  # llama.eval drops the cache past n_tokens
        llama.eval(head[common:])
        return len(head) - common

    def _remember(self, key: tuple[tuple[int, ...], tuple[int, ...]], score: float) -> None:
        self._memo[key] = score
        while len(self._memo) > MEMO_SIZE:
            self._memo.pop(next(iter(self._memo)))

    @staticmethod
    def _mean(llama: Any, start: int, tail: list[int]) -> float:
        import numpy as np

        llama.n_tokens = start  # drop the previous candidate; the prompt's cache stays
        llama.eval(tail)
        logits = np.asarray(llama.scores[start - 1 : start - 1 + len(tail)], dtype=np.float64)
        top = logits.max(axis=1, keepdims=True)
        logprobs = logits - (top + np.log(np.exp(logits - top).sum(axis=1, keepdims=True)))
        return float(logprobs[np.arange(len(tail)), tail].mean())

    def tokenizer(self) -> Any:
        """The loaded model, for its vocabulary: counting tokens the server does not report (blocking).

        A vocabulary-only load would do, but llama.cpp then prints a context warning on our stderr."""
        with self._lock:
            return self._load()

    def _load(self) -> Any:
        if self._llama is None:
            from llama_cpp import Llama

            self._llama = Llama(
                model_path=str(self.model),
                n_ctx=self.n_ctx,
                logits_all=True,
                n_threads=SCORE_THREADS,
                verbose=False,
            )
        return self._llama

    def close(self) -> None:
        """Free the model (blocking: waits for an evaluation in progress)."""
        with self._lock:
            if self._llama is not None:
                self._llama.close()
                self._llama = None
                self._memo.clear()
