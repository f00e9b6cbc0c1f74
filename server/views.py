"""What the MCP tools and the CLI return: `JobView` and friends, each with a readable text form."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from conclave.records import AgentStateName, UsageTotals

JobState = Literal["queued", "running", "presenting", "completed", "failed", "cancelled", "interrupted"]
FINAL_STATES: frozenset[str] = frozenset({"completed", "failed", "cancelled", "interrupted"})


class _View(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AgentView(_View):
    letter: str = Field(description="the agent's anonymous letter in this job")
    model: str = Field(description="provider/model")
    state: AgentStateName
    answers: int = Field(description="answers posted so far")
    vote: str | None = Field(default=None, description="the answer label this agent currently votes for")
    error: str | None = None
    usage: UsageTotals = UsageTotals()


class JobView(_View):
    """A job as the caller sees it; `next` says what to do now."""

    job_id: str
    state: JobState
    phase: str = Field(description="what the team is doing, in words")
    elapsed_s: float
    team: str
    task: str = Field(description="the task, cut to 200 characters")
    round: int = Field(default=0, description="bumps with every new answer")
    agents: list[AgentView] = Field(default_factory=list)
    tally: dict[str, int] = Field(default_factory=dict, description="current valid votes per latest answer")
    answer: str | None = Field(default=None, description="the final answer, when done")
    winner: str | None = Field(default=None, description="the winning answer's label, e.g. B2")
    consensus: bool | None = None
    tie: bool | None = None
    reason: str | None = Field(default=None, description="why the job ended the way it did")
    errors: dict[str, str] = Field(default_factory=dict)
    diff_summary: dict[str, object] | None = Field(default=None, description="files changed (with workspaces)")
    usage: UsageTotals = UsageTotals()
    next: str = Field(description="what the caller should do next")

    @property
    def done(self) -> bool:
        return self.state in FINAL_STATES

    def text(self) -> str:
        """The readable block sent beside the structured result."""
        lines = [f"Job {self.job_id} ({self.team}): {self.state} - {self.phase} [{self.elapsed_s:.0f}s, round {self.round}]"]
        for agent in self.agents:
            vote = f", votes {agent.vote}" if agent.vote else ""
            error = f", error: {agent.error}" if agent.error else ""
            lines.append(f"  {agent.letter} {agent.model}: {agent.state}, {agent.answers} answer(s){vote}{error}")
        if self.tally:
            lines.append("Tally: " + ", ".join(f"{label}={count}" for label, count in self.tally.items()))
        if self.done and self.state != "cancelled":
            verdict = "consensus" if self.consensus else "no consensus"
            tie = " (a tie, broken by the earliest answer)" if self.tie else ""
            if self.winner:
                lines.append(f"Winner: {self.winner} - {verdict}{tie}. {self.reason or ''}".rstrip())
            elif self.reason:
                lines.append(f"Ended: {self.reason}")
        for letter, error in self.errors.items():
            lines.append(f"  {letter} failed: {error}")
        usage = self.usage
        cost = f", ${usage.cost_usd:.4f}" if usage.cost_usd is not None else ""
        lines.append(
            f"Usage: {usage.input_tokens} in ({usage.cached_input_tokens} cached), {usage.output_tokens} out{cost}"
        )
        if self.answer is not None:
            lines += ["", "Final answer:", self.answer]
        lines += ["", f"Next: {self.next}"]
        return "\n".join(lines)


class TeamAgentInfo(_View):
    model: str
    key_variables: list[str] = Field(description="environment variables that may hold the key")
    key_set: bool


class TeamInfo(_View):
    name: str
    description: str = ""
    source: str = Field(description="the preset file")
    agents: list[TeamAgentInfo] = Field(default_factory=list)
    ready: bool = Field(description="every key this team needs is set")
    missing_keys: list[str] = Field(default_factory=list)
    error: str | None = Field(default=None, description="why the preset does not load")


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
        lines.append(f"Default team: {self.default or 'none (set a provider key or name a team)'}")
        return "\n".join(lines)


class WorkspacePage(_View):
    """A page of a job's readable material (an answer, the transcript, or a listing)."""

    job_id: str
    path: str
    offset: int
    limit: int
    total: int = Field(description="characters (or entries, for a listing) in all")
    content: str
    entries: list[str] | None = Field(default=None, description="for a listing: the readable paths")
    next_offset: int | None = Field(default=None, description="pass as offset to read on; null at the end")

    def text(self) -> str:
        more = f"\n[more: call again with offset={self.next_offset}]" if self.next_offset is not None else ""
        return f"{self.path} [{self.offset}:{self.offset + len(self.content)} of {self.total}]\n{self.content}{more}"
