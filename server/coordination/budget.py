"""A job's budget (its token and cost limits) and each member's own token limit, watched as every Usage
arrives.

Once the job's usage reaches a limit, `gate` (awaited before every model call, turns.py) never returns,
so no call starts after it, and `watch` feeds the protocol a `Stop`: turns in flight are cancelled and
the job ends with the best-supported answer so far, without a presentation.
"""

from __future__ import annotations

import anyio
import anyio.lowlevel
from anyio.streams.memory import MemoryObjectSendStream

from conclave.backends.base import Usage
from conclave.coordination.protocol_events import ProtocolEvent, Stop
from conclave.coordination.tally import StopReason

BUDGET_REACHED = "budget reached"  # how a stopped job's reason begins
MEMBER_LIMIT_REACHED = "its own token limit reached"  # how a member's drop begins


class JobBudget:
    """The limits of one job; None means no limit."""

    def __init__(self, max_tokens: int | None, max_cost_usd: float | None) -> None:
        self.max_tokens, self.max_cost_usd = max_tokens, max_cost_usd
        self.reason: str | None = None
        self._reached = anyio.Event()

    @property
    def limited(self) -> bool:
        return self.max_tokens is not None or self.max_cost_usd is not None

    def charge(self, totals: Usage) -> None:
        """Look at the job's usage so far; the first time it reaches a limit, say so and stop calls."""
        if self.reason is not None:
            return
        if self.max_tokens is not None and totals.tokens >= self.max_tokens:
            self.reason = f"{BUDGET_REACHED}: {totals.tokens:,} tokens used of max_tokens {self.max_tokens:,}"
        elif self.max_cost_usd is not None and (totals.cost_usd or 0.0) >= self.max_cost_usd:
            self.reason = (
                f"{BUDGET_REACHED}: ${totals.cost_usd:.4f} spent of max_cost_usd ${self.max_cost_usd:g}"
            )
        if self.reason is not None:
            self._reached.set()

    async def gate(self) -> None:
        """Return at once under the limit; past it, wait to be cancelled (the job is ending)."""
        if self.reason is not None:
            await anyio.sleep_forever()
        await anyio.lowlevel.checkpoint()

    async def watch(self, send: MemoryObjectSendStream[ProtocolEvent]) -> None:
        """Feed the protocol a Stop the moment the budget is reached."""
        async with send:
            await self._reached.wait()
            assert self.reason is not None
            await send.send(Stop(self.reason, StopReason.BUDGET))


class MemberLimit:
    """One member's own token limit (its team entry's `budget.max_tokens`), beside the job's.

    Reaching it drops the member alone: the orchestrator fails its turn in flight for good (the protocol's
    fatal `TurnFailed`), so it takes no more turns, its vote no longer counts, and the job goes on with
    the others; the result's `errors` carries `reason`.
    """

    def __init__(self, max_tokens: int | None) -> None:
        self.max_tokens = max_tokens
        self.reason: str | None = None

    def reached(self, usage: Usage) -> bool:
        """Look at the member's usage so far; True the first time it reaches the limit."""
        if self.reason is not None:
            return False
        self.reason = self.over(usage)
        return self.reason is not None

    def over(self, usage: Usage) -> str | None:
        """Why `usage` is at or past the limit, else None; records nothing (a proxy asks it per call)."""
        if self.max_tokens is None or usage.tokens < self.max_tokens:
            return None
        return (
            f"{MEMBER_LIMIT_REACHED}: {usage.tokens:,} tokens used of its budget.max_tokens "
            f"{self.max_tokens:,}; it takes no more turns and the others go on (raise its budget.max_tokens "
            "in the team file to let it spend more)"
        )
