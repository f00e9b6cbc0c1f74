"""A CLI run's usage charged while it runs, as its output reports it, so a job's budget can stop a long
run in the middle (the stop cancels the turn, which kills the run: runner.py).

    meter = Meter(member.reported, member.streamed, charge, spec.price)
    await meter.update(stdout_so_far)          # as output arrives: charges what is new since last time
    await meter.update(stdout, final=True)     # once, at the end (finished or killed): the run's total

What counts as reported mid-run: Claude Code's per-response usage (`streamed_usage`: each response's
`message_start` and `message_delta`), as the API billed it. Codex (`turn.completed`), Gemini CLI (the
`result` event) and Copilot CLI (its usage file, at a clean exit) say their tokens only when the run ends,
so until then the run is charged the estimate (members/runner.py `reported`: four characters a token over
the prompt and the printed stream, a lower bound). The final update charges the difference to the run's
own total, which may take back part of an estimate (a negative delta in a field), so the member's usage
ends at what its CLI reported.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from conclave.backends.base import Usage
from conclave.config.models import Price

# a run's usage and cost so far, to the job; `first`: the run's first charge (it counts one call)
Charge = Callable[[Usage, float | None, bool], Awaitable[None]]
Report = Callable[[str], tuple[Usage, float | None]]  # stdout -> (usage, cost) so far


@dataclass
class Meter:
    """One run's charges: `live` reads a partial stream, `final` the whole of it (finished or killed)."""

    live: Report
    final: Report
    charge: Charge
    price: Price | None = None
    charged: Usage = Usage()
    opened: bool = False  # charged at least once (a run killed before it said anything still counts)

    async def update(self, stdout: str, *, final: bool = False) -> None:
        usage, cost = (self.final if final else self.live)(stdout)
        if not final:
            # mid-run, a figure only grows: a lower one (an estimate before the first real report) waits
            usage = Usage(
                *(max(now, then) for now, then in zip(_fields(usage), _fields(self.charged), strict=True))
            )
        delta = usage - self.charged
        if cost is not None:  # the CLI's own cost for the whole run (Claude Code): what was priced so far
            cost -= _priced(self.charged, self.price)  # went in already
        if delta == Usage() and not cost and (self.opened or not final):
            return
        first, self.opened, self.charged = not self.opened, True, usage
        await self.charge(delta, cost, first)


def _fields(usage: Usage) -> tuple[int, int, int]:
    return usage.input_tokens, usage.output_tokens, usage.cached_input_tokens


def _priced(usage: Usage, price: Price | None) -> float:
    """What the job's usage priced these tokens at (coordination/reports.py `UsageTotals.add`)."""
    if price is None:
        return 0.0
    cached = price.input if price.cached_input is None else price.cached_input
    fresh = usage.input_tokens - usage.cached_input_tokens
    return (
        fresh * price.input + usage.cached_input_tokens * cached + usage.output_tokens * price.output
    ) / 1e6
