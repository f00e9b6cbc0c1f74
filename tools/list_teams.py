"""`list_teams`: the team presets, their models, and which API keys are missing."""

from __future__ import annotations

from fastmcp import Context

from conclave.jobs.teams import TeamList
from conclave.tools._deps import result, service


async def list_teams(ctx: Context) -> TeamList:
    """List the team presets ask_team accepts as `team`, each with its models and whether its API keys
    are set, the typical tokens and cost per job for teams that ran here before (`history`), and the
    default team used when none is named.

    Pick a team that is `ready`; for one that is not, the user must set the missing environment
    variables where the server runs. A team YAML file path is accepted as `team` too.
    """
    return result(await service(ctx).teams())
