"""The team presets as callers see them: `TeamList` for list_teams and `conclave teams`."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pydantic import BaseModel, ConfigDict, Field

from conclave.config import AgentSpec, ConfigError, Team, resolve_team
from conclave.config.clis import CLIS, login_source, split_cli_model


class _View(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TeamHistory(_View):
    """What a job of this team typically used on this server (the median of its recent completed jobs)."""

    jobs: int
    typical_tokens: int
    typical_cost_usd: float | None = None

    def text(self) -> str:
        cost = f", ${self.typical_cost_usd:.4f}" if self.typical_cost_usd is not None else ""
        return f"typically {self.typical_tokens:,} tokens{cost} per job ({self.jobs} past jobs here)"


class TeamAgentInfo(_View):
    model: str
    key_variables: list[str] = Field(description="environment variables that may hold the key")
    key_set: bool
    cli: str | None = Field(default=None, description="a coding-agent CLI member: how you are logged in to it")


class TeamInfo(_View):
    name: str
    description: str = ""
    source: str = Field(description="the preset file")
    agents: list[TeamAgentInfo] = Field(default_factory=list)
    ready: bool = Field(description="every key this team needs is set")
    missing_keys: list[str] = Field(default_factory=list)
    error: str | None = Field(default=None, description="why the preset does not load")
    history: TeamHistory | None = Field(default=None, description="typical usage per job here; none without history")


class TeamList(_View):
    teams: list[TeamInfo]
    default: str | None = Field(description="the team ask_team uses when none is named")

    def text(self) -> str:
        lines = []
        for team in self.teams:
            if team.error:
                lines.append(f"{team.name}: broken preset: {team.error}")
                continue
            status = "ready" if team.ready else "needs " + ", ".join(team.missing_keys)
            models = ", ".join(agent.model for agent in team.agents)
            lines.append(f"{team.name}: {status} - {models}. {team.description}".rstrip())
            lines += [f"  {agent.model}: {agent.cli}" for agent in team.agents if agent.cli]
            if team.history is not None:
                lines.append(f"  {team.history.text()}")
        lines.append(f"Default team: {self.default or 'none (set a provider key or name a team)'}")
        return "\n".join(lines)


def team_list(
    presets: list[tuple[str, Team | ConfigError]],
    environ: Mapping[str, str],
    history: Callable[[Team], TeamHistory | None] = lambda team: None,
) -> TeamList:
    teams: list[TeamInfo] = []
    default: str | None = None
    for name, team in presets:
        if isinstance(team, ConfigError):
            teams.append(TeamInfo(name=name, source=name, ready=False, error=str(team)))
            continue
        missing = team.missing_keys(environ)
        agents = [
            TeamAgentInfo(
                model=agent.model,
                key_variables=list(agent.key_variables()),
                key_set=not any(v in missing for v in agent.key_variables()),
                cli=cli_status(agent, environ),
            )
            for agent in team.agents
        ]
        teams.append(
            TeamInfo(name=name, description=team.description, source=name, agents=agents, ready=not missing,
                     missing_keys=missing, history=history(team))
        )
    try:
        default = resolve_team(None, environ).name
    except ConfigError:
        default = None
    return TeamList(teams=teams, default=default)


def cli_status(agent: AgentSpec, environ: Mapping[str, str]) -> str | None:
    """For a CLI member: how it logs in (its endpoint's key, your key variable or login file), or how to."""
    if agent.provider != "cli":
        return None
    facts = CLIS[split_cli_model(agent.model_name)[0]]
    if agent.base_url:
        return f"uses {agent.base_url} with the key in {agent.api_key_env or 'no variable'}"
    source = login_source(facts, environ)
    if source is None:
        return (f"not logged in: run {facts.program} once and sign in (~/{facts.config_dir}/{facts.login_files[0]}), "
                f"or set {facts.key_variables[0]}")
    return f"logged in ({source}); runs in the CLI image (`conclave sandbox build --clis`)"
