"""What a running job reports: its events, the live progress, usage per agent, and how it ended.

The orchestrator produces these; the job store keeps them and the views read them back.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from conclave.backends.base import Usage
from conclave.config import Price

EventKind = Literal[
    "started",
    "turn_started",
    "turn_cancelled",
    "tool_call",
    "answer",
    "snapshot_failed",
    "vote",
    "vote_discarded",
    "no_decision",
    "turn_failed",
    "answer_refused",
    "agent_failed",
    "usage",
    "deadline",
    "presenting",
    "finished",
]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class UsageTotals(_Record):
    """Tokens and, where the price is known, US dollars; `calls`: provider attempts that reported usage."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cost_usd: float | None = None

    def add(self, usage: Usage, price: Price | None, call: bool = True) -> UsageTotals:
        """These totals plus one report (`call`: the first of its attempt); an agent without a price has
        no cost, never a guessed one."""
        cost = None
        if price is not None:
            cached_price = price.input if price.cached_input is None else price.cached_input
            fresh = usage.input_tokens - usage.cached_input_tokens
            call = fresh * price.input + usage.cached_input_tokens * cached_price + usage.output_tokens * price.output
            cost = (self.cost_usd or 0.0) + call / 1e6
        return UsageTotals(
            calls=self.calls + int(call),
            input_tokens=self.input_tokens + usage.input_tokens,
            output_tokens=self.output_tokens + usage.output_tokens,
            cached_input_tokens=self.cached_input_tokens + usage.cached_input_tokens,
            cost_usd=cost,
        )

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @staticmethod
    def total(parts: list[UsageTotals]) -> UsageTotals:
        """The sum; cost only when every part with calls has a known cost (never a partial figure)."""
        costs = [part.cost_usd for part in parts if part.calls]
        return UsageTotals(
            calls=sum(part.calls for part in parts),
            input_tokens=sum(part.input_tokens for part in parts),
            output_tokens=sum(part.output_tokens for part in parts),
            cached_input_tokens=sum(part.cached_input_tokens for part in parts),
            cost_usd=sum(c for c in costs if c is not None) if costs and None not in costs else None,
        )


class JobEvent(_Record):
    """One thing that happened in a job, in order; the transcript is the list of these."""

    kind: EventKind
    letter: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    at: float = 0.0  # seconds since the job started


AgentStateName = Literal["working", "voted", "waiting", "presenting", "done", "failed"]


class AgentProgress(_Record):
    letter: str
    model: str
    state: AgentStateName
    answers: int = 0
    vote: str | None = None
    error: str | None = None
    usage: UsageTotals = UsageTotals()


class Progress(_Record):
    """The live picture of a running job."""

    phase: str
    round: int = 0  # the answer-set version: bumps with every new answer
    agents: list[AgentProgress] = Field(default_factory=list)
    tally: dict[str, int] = Field(default_factory=dict)
    agree: list[list[str]] = Field(default_factory=list)  # current answers with the same final answer


class JobResult(_Record):
    """How a job ended. `consensus`: a strict majority of the `voters` valid votes went to the winner
    or answers equivalent to it (`votes` of them); `all_voted` is separate. `fallback`: the vote never
    finished (a timeout, all but one agent failed) and the winner is the best-supported answer so far."""

    answer: str | None
    winner: str | None
    consensus: bool
    tie: bool = False
    reason: str
    tally: dict[str, int] = Field(default_factory=dict)
    presented_by: str | None = None
    failed: bool = False
    errors: dict[str, str] = Field(default_factory=dict)
    votes: int = 0
    voters: int = 0
    all_voted: bool = False
    fallback: bool = False
    agree: list[list[str]] = Field(default_factory=list)  # current answers with the same final answer
