"""`list_teams`: the team presets, their models, and which API keys are missing."""

from __future__ import annotations

from fastmcp import Context

from conclave.jobs.read.teams import TeamList
from conclave.tools._deps import result, service


async def list_teams(ctx: Context) -> TeamList:
    """List the team presets ask_team accepts as `team`, each with its models and whether its API keys
    are set, the typical tokens and cost per job for teams that ran here before (`history`), and the
    default team used when none is named.

    Pick a team that is `ready`. For one that is not, the user must set the missing environment
    variables where the server runs, or start the team's server when it is "not reachable". The `local`
    team (`demo`) is a tiny model that only shows the protocol: do not give it real work; ask the user
    for a provider key or a subscription member instead. A team YAML file path is accepted as `team` too
    when the file is in the user's team folder or a folder listed in CONCLAVE_TEAM_DIRS.
    """
    return result(await service(ctx).lookup.teams())
