"""A CLI run's usage charged while it runs, as its output reports it, so a job's budget can stop a long
run in the middle (the stop cancels the turn, which kills the run: member.py). A key login's run is
charged by its egress proxy instead, call by call (`ProxyCharges`): what its CLI says of its tokens is
not counted then.

    meter = Meter(member.reported, member.streamed, charge, spec.price)
    await meter.update(stdout_so_far)          # as output arrives: charges what is new since last time
    await meter.update(stdout, final=True)     # once, at the end (finished or killed): the run's total

What counts as reported mid-run: Claude Code's per-response usage (`streamed_usage`: each response's
`message_start` and `message_delta`), as the API billed it. Codex (`turn.completed`), Gemini CLI (the
`result` event) and Copilot CLI (its usage file, at a clean exit) say their tokens only when the run ends,
so until then the run is charged the estimate (clis/member.py `reported`: four characters a token over
the prompt and the printed stream, a lower bound). The final update charges the difference to the run's
own total, which may take back part of an estimate (a negative delta in a field), so the member's usage
ends at what its CLI reported. Claude Code's mid-run charges have no cost (it says one only in its
result): without a price the member's cost is partial while the run goes, and the final charge, the
run's whole cost, makes it whole again; a run killed before its result leaves it partial.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from conclave.backends.base import Usage
from conclave.config.models import Price
from conclave.sandbox.provider_wire import Billed

# a run's new usage (with its cost when known), to the job; `first`: the run's first charge (one call)
Charge = Callable[[Usage, bool], Awaitable[None]]
Report = Callable[[str], tuple[Usage, float | None]]  # stdout -> (usage, cost) so far


@dataclass
class Meter:
    """One run's charges: `live` reads a partial stream, `final` the whole of it (finished or killed)."""

    live: Report
    final: Report
    charge: Charge
    price: Price | None = None
    charged: Usage = Usage()  # the run's usage charged so far, as the job counts it (priced)
    opened: bool = False  # charged at least once (a run killed before it said anything still counts)

    async def update(self, stdout: str, *, final: bool = False) -> None:
        usage, cost = (self.final if final else self.live)(stdout)
        if not final:
            # mid-run, a figure only grows: a lower one (an estimate before the first real report) waits
            usage = Usage(
                *(max(now, then) for now, then in zip(_fields(usage), _fields(self.charged), strict=True)),
                # the input charged is the estimate's while it is the larger: it stays marked as one
                estimated_input_tokens=(
                    usage.estimated_input_tokens
                    if usage.input_tokens >= self.charged.input_tokens
                    else self.charged.estimated_input_tokens
                ),
            )
        # the CLI's own cost covers the whole run (Claude Code's, in its result): the difference takes
        # back the uncosted tokens of the run's earlier charges (backends/base.py `Usage`)
        now = usage.costing(cost).priced(self.price)
        delta = now - self.charged
        if delta.nothing and (self.opened or not final):
            return
        first, self.opened, self.charged = not self.opened, True, now
        await self.charge(delta, first)


@dataclass
class ProxyCharges:
    """One key-login run's charges as its egress proxy makes them (sandbox/egress.py `meter_to`): each
    call's usage from its provider's response, then, at the run's end, the CLI's own cost, if it says
    one and the member has no price, as a charge of no tokens that covers the run's (the proxy's charges
    come without a cost). A run is one call at least, as a `Meter`'s is."""

    charge: Charge
    tokens: int = 0
    calls: int = 0

    async def __call__(self, billed: Billed, first: bool) -> None:
        self.tokens += billed.tokens
        self.calls += int(first)
        await self.charge(Usage(billed.input_tokens, billed.output_tokens, billed.cached_input_tokens), first)

    async def close(self, cost_usd: float | None, price: Price | None) -> None:
        """The run ended (finished or killed): its CLI reported `cost_usd` for it (None: no cost)."""
        if cost_usd is not None and price is None:
            await self.charge(Usage(cost_usd=cost_usd, uncosted_tokens=-self.tokens), self.calls == 0)
        elif self.calls == 0:
            await self.charge(Usage(), True)


def _fields(usage: Usage) -> tuple[int, int, int]:
    return usage.input_tokens, usage.output_tokens, usage.cached_input_tokens
