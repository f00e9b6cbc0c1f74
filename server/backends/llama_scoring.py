"""How likely a llama.cpp model finds a reply (the `local` backend's `score`), and its token counts, asked
of the model's llama.cpp server through its own endpoints (llama_server.py starts it).

    native = Native(httpx_client)                     # base_url: the server's root, with its API key
    scores, usage = await scorer.score(native, request, ["Paris.", "London."])

A score is the mean log-probability per token the model gives a reply after the request rendered with
the chat template the server uses for a chat call (`/apply-template`). llama.cpp's server reports no
log-probabilities for prompt tokens, so each reply is made the model's own output: a `/completion` after
the rendered prompt whose grammar allows exactly the reply's tokens (`<[id]>` terminals), with `n_probs`.
The server reports each output token's log-probability before sampling, grammar included (llama.cpp's
`post_sampling_probs: false`), so the numbers are the model's own, as if the reply had been evaluated
after the prompt. The server's prompt cache keeps the prompt between the replies: only a reply's own
tokens are evaluated, one decoding step each.
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx2

from conclave.backends.base import Request, Usage

SCORE_CTX = 2048  # prompt + reply; a longer prompt is cut from its start, a longer reply at its end
MEMO_SIZE = 512  # (prompt, reply) scores kept: a job's re-votes score the same answers again


class NativeError(Exception):
    """The server answered a native endpoint with something other than what it documents."""


class Native:
    """llama.cpp's server's own endpoints (not the OpenAI-compatible ones), on a client the caller owns."""

    def __init__(self, client: httpx2.AsyncClient) -> None:
        self._client = client

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        response = await self._client.post(path, json=body)
        if response.status_code != 200:
            raise NativeError(f"{path} answered {response.status_code}: {response.text[:300]}")
        return response.json()

    async def render(self, request: Request) -> str:
        """`request` as the model sees it, up to the start of its reply (the server's chat template)."""
        messages = [{"role": "system", "content": request.system}] if request.system else []
        messages += [{"role": message.role, "content": message.content} for message in request.messages]
        reply = await self._post("/apply-template", {"messages": messages})
        return str(reply["prompt"])

    async def tokenize(self, text: str, *, template: bool = False) -> list[int]:
        """`text`'s tokens; `template`: a rendered prompt, with its special tokens and the model's BOS."""
        body = {"content": text, "add_special": template, "parse_special": template}
        return [int(token) for token in (await self._post("/tokenize", body))["tokens"]]

    async def count(self, text: str) -> int:
        """How many tokens `text` has for this model."""
        return len(await self.tokenize(text))

    async def end_of_text(self) -> int:
        """The model's end-of-text token: the reply an empty answer stands for."""
        response = await self._client.get("/props")
        if response.status_code != 200:
            raise NativeError(f"/props answered {response.status_code}: {response.text[:300]}")
        found = await self.tokenize(str(response.json()["eos_token"]), template=True)
        return found[-1]

    async def forced(self, prompt: list[int], reply: list[int]) -> tuple[list[float], int]:
        """Each token of `reply` decoded after `prompt` with its log-probability, and the tokens evaluated
        (the prompt's tokens the slot's cache did not hold, and the reply's)."""
        grammar = "root ::= " + " ".join(f"<[{token}]>" for token in reply)
        return await self._decoded(prompt, reply, {"grammar": grammar})

    async def ending(self, prompt: list[int], end: int) -> tuple[list[float], int]:
        """`forced` for the reply that ends at once (`end`, the end-of-text token): a grammar cannot
        name an end-of-generation token, so a logit bias forces it; log-probabilities are taken before
        any bias, as before a grammar."""
        return await self._decoded(prompt, [end], {"logit_bias": [[end, 1000.0]]})

    async def _decoded(
        self, prompt: list[int], reply: list[int], forcing: dict[str, Any]
    ) -> tuple[list[float], int]:
        body = {
            "prompt": prompt,
            "n_predict": len(reply),
            "n_probs": 1,
            "samplers": [],  # the forcing leaves one token: nothing to sample
            "cache_prompt": True,
            **forcing,
        }
        found = await self._post("/completion", body)
        steps = found.get("completion_probabilities") or []
        tokens = [int(step["id"]) for step in steps]
        if tokens != reply:
            raise NativeError(f"/completion decoded {tokens[:8]}..., not the forced reply {reply[:8]}...")
        timings = found.get("timings") or {}
        evaluated = int(timings.get("prompt_n", len(prompt))) + len(reply)
        return [float(step["logprob"]) for step in steps], evaluated


class ModelScores:
    """The scores one model file gave (kept per process, by LocalServers), and one scoring at a time."""

    def __init__(self, n_ctx: int = SCORE_CTX) -> None:
        self.n_ctx = n_ctx
        self._lock = anyio.Lock()
        self._memo: dict[tuple[tuple[int, ...], tuple[int, ...]], float] = {}  # (prompt, reply) -> score
        self._end: int | None = None

    async def score(
        self, native: Native, request: Request, candidates: list[str]
    ) -> tuple[list[float], Usage]:
        """Each candidate's mean token log-probability as the reply to `request`.

        Only what is new is evaluated: the candidates not scored after this prompt before, and of the
        prompt what the server's cache does not hold. The usage counts the tokens evaluated, so a
        re-vote on the same answers costs nothing.
        """
        async with self._lock:
            head = await native.tokenize(await native.render(request), template=True)
            tails = [await native.tokenize(text) for text in candidates]
            room = self.n_ctx - 1 - min(max(1, *map(len, tails)), self.n_ctx // 2)
            head = head[-room:]
            key = tuple(head)
            tails = [tail[: self.n_ctx - 1 - len(head)] for tail in tails]
            evaluated = 0
            for tail in tails:
                if (key, tuple(tail)) not in self._memo:
                    if tail:
                        logprobs, cost = await native.forced(head, tail)
                    else:  # an empty reply: how likely the model is to stop at once
                        logprobs, cost = await native.ending(head, await self._end_of_text(native))
                    self._remember((key, tuple(tail)), sum(logprobs) / len(logprobs))
                    evaluated += cost
            return [self._memo[(key, tuple(tail))] for tail in tails], Usage(evaluated, 0)

    async def _end_of_text(self, native: Native) -> int:
        if self._end is None:
            self._end = await native.end_of_text()
        return self._end

    def _remember(self, key: tuple[tuple[int, ...], tuple[int, ...]], score: float) -> None:
        self._memo[key] = score
        while len(self._memo) > MEMO_SIZE:
            self._memo.pop(next(iter(self._memo)))
