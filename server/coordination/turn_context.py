"""What the job gives one agent for every turn: its spec, limits, prompts, work tools, gate and sinks.

Every kind of agent is handed it with each turn (agents.py); what the agent calls (a backend, a scorer,
a CLI) it holds itself. The orchestrator builds one per agent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

import anyio
import anyio.lowlevel

from conclave.backends.base import Backend, JsonObject, Message, Request, Scorer, ToolCall, ToolSpec, Usage
from conclave.backends.retry import Completion, RetryPolicy, complete
from conclave.config.models import AgentSpec
from conclave.files.agent_tools import ToolHandler


class UsageSink(Protocol):
    """Hears every Usage: (usage, opens_attempt) as retry.py's UsageCallback; a CLI member's carries its
    own cost when its CLI reported one."""

    def __call__(self, usage: Usage, first: bool, /) -> Awaitable[None]: ...


@dataclass
class TurnContext:
    """What one agent needs for every turn of a job."""

    spec: AgentSpec
    letter: str
    system: str
    task: str
    retry: RetryPolicy
    limiter: anyio.CapacityLimiter
    on_usage: UsageSink  # every Usage a provider reports, as it arrives (retries and cancelled calls too)
    on_work: Callable[[ToolCall], Awaitable[None]]
    max_tool_steps: int = 8
    work_tools: tuple[ToolSpec, ...] = ()
    handlers: Mapping[str, ToolHandler] = field(default_factory=dict)
    # Awaited before every model call: once the job's budget is reached it never returns, so no call
    # starts after the limit (the job's end cancels the waiting turn).
    gate: Callable[[], Awaitable[None]] = anyio.lowlevel.checkpoint
    # Why this agent may start no more provider calls (its own token limit, or the job's budget), else
    # None; asked synchronously by a CLI member's egress proxy before each call it forwards.
    stopped: Callable[[], str | None] = field(default=lambda: None)

    async def call(self, backend: Backend, request: Request) -> Completion:
        """One call to `backend` under this agent's provider limit, retry policy and overall deadline."""
        limit = self.spec.timeout_s * self.spec.max_attempts + 30
        await self.gate()
        async with self.limiter:
            with anyio.fail_after(limit):
                policy = replace(self.retry, max_attempts=self.spec.max_attempts)
                return await complete(backend, request, policy, on_usage=self.on_usage)

    async def score(self, scorer: Scorer, request: Request, candidates: list[str]) -> list[float]:
        """The model's mean token log-probability of each candidate as its reply."""
        await self.gate()
        async with self.limiter:
            with anyio.fail_after(self.spec.timeout_s):
                scores, usage = await scorer.score(request, candidates)
        await self.on_usage(usage, True)
        return scores

    def request(
        self,
        messages: list[Message],
        *,
        system: str | None = None,
        tools: tuple[ToolSpec, ...] = (),
        tool_choice: Literal["auto", "required"] = "auto",
        response_schema: JsonObject | None = None,
        max_tokens: int | None = None,
    ) -> Request:
        """This agent's request: its system prompt and settings unless the call names others."""
        return Request(
            system=self.system if system is None else system,
            messages=tuple(messages),
            tools=tools,
            tool_choice=tool_choice,
            response_schema=response_schema,
            temperature=self.spec.temperature,
            max_tokens=self.spec.max_tokens if max_tokens is None else max_tokens,
            seed=self.spec.seed,
        )
