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

from conclave.backends.base import (
    Backend,
    JsonObject,
    Message,
    Request,
    Scorer,
    ToolCall,
    ToolSpec,
    Usage,
    estimated_input,
)
from conclave.backends.retry import Completion, RetryPolicy, complete
from conclave.config.models import AgentSpec
from conclave.errors import ProviderError
from conclave.files.agent_tools import ToolHandler


class UsageSink(Protocol):
    """Hears every Usage: (usage, opens_attempt) as retry.py's UsageCallback; a CLI member's carries its
    own cost when its CLI reported one."""

    def __call__(self, usage: Usage, first: bool, /) -> Awaitable[None]: ...


@dataclass
class InFlight:
    """The estimated input tokens of one agent's calls charged by `Provisional` and not yet reported:
    left out of its limits (members.py `Member.spent`) while they fly."""

    tokens: int = 0


@dataclass
class Provisional:
    """One API call's charge before its provider says anything: the call is charged its estimated input
    (`Usage.estimated_input_tokens`) as it starts, stored like any charge, so a call that never reports
    stays charged: its turn cancelled (a stale turn, a budget's stop, a timeout), or its worker killed
    (the charge is already in the store when a takeover resumes the job, which does not charge it again).
    The provider's first report takes the estimate back and counts its own figures instead; a call that
    ends in a provider error before any report (a 429, a refused request) billed nothing, and is refunded.
    """

    sink: UsageSink
    estimate: int
    flight: InFlight
    open: bool = False  # charged the estimate, and no report has taken it back yet
    flying: bool = False  # in `flight`: the call has neither reported nor ended

    async def start(self) -> None:
        self.open = self.flying = True
        self.flight.tokens += self.estimate
        await self.sink(self._estimate(), True)  # the call counts from here

    async def heard(self, usage: Usage, first: bool) -> None:
        """A provider's report (retry.py's UsageCallback): the first one replaces the estimate."""
        if first and self.open:
            self.open = False
            self.land()
            await self.sink(usage - self._estimate(), False)  # the same call, now as its provider says
        else:
            await self.sink(usage, first)

    async def refund(self) -> None:
        """The call failed with a provider error before any report: nothing billed, no call."""
        self.land()
        if self.open:
            self.open = False
            await self.sink(replace(-self._estimate(), calls=-1), False)

    def land(self) -> None:
        """The call reported or ended: an estimate still charged now stays, and counts."""
        if self.flying:
            self.flying = False
            self.flight.tokens -= self.estimate

    def _estimate(self) -> Usage:
        return Usage(self.estimate, estimated_input_tokens=self.estimate)


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
    # the estimates of this agent's calls not yet reported (`Provisional`), which its limits leave out
    in_flight: InFlight = field(default_factory=InFlight)
    # Awaited before every model call: once the job's budget is reached it never returns, so no call
    # starts after the limit (the job's end cancels the waiting turn).
    gate: Callable[[], Awaitable[None]] = anyio.lowlevel.checkpoint
    # Why this agent may start no more provider calls (its own token limit, or the job's budget), else
    # None; asked synchronously by a CLI member's egress proxy before each call it forwards.
    stopped: Callable[[], str | None] = field(default=lambda: None)

    async def call(self, backend: Backend, request: Request) -> Completion:
        """One call to `backend` under this agent's provider limit, retry policy and overall deadline,
        charged from its start (`Provisional`)."""
        limit = self.spec.timeout_s * self.spec.max_attempts + 30
        await self.gate()
        async with self.limiter:
            with anyio.fail_after(limit):
                policy = replace(self.retry, max_attempts=self.spec.max_attempts)
                charge = Provisional(self.on_usage, estimated_input(request), self.in_flight)
                await charge.start()
                try:
                    return await complete(backend, request, policy, on_usage=charge.heard)
                except ProviderError:
                    with anyio.CancelScope(shield=True):
                        await charge.refund()
                    raise
                finally:
                    charge.land()

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
