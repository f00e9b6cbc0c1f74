"""What a job will run with: the caller's `verify` and budgets (the job's, and one for every member) laid
over the team's own, checked at submit.

The result is the team stored with the job (its `verify` and `coordination.max_*` set), so a job's
limits are part of its record. Refused here, with the fix: a cost budget for a team with an agent
that has no price (its cost would be unknown), a budget that is not a positive number, and a `verify`
without context paths (there would be no files to check). A verify without Docker is refused by
file_steps.admit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from conclave.backends import check_ready
from conclave.clis.logins import cli_ready
from conclave.config.models import MAX_VERIFY_CHARS, MemberBudget, Team
from conclave.errors import ConfigError, InputError, term


def shape_team(
    team: Team,
    *,
    verify: str | None,
    max_cost_usd: float | None,
    max_tokens: int | None,
    has_context: bool,
    max_tokens_per_member: int | None = None,
) -> Team:
    """`team` with the caller's verify and budgets (else the team file's), after checking they can hold."""
    rules = team.coordination
    command = _command(verify) if verify is not None else team.verify
    cost = _positive("max_cost_usd", max_cost_usd) if max_cost_usd is not None else rules.max_cost_usd
    tokens = _tokens(max_tokens) if max_tokens is not None else rules.max_tokens
    unpriced = team.unpriced()
    if cost is not None and unpriced:
        raise InputError(
            "max_cost_usd",
            cost,
            f"a cost budget needs a price for every agent of team {team.name!r}, and {', '.join(unpriced)} "
            "has "
            "none: add `price: {input: ..., output: ...}` (US$ per million tokens) to that agent in the team "
            f"file, or bound the job with {term('max_tokens')} instead",
        )
    clis = [agent.model for agent in team.agents if agent.is_cli]
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
    agents = team.agents
    if max_tokens_per_member is not None:  # the caller's, over every member's own
        limit = MemberBudget(max_tokens=_tokens(max_tokens_per_member, "max_tokens_per_member"))
        agents = [agent.model_copy(update={"budget": limit}) for agent in agents]
    return team.model_copy(update={"verify": command, "coordination": coordination, "agents": agents})


def check_runnable(team: Team, environ: Mapping[str, str], sandbox_network: bool) -> None:
    """Refuse at once what would only fail later: a missing key, or what a backend needs installed."""
    for agent in team.agents:
        agent.api_key(environ)  # raises MissingApiKey naming the variable to set
        check_ready(agent.provider, agent.model_name, agent.model_path)
        if agent.is_cli:
            cli_ready(agent, team, environ)  # logged in, the CLI image built (clis/logins.py)
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
