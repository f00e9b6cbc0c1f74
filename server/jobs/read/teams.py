"""The team presets as callers see them: `TeamList` for list_teams and `conclave teams`."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping

from pydantic import BaseModel, ConfigDict, Field

from conclave.config.clis import login_fix, login_source
from conclave.config.models import CliAgentSpec, Team
from conclave.config.presets import resolve_team
from conclave.errors import ConfigError
from conclave.jobs.read.views import DEMO_TEAM, plural

WIDTH = 96  # `conclave teams` lines: a terminal's width, never a 200-character line


class _View(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TeamHistory(_View):
    """What a job of this team typically used on this server (the median of its recent completed jobs)."""

    jobs: int
    typical_tokens: int
    typical_cost_usd: float | None = None

    def text(self) -> str:
        cost = f", ${self.typical_cost_usd:.4f}" if self.typical_cost_usd is not None else ""
        return (
            f"typically {self.typical_tokens:,} tokens{cost} per job ({plural(self.jobs, 'past job')} here)"
        )


class TeamAgentInfo(_View):
    model: str
    key_variables: list[str] = Field(description="environment variables that may hold the key")
    key_set: bool
    cli: str | None = Field(
        default=None, description="a coding-agent CLI member: how you are logged in to it"
    )


class TeamInfo(_View):
    name: str
    description: str = ""
    source: str = Field(description="the preset file")
    agents: list[TeamAgentInfo] = Field(default_factory=list)
    ready: bool = Field(description="every key this team needs is set and its own servers answer")
    demo: bool = Field(default=False, description="a demo of the protocol on a tiny model: not for real work")
    missing_keys: list[str] = Field(default_factory=list)
    unreachable: dict[str, str] = Field(
        default_factory=dict, description="the team's own servers (base URLs) that did not answer, and why"
    )
    error: str | None = Field(default=None, description="why the preset does not load")
    history: TeamHistory | None = Field(
        default=None, description="typical usage per job here; none without history"
    )

    def status(self) -> str:
        """ready, needs KEY, or not reachable at URL, in a few words."""
        if self.missing_keys and any(agent.cli for agent in self.agents):
            return "needs a login to a coding-agent CLI (each one below)"
        if self.missing_keys:
            return "needs " + ", ".join(self.missing_keys)
        if self.unreachable:
            url, why = next(iter(self.unreachable.items()))
            return f"not reachable at {url} ({why})"
        return "ready (a demo of the protocol on a tiny model: not for real work)" if self.demo else "ready"


class TeamList(_View):
    teams: list[TeamInfo]
    default: str | None = Field(description="the team ask_team uses when none is named")

    def text(self) -> str:
        """A line of status per team, then its models and what it is, indented, each line short."""
        lines = []
        for team in self.teams:
            if team.error:
                lines.append(f"{team.name}: broken preset: {team.error}")
                continue
            lines.append(f"{team.name}: {team.status()}")
            lines.append(f"  {models_text(team.agents)}")
            if team.description:
                lines += textwrap.wrap(team.description, WIDTH, initial_indent="  ", subsequent_indent="  ")
            for agent in team.agents:
                if agent.cli:
                    lines += textwrap.wrap(  # a login file's path stays whole, to be copied
                        f"{agent.model}: {agent.cli}",
                        WIDTH,
                        initial_indent="  ",
                        subsequent_indent="    ",
                        break_on_hyphens=False,
                        break_long_words=False,
                    )
            if team.history is not None:
                lines.append(f"  {team.history.text()}")
        lines.append(f"Default team: {self.default or 'none (set a provider key or name a team)'}")
        return "\n".join(lines)


def models_text(agents: list[TeamAgentInfo]) -> str:
    """The models once each, counted: "3 x local/smollm2", "anthropic/claude-x, openai/gpt-5"."""
    counts: dict[str, int] = {}
    for agent in agents:
        counts[agent.model] = counts.get(agent.model, 0) + 1
    return ", ".join(model if n == 1 else f"{n} x {model}" for model, n in counts.items())


def team_list(
    presets: list[tuple[str, Team | ConfigError]],
    environ: Mapping[str, str],
    history: Callable[[Team], TeamHistory | None] = lambda team: None,
    unreachable: Mapping[str, str] | None = None,
) -> TeamList:
    """Each preset with its status; `unreachable` (from jobs/admission/reach.py) names the servers that did
    not answer."""
    down = unreachable or {}
    teams: list[TeamInfo] = []
    default: str | None = None
    for name, team in presets:
        if isinstance(team, ConfigError):
            teams.append(TeamInfo(name=name, source=name, ready=False, error=str(team)))
            continue
        missing = team.missing_keys(environ)
        logins = {id(cli): cli_status(cli, environ) for cli in team.clis}
        agents = [
            TeamAgentInfo(
                model=agent.model,
                key_variables=list(agent.key_variables()),
                key_set=not any(v in missing for v in agent.key_variables()),
                cli=logins.get(id(agent)),
            )
            for agent in team.agents
        ]
        gone = {
            url: down[url] for agent in team.agents if (url := agent.base_url) is not None and url in down
        }
        teams.append(
            TeamInfo(
                name=name,
                description=team.description,
                source=name,
                agents=agents,
                ready=not missing and not gone,
                demo=name == DEMO_TEAM,
                missing_keys=missing,
                unreachable=gone,
                history=history(team),
            )
        )
    try:
        default = resolve_team(None, environ).name
    except ConfigError:
        default = None
    return TeamList(teams=teams, default=default)


def cli_status(agent: CliAgentSpec, environ: Mapping[str, str]) -> str:
    """How a CLI member logs in (its endpoint's key, your key variable or login file), or how to."""
    facts = agent.facts
    if agent.base_url:
        return f"uses {agent.base_url} with the key in {agent.api_key_env or 'no variable'}"
    source = login_source(facts, environ)
    if source is None:
        return f"not logged in: {login_fix(facts, environ)}"
    return f"logged in ({source}); runs in the CLI image (`conclave sandbox build --clis`)"
