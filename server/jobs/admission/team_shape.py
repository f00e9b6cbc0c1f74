"""What a job will run with: the caller's `verify` and budgets (the job's, and one for every member) laid
over the team's own, checked at submit.

A caller may lower a team's limits, never raise them, and no job exceeds the server's ceilings
(`Ceilings`, from CONCLAVE_MAX_JOB_TOKENS, CONCLAVE_MAX_MEMBER_TOKENS, CONCLAVE_MAX_JOB_COST_USD): a
budget asked above either is refused (OverLimit, naming the field, the value and the limit), never
clamped, so a caller is never surprised by a smaller budget than the one it asked for; a team's own limit
above a ceiling runs at the ceiling, and a team without one gets the ceiling.

The result is the team stored with the job (its `verify` and `coordination.max_*` set), so a job's
limits are part of its record. Refused here, with the fix: a cost budget for a team with an agent
that has no price (its cost would be unknown), a budget that is not a positive number, and a `verify`
without context paths (there would be no files to check). A verify without Docker is refused by
file_steps.admit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from conclave.backends import check_ready
from conclave.clis.logins import cli_ready
from conclave.config.models import MAX_VERIFY_CHARS, AgentSpec, MemberBudgetSpec, Team
from conclave.errors import ConfigError, InputError, OverLimit, term
from conclave.jobs.request import JobRequest
from conclave.settings import Settings

Amount = TypeVar("Amount", int, float)


@dataclass(frozen=True)
class Ceilings:
    """The operator's limits for every job on this server (None: no ceiling)."""

    job_tokens: int | None = None
    member_tokens: int | None = None
    job_cost_usd: float | None = None

    @classmethod
    def of(cls, settings: Settings) -> Ceilings:
        return cls(settings.max_job_tokens, settings.max_member_tokens, settings.max_job_cost_usd)


def _bounded(
    field: str, asked: Amount | None, own: Amount | None, whose: str, ceiling: Amount | None, setting: str
) -> Amount | None:
    """The limit a job runs with: `asked` when it is within the team's own (`own`) and the ceiling, else
    refused; with nothing asked, the lower of the team's own and the ceiling."""
    if asked is None:
        return min((limit for limit in (own, ceiling) if limit is not None), default=None)
    if own is not None and asked > own:
        raise OverLimit(
            field,
            asked,
            f"{whose} allows at most {own:g}: a call may lower a team's limits, never raise them; ask for "
            f"{own:g} or less, or leave it out to use the team's",
        )
    if ceiling is not None and asked > ceiling:
        raise OverLimit(
            field,
            asked,
            f"this server allows at most {ceiling:g} ({setting}={ceiling:g}, the operator's ceiling); ask "
            f"for {ceiling:g} or less",
        )
    return asked


def _member_budgets(team: Team, asked: int | None, ceiling: int | None) -> list[AgentSpec]:
    """Every member with its limit: the caller's (within the member's own and the ceiling), else its own
    under the ceiling."""
    agents = []
    for agent in team.agents:
        own = agent.budget.max_tokens if agent.budget is not None else None
        whose = f"member {agent.model} of team {team.name!r}"
        limit = _bounded("max_tokens_per_member", asked, own, whose, ceiling, "CONCLAVE_MAX_MEMBER_TOKENS")
        budget = MemberBudgetSpec(max_tokens=limit) if limit is not None else None
        agents.append(agent if budget == agent.budget else agent.model_copy(update={"budget": budget}))
    return agents


def shape_team(team: Team, asked: JobRequest, *, has_context: bool, ceilings: Ceilings) -> Team:
    """`team` with the verify and budgets `asked` (else the team file's), after checking they can hold:
    within the team's own limits and the server's `ceilings`."""
    verify, max_cost_usd, max_tokens = asked.verify, asked.max_cost_usd, asked.max_tokens
    per_member = (
        _tokens(asked.max_tokens_per_member, "max_tokens_per_member")
        if asked.max_tokens_per_member is not None
        else None
    )
    rules = team.coordination
    command = _command(verify) if verify is not None else team.verify
    whose = f"team {team.name!r}"
    cost = _bounded(
        "max_cost_usd",
        _positive("max_cost_usd", max_cost_usd) if max_cost_usd is not None else None,
        rules.max_cost_usd,
        whose,
        ceilings.job_cost_usd,
        "CONCLAVE_MAX_JOB_COST_USD",
    )
    tokens = _bounded(
        "max_tokens",
        _tokens(max_tokens) if max_tokens is not None else None,
        rules.max_tokens,
        whose,
        ceilings.job_tokens,
        "CONCLAVE_MAX_JOB_TOKENS",
    )
    unpriced = team.unpriced()
    if cost is not None and unpriced and max_cost_usd is None and rules.max_cost_usd is None:
        raise ConfigError(
            f"this server bounds every job's cost (CONCLAVE_MAX_JOB_COST_USD={cost:g}), and team "
            f"{team.name!r} has agents without a price ({', '.join(unpriced)}), whose cost would be "
            "unknown: add `price: {input: ..., output: ...}` (US$ per million tokens) to each in the team "
            "file"
        )
    if cost is not None and unpriced:
        raise InputError(
            "max_cost_usd",
            cost,
            f"a cost budget needs a price for every agent of team {team.name!r}, and {', '.join(unpriced)} "
            "has "
            "none: add `price: {input: ..., output: ...}` (US$ per million tokens) to that agent in the team "
            f"file, or bound the job with {term('max_tokens')} instead",
        )
    clis = [cli.model for cli in team.clis]
    if clis and not has_context:
        raise InputError(
            "context_paths",
            [],
            f"{', '.join(clis)} run as coding agents on the job's files, so the job needs context_paths: "
            "give "
            "the project folder (context_paths=[{path: ...}]), or use a team without cli/ members",
        )
    if command is not None and not has_context:
        raise InputError(
            "verify",
            command,
            f"it runs on each answer's files, so the job needs the project folder: give it with "
            f"{term('context_example')}, or leave {term('verify')} out",
        )
    coordination = rules.model_copy(update={"max_cost_usd": cost, "max_tokens": tokens})
    agents = _member_budgets(team, per_member, ceilings.member_tokens)
    return team.model_copy(update={"verify": command, "coordination": coordination, "agents": agents})


def check_runnable(team: Team, environ: Mapping[str, str], sandbox_network: bool) -> None:
    """Refuse at once what would only fail later: a missing key, or what a backend needs installed."""
    for agent in team.agents:
        agent.api_key(environ)  # raises MissingApiKey naming the variable to set
        check_ready(agent.provider, agent.model_name, agent.model_path)
    for cli in team.clis:
        cli_ready(cli, team, environ)  # logged in, inside its sandbox (clis/logins.py)
    if not isinstance(team.sandbox, str) and team.sandbox.network != "none" and not sandbox_network:
        raise ConfigError(
            f"team {team.name!r} asks for `sandbox: network: {team.sandbox.network}`, which gives agents' "
            "commands the network; the server allows that only when its user sets "
            "CONCLAVE_SANDBOX_NETWORK=true. Otherwise use network: none"
        )


def _command(value: object) -> str:
    command = value.strip() if isinstance(value, str) else ""
    if not command:
        fix = "give a shell command that exits 0 when the files pass, e.g. 'python3 -m unittest -q'"
        raise InputError("verify", value, fix)
    if len(command) > MAX_VERIFY_CHARS or "\x00" in command:
        fix = (
            f"keep it under {MAX_VERIFY_CHARS} characters, without NUL bytes; "
            "put a longer script in the project"
        )
        raise InputError("verify", value, fix)
    return command


def _positive(field: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InputError(field, value, "give a positive number of US dollars, e.g. 0.50")
    return float(value)


def _tokens(value: object, field: str = "max_tokens") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        example = "300000" if field == "max_tokens_per_member" else "200000"
        raise InputError(field, value, f"give a positive whole number of tokens (in and out), e.g. {example}")
    return value
