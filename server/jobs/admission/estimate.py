"""What a job of a team may use, from the team's prices and this server's past jobs of that team.

`history` gives list_teams the typical (median) tokens and cost per job: a `TeamHistory`, the one
record of what the team's past jobs used. `estimate` gives ask_team's first result that record with a
range beside it (the least and the most a past job of the team used here, priced at the team's prices
now; the budget caps the top): an `Estimate` is built from the `TeamHistory`, never figured apart; with
no history it says so and gives only what a budget bounds. Both read `Store.team_usage`.
"""

from __future__ import annotations

from dataclasses import replace
from statistics import median

from conclave.config.models import Team
from conclave.jobs.derived import Estimate
from conclave.jobs.read.teams import TeamHistory
from conclave.jobs.read.views import plural
from conclave.jobs.store.sql import AgentUsage


def _cost(team: Team, job: list[AgentUsage]) -> float | None:
    """A past job's cost at the team's prices now (by model; else what was recorded); None if unknown
    (a cost recorded for only part of an agent's tokens is no figure for an estimate)."""
    prices = {agent.model: agent.price for agent in reversed(team.agents) if agent.price is not None}
    total = 0.0
    for row in job:
        price = prices.get(row.model)
        tokens = row.usage if price is None else replace(row.usage, cost_usd=None)
        cost = tokens.priced(price)
        if cost.cost_usd is None or cost.cost_partial:
            return None
        total += cost.cost_usd
    return total


def _tokens(job: list[AgentUsage]) -> int:
    return sum(row.usage.tokens for row in job)


def estimate(team: Team, past: list[list[AgentUsage]]) -> Estimate:
    """The range a job of `team` may use (see the module docstring)."""
    rules = team.coordination
    cap = _cost_cap(team)
    if not past:
        note = f"no past jobs of team {team.name!r} on this server, so no range yet"
        bound = [0.0, round(cap, 4)] if cap is not None else None
        if bound:
            note += f"; the budget stops it at about ${cap:.4f}"
        return Estimate(jobs=0, cost_usd=bound, note=note)
    tokens = [_tokens(job) for job in past]
    costs = [_cost(team, job) for job in past]
    typical = _typical(tokens, costs)
    low, high = min(tokens), max(tokens)
    if rules.max_tokens is not None:
        low, high = min(low, rules.max_tokens), min(high, rules.max_tokens)
    known = [cost for cost in costs if cost is not None]
    cost_range = None
    if typical.typical_cost_usd is not None:  # every past job's cost is known
        top = min(max(known), cap) if cap is not None else max(known)
        cost_range = [round(min(min(known), top), 4), round(top, 4)]
    capped = " (the budget caps the top)" if rules.max_tokens or rules.max_cost_usd else ""
    priced = "" if cost_range else "; no cost: an agent has no price"
    last = plural(len(past), "completed job")
    note = f"from the last {last} of team {team.name!r} on this server{capped}{priced}"
    return Estimate(**typical.model_dump(), tokens=[low, high], cost_usd=cost_range, note=note)


def _cost_cap(team: Team) -> float | None:
    """The most a budget lets the job spend: max_cost_usd, or max_tokens at the team's dearest token."""
    rules = team.coordination
    if rules.max_cost_usd is not None:
        return rules.max_cost_usd
    prices = [max(agent.price.input, agent.price.output) for agent in team.agents if agent.price]
    if rules.max_tokens is None or team.unpriced() or len(prices) < len(team.agents):
        return None  # an agent whose cost its CLI reports (cli/claude-code) has no price to cap it by
    return rules.max_tokens * max(prices) / 1e6


def history(team: Team, past: list[list[AgentUsage]]) -> TeamHistory | None:
    """Typical tokens and cost per job of `team` here; None without history."""
    if not past:
        return None
    return _typical([_tokens(job) for job in past], [_cost(team, job) for job in past])


def _typical(tokens: list[int], costs: list[float | None]) -> TeamHistory:
    """The median tokens and cost of past jobs (one or more); no cost unless every job's is known (a
    partial figure is no figure)."""
    known = [cost for cost in costs if cost is not None]
    cost = round(median(known), 4) if len(known) == len(costs) else None
    return TeamHistory(jobs=len(tokens), typical_tokens=int(median(tokens)), typical_cost_usd=cost)
