"""Scripts for the fake provider servers: per-agent queues of replies, and a record of every request.

An agent is named by the path prefix of its `base_url` (see `server.FakeProviders.base_url`), so one
fake server can play every agent of a team. A reply is a `Reply`, or a function of the recorded
request returning one (for turns whose content depends on the prompt, e.g. "vote for the label you
see").
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread

from tests.fakes.prompt_cache import PromptCache

GATE_LIMIT_S = 120  # a gate the test never opened lets the reply go after this, so a failed test still ends


@dataclass
class Reply:
    """What the fake sends back for one request.

    `tool_calls` pairs a tool name with its arguments: a dict is sent as JSON, a str is sent as is
    (use it for malformed arguments). `status` other than 200 sends the provider's error body;
    `retry_after` adds a Retry-After header. `cut_stream` drops the connection after the first chunk
    of a streamed reply; `stall` waits that long after the first chunk of a streamed reply (Anthropic's
    message_start, Gemini's first chunk: each already carries the input usage) before the rest;
    `garbage` sends a body that is not the provider's format. `usage` is (input, output, cached_input);
    by default it is derived from the request and reply sizes. `gate`: the reply is held until the test
    sets this event (waited for in a worker thread, so the fake keeps serving the other agents), which
    orders a job's events without sleeping.
    """

    text: str = ""
    tool_calls: list[tuple[str, dict[str, Any] | str]] = field(default_factory=list)
    delay: float = 0.0
    status: int = 200
    retry_after: float | None = None
    error_message: str = "scripted error"
    usage: tuple[int, int, int] | None = None
    cut_stream: bool = False
    stall: float = 0.0
    garbage: bool = False
    gate: threading.Event | None = None

    async def pass_gate(self) -> None:
        if self.gate is not None:
            await anyio.to_thread.run_sync(self.gate.wait, GATE_LIMIT_S, abandon_on_cancel=True)


@dataclass
class RecordedRequest:
    """One request as the fake received it."""

    provider: str
    agent: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    streamed: bool

    def text(self) -> str:
        """All of the request body as text, for `in` assertions about prompts."""
        return json.dumps(self.body, ensure_ascii=False)


Responder = Reply | Callable[[RecordedRequest], Reply]


class Script:
    """Per-agent reply queues shared between a test and the fake servers (thread-safe).

    `bill` is what the fakes reported as used, per agent: (input, output, cached_input) summed over
    every usage figure they sent, the moment they sent it (a stream's early input usage included, an
    error reply or a cut body before any usage not), the way a provider bills.
    """

    def __init__(self, *, prompt_cache: bool = False) -> None:
        self.cache = PromptCache(prompt_cache)  # cached input as each provider reports it (prompt_cache.py)
        self._lock = threading.Lock()
        self._queues: dict[str, deque[Responder]] = {}
        self._defaults: dict[str, Responder] = {}
        self.requests: list[RecordedRequest] = []
        self.bill: dict[str, tuple[int, int, int]] = {}

    def charge(self, agent: str, input_tokens: int, output_tokens: int, cached: int = 0) -> None:
        """Add what a fake just sent as usage (input includes cached, as Conclave counts it)."""
        with self._lock:
            old = self.bill.get(agent, (0, 0, 0))
            self.bill[agent] = (old[0] + input_tokens, old[1] + output_tokens, old[2] + cached)

    def enqueue(self, agent: str, *replies: Responder) -> Script:
        with self._lock:
            self._queues.setdefault(agent, deque()).extend(replies)
        return self

    def set_default(self, agent: str, responder: Responder) -> Script:
        """Used whenever the agent's queue is empty."""
        with self._lock:
            self._defaults[agent] = responder
        return self

    def next_reply(self, request: RecordedRequest) -> Reply:
        with self._lock:
            self.requests.append(request)
            queue = self._queues.get(request.agent)
            responder = queue.popleft() if queue else self._defaults.get(request.agent)
        if responder is None:
            return Reply(status=500, error_message=f"script has no reply left for agent {request.agent!r}")
        return responder(request) if callable(responder) else responder

    def requests_of(self, agent: str) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.agent == agent]

    def pending(self, agent: str) -> int:
        with self._lock:
            return len(self._queues.get(agent, ()))


def estimate_tokens(text: str) -> int:
    """A stable stand-in for a tokenizer: about four characters a token."""
    return max(1, len(text) // 4)


def usage_for(
    reply: Reply, request: RecordedRequest, output_text: str, cached: int = 0
) -> tuple[int, int, int]:
    """The usage a fake reports: scripted, else derived from the sizes, with the `cached` input its
    prompt cache found (prompt_cache.py) among the input."""
    if reply.usage is not None:
        return reply.usage
    prompt = estimate_tokens(request.text())
    return prompt, estimate_tokens(output_text), min(cached, prompt)
