"""Stored rows into the views callers see: JobView with its `next` hint, the team list, phase texts."""

from __future__ import annotations

from collections.abc import Mapping

from conclave.config import ConfigError, Team, resolve_team
from conclave.records import AgentProgress, JobEvent, UsageTotals
from conclave.store import JobRow
from conclave.views import AgentView, JobView, TeamAgentInfo, TeamInfo, TeamList

TASK_PREVIEW = 200


def phase_of(event: JobEvent) -> str | None:
    """A short account of an event for `phase` and progress messages; None for minor events."""
    d, who = event.data, event.letter
    match event.kind:
        case "started":
            return f"{len(d['agents'])} agents are working on the task"
        case "answer":
            return f"{who} posted {d['label']}"
        case "vote":
            return f"{who} voted for {d['label']}"
        case "vote_discarded":
            return f"{who}'s vote for {d['label']} was discarded (the answers changed or it named no current answer)"
        case "agent_failed":
            return f"{who} dropped out: {d['error']}"
        case "deadline":
            return f"stopping: {d['reason']}"
        case "presenting":
            return f"{who} is writing the final answer ({d['winner']} won the vote)"
        case "finished":
            return f"done: {d['winner']} won" if d.get("winner") else f"ended: {d['reason']}"
    return None


def _next_hint(row: JobRow) -> str:
    match row.state:
        case "queued" | "running" | "presenting":
            return (
                f"call get_status with job_id={row.id!r} and wait_seconds=45 to wait for the result; "
                "cancel_job stops it"
            )
        case "completed":
            return (
                "use the answer above; read_workspace(job_id, path='transcript') shows how the team got there"
            )
        case "interrupted":
            return (
                "the server stopped while this job ran; its answers stay readable with read_workspace; "
                "call ask_team again to run it anew"
            )
        case "cancelled":
            return "the job was cancelled; its answers so far are readable with read_workspace"
    return "see `errors` and `reason`; fix what they name (a key, a team file, a provider) and call ask_team again"


def job_view(row: JobRow, now: float) -> JobView:
    progress, result = row.progress, row.result
    start = row.started_at or row.created_at
    end = row.finished_at or now
    agents = [_agent_view(agent) for agent in progress.agents] if progress else []
    errors = dict(result.errors) if result else {}
    if row.error and not errors and row.state == "failed":
        errors["job"] = row.error
    return JobView(
        job_id=row.id,
        state=row.state,  # type: ignore[arg-type]
        phase=row.phase,
        elapsed_s=round(max(0.0, end - start), 1),
        team=row.team_name,
        task=row.task if len(row.task) <= TASK_PREVIEW else row.task[: TASK_PREVIEW - 3] + "...",
        round=progress.round if progress else 0,
        agents=agents,
        tally=(result.tally if result else progress.tally if progress else {}),
        answer=result.answer if result else None,
        winner=result.winner if result else None,
        consensus=result.consensus if result else None,
        tie=result.tie if result else None,
        reason=result.reason if result else None,
        errors=errors,
        diff_summary=_diff_summary(row),
        usage=UsageTotals.total([agent.usage for agent in progress.agents]) if progress else UsageTotals(),
        next=_next_hint(row),
    )


def _diff_summary(row: JobRow) -> dict[str, object] | None:
    """The files the winner changed per context path, with how to read the whole patch."""
    if row.files is None:
        return None
    summary: dict[str, object] = row.files.model_dump()
    if row.files.patch_chars:
        summary["read"] = f"read_workspace(job_id={row.id!r}, path='@diff') pages through the patch"
    return summary


def _agent_view(agent: AgentProgress) -> AgentView:
    return AgentView(**agent.model_dump())


def team_list(presets: list[tuple[str, Team | ConfigError]], environ: Mapping[str, str]) -> TeamList:
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
            )
            for agent in team.agents
        ]
        teams.append(
            TeamInfo(name=name, description=team.description, source=name, agents=agents, ready=not missing,
                     missing_keys=missing)
        )
    try:
        default = resolve_team(None, environ).name
    except ConfigError:
        default = None
    return TeamList(teams=teams, default=default)
