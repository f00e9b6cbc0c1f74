"""A job as callers see it: `JobView` (structured, with a readable text form) built from the stored row."""

from __future__ import annotations

import json
from typing import Any, assert_never

from pydantic import BaseModel, ConfigDict, Field

from conclave.backends.base import Usage
from conclave.coordination.reports import (
    AgentFailedEvent,
    AgentProgress,
    AnswerEvent,
    AnswerRefusedEvent,
    BudgetReachedEvent,
    CheckedEvent,
    CheckStartedEvent,
    DeadlineEvent,
    FinishedEvent,
    JobEvent,
    JobResult,
    NoDecisionEvent,
    NoteEvent,
    PresentingEvent,
    Progress,
    ResumedEvent,
    SnapshotFailedEvent,
    StartedEvent,
    SteeredEvent,
    ToolCallEvent,
    TurnCancelledEvent,
    TurnFailedEvent,
    TurnStartedEvent,
    UsageEvent,
    VerifyBlockedEvent,
    VoteDiscardedEvent,
    VoteEvent,
)
from conclave.coordination.tally import AnswerVotes, by_answer
from conclave.errors import Surface, say, term
from conclave.jobs.derived import Estimate, FilesResult
from conclave.jobs.store.sql import JobRow, JobState

FINAL_STATES: frozenset[str] = frozenset({"completed", "failed", "cancelled", "interrupted"})


class _View(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoteView(_View):
    """A steering note (steer_job) and whether the agents have it."""

    text: str
    at: float = Field(description="seconds into the job when it was left")
    seen: bool = Field(
        description="the agents see it from their next turn; false: not yet, or the job ended first"
    )
    round: int | None = Field(default=None, description="the round the note started (its votes were cleared)")


class JobView(_View):
    """A job as the caller sees it; `next` says what to do now."""

    job_id: str
    state: JobState
    phase: str = Field(description="what the team is doing, in words")
    elapsed_s: float
    team: str
    task: str = Field(description="the task, cut to 200 characters")
    # The live picture as the job last wrote it (coordination/reports.py); once the job is done its
    # tally, agree and leading are left empty: `result` says how it ended (one type, coordination/tally.py).
    progress: Progress | None = Field(
        default=None,
        description="the team's picture: protocol phase, round (bumps with every new answer), agents; "
        "while running the tally, agree (answers with the same final answer) and the leading answer; "
        "with verify each answer's check (read_workspace path='verify/<label>' has its whole output)",
    )
    result: JobResult | None = Field(
        default=None,
        description="when done: how the job ended: answer, winner, consensus, votes, reason, errors",
    )
    majority: str | None = Field(
        default=None, description="the vote in words, e.g. 'a majority: 2 of 3 votes'"
    )
    winner_check: str | None = Field(
        default=None,
        description="with verify: the winner's check; whether it decided the vote, or none passed",
    )
    # Grouped here, once, for every reader: the CLI and the web page show it as served
    by_answer: list[AnswerVotes] = Field(
        default_factory=list,
        description="the tally by answer: answers with the same final answer count together, most "
        "votes first; the result's once done, the live one before",
    )
    estimate: Estimate | None = Field(default=None, description="while the job runs: what it may use")
    budget: dict[str, float] = Field(
        default_factory=dict, description="the job's max_tokens and max_cost_usd"
    )
    diff_summary: FilesResult | None = Field(default=None, description="files changed (with workspaces)")
    usage: Usage = Usage()
    notes: list[NoteView] = Field(
        default_factory=list, description="steering notes (steer_job), oldest first"
    )
    follow_up: str | None = Field(default=None, description="the earlier job this one continues")
    # "thread" is the published name (the output schema, `show --thread`, the "thread" resource) of what
    # the code calls a conversation (jobs/store/conversations.py); "thread" elsewhere is an OS thread.
    thread: list[str] = Field(
        default_factory=list, description="every job of this conversation, oldest first"
    )
    next: str = Field(description="what the caller should do next")
    web_url: str | None = Field(
        default=None,
        description="the job's live page, when a web view is served (conclave web, serve --http)",
    )

    @property
    def done(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def agents(self) -> list[AgentProgress]:
        """Each agent as the picture shows it (none before the job starts)."""
        return self.progress.agents if self.progress is not None else []

    @property
    def answer(self) -> str | None:
        """The final answer, when done (the CLI and the tools print it)."""
        return self.result.answer if self.result is not None else None

    def votes(self) -> tuple[dict[str, int], list[list[str]]]:
        """The tally and the groups of agreeing answers: the result's once done, the live ones before."""
        if self.result is not None:
            return dict(self.result.tally), [list(group) for group in self.result.agree]
        live = self.progress or Progress(phase="")
        return live.tally, live.agree

    def dropped(self, letter: str) -> str:
        """How an agent named in the result's errors left the vote: "stopped" at its own token limit,
        else "failed"."""
        return (
            "stopped" if any(a.letter == letter and a.state == "stopped" for a in self.agents) else "failed"
        )

    @property
    def verify_blocked(self) -> str | None:
        """With verify: why the check command cannot run on the caller's files, and what to do."""
        return self.progress.verify_blocked if self.progress is not None else None

    def checks(self) -> dict[str, str]:
        """Each answer's check in words (with verify), e.g. "passed in 3.1 s"."""
        return {
            label: check.text() for label, check in (self.progress.checks if self.progress else {}).items()
        }

    def text(self, surface: Surface = "mcp") -> str:
        """The readable block sent beside the structured result (`cli`: the hint in the CLI's words)."""
        picture = self.progress or Progress(phase="")
        lines = [
            f"Job {self.job_id} ({self.team}): {self.state} - {self.phase} [{self.elapsed_s:.0f}s, round "
            f"{picture.round}]"
        ]
        for agent in self.agents:
            vote = f", votes {agent.vote}" if agent.vote else ""
            error = f", error: {agent.error}" if agent.error else ""
            lines.append(
                f"  {agent.letter} {agent.model}: {agent.state}, "
                f"{plural(agent.answers, 'answer')}{vote}{error}; {spend_text(agent)}"
            )
        result = self.result
        tally = self.votes()[0]
        if tally:
            lines.append("Tally: " + ", ".join(f"{label}={count}" for label, count in tally.items()))
        if checks := self.checks():
            lines.append("Checks: " + "; ".join(f"{label} {check}" for label, check in checks.items()))
        if picture.verify_blocked is not None:
            lines.append(f"Verification cannot decide: {picture.verify_blocked}")
        if (leading := picture.leading) is not None:
            check = f", verify {leading.check}" if leading.check else ""
            lines.append(f"Leading: {leading.label} ({plural(leading.votes, 'vote')}{check})")
        if self.estimate is not None:
            lines.append(f"Estimate: {estimate_text(self.estimate)}")
        if self.budget:
            lines.append("Budget: " + ", ".join(f"{key} {value:g}" for key, value in self.budget.items()))
        if result is not None and self.state != "cancelled":
            if result.winner:
                lines.append(f"Winner: {result.winner} - {self.majority}.")
                if self.winner_check:
                    lines.append(f"Its check: {self.winner_check}")
                lines.append(f"Why: {result.reason}")
            else:
                lines.append(f"Ended: {result.reason}")
        for letter, error in (result.errors if result is not None else {}).items():
            lines.append(f"  {letter} {self.dropped(letter)}: {error}")
        for note in self.notes:
            lines.append(f"Note{'' if note.seen else ' (not seen yet)'}: {note.text}")
        if len(self.thread) > 1:
            lines.append(f"Thread: {' -> '.join(self.thread)}")
        usage = self.usage
        cost = f", {cost_text(usage)}" if usage.cost_usd is not None else ""
        taken_in = f"{usage.input_tokens:,} in {input_notes(usage)}"
        lines.append(f"Usage: {taken_in}, {usage.output_tokens:,} out{cost}")
        if self.diff_summary is not None and (notes := self.diff_summary.file_notes()):
            lines += ["", "Files:", *(f"  {note}" for note in notes)]
        if self.answer is not None:
            lines += ["", "Final answer:", self.answer]
        hint = self.next if surface == "mcp" else next_hint(self.state, self.job_id, self.team, "cli")
        lines += ["", f"Next: {hint}"]
        if self.web_url:
            lines.append(f"Watch it live: {self.web_url}")
        return "\n".join(lines)


def spend_text(agent: AgentProgress) -> str:
    """A member's spend on one line: "12,400 in (9,800 cached), 310 out, 41% of the job's tokens", with
    its own limit when it has one."""
    usage = agent.usage
    parts = [f"{usage.input_tokens:,} in {input_notes(usage)}, {usage.output_tokens:,} out"]
    if agent.token_share is not None:
        parts.append(f"{agent.token_share:.0%} of the job's tokens")
    if agent.max_tokens is not None:
        parts.append(f"its limit {agent.max_tokens:,}")
    return ", ".join(parts)


def input_notes(usage: Usage) -> str:
    """What the input tokens hold: "(9,800 cached)", and "~1,200 estimated" when some calls reported
    nothing (cancelled, or their worker died) and were charged an estimate of their prompt."""
    notes = [f"{usage.cached_input_tokens:,} cached"]
    if usage.estimated:
        notes.append(f"~{usage.estimated_input_tokens:,} estimated")
    return f"({', '.join(notes)})"


def cost_text(usage: Usage) -> str:
    """The cost in words: "$0.0700", or "cost ≥ $0.0700 (partial: ...)" when some tokens came without
    one (an agent with no price whose provider said none); "" when nothing has a cost. "~$0.0700" when
    part of it prices estimated tokens (`input_notes`)."""
    if usage.cost_usd is None:
        return ""
    approx = "~" if usage.estimated else ""
    if not usage.cost_partial:
        return f"{approx}${usage.cost_usd:.4f}"
    return f"cost ≥ {approx}${usage.cost_usd:.4f} (partial: {usage.uncosted_tokens:,} tokens without a cost)"


TASK_PREVIEW = 200
# What a calling model reads first: Claude Code and Codex hand it the structured result as JSON, not
# the text block.
LEAD = ("job_id", "state", "result", "majority", "winner_check", "estimate", "next", "progress")
RESULT_LEAD = ("answer", "consensus", "winner")
PROGRESS_LEAD = ("leading", "tally", "agree", "checks")


def structured(view: JobView) -> dict[str, object]:
    """The view as an MCP result's structured content: what matters first (in the result too), then the
    rest in model order; empty fields left out. Still a valid JobView."""
    # the notes are the view's own `notes` (with whether the agents have seen them)
    left_out: dict[str, Any] = {"progress": {"notes": True}}
    data = _lead(view.model_dump(mode="json", exclude_none=True, exclude=left_out), LEAD)
    for key, lead in (("result", RESULT_LEAD), ("progress", PROGRESS_LEAD)):
        part = data.get(key)
        if isinstance(part, dict):
            data[key] = _lead(part, lead)
    progress = data.get("progress")
    if isinstance(progress, dict) and isinstance(progress.get("checks"), dict):
        # a check's empty tail and protected files are left out too
        progress["checks"] = {label: _lead(check, ()) for label, check in progress["checks"].items()}
    return data


def _lead(data: dict[str, object], lead: tuple[str, ...]) -> dict[str, object]:
    data = {key: value for key, value in data.items() if value not in ({}, [])}
    return {
        **{key: data[key] for key in lead if key in data},
        **{k: v for k, v in data.items() if k not in lead},
    }


def estimate_text(estimate: Estimate) -> str:
    """The estimate on one line."""
    parts = []
    if estimate.tokens:
        parts.append(f"{estimate.tokens[0]:,}-{estimate.tokens[1]:,} tokens")
    if estimate.cost_usd:
        parts.append(f"${estimate.cost_usd[0]:.4f}-${estimate.cost_usd[1]:.4f}")
    return ", ".join([*parts, estimate.note]) if parts else estimate.note


def winner_check(result: JobResult, checks: dict[str, str], blocked: str | None = None) -> str | None:
    """The winner's check in words, with what the verification rule did; None without verify. With no
    answer passed and a command that cannot run on the caller's files (`blocked`), it says the vote
    chose, unverified, and why: a failed check there says nothing of the answer."""
    if result.verdict is None or result.winner is None:
        return None
    if blocked is not None and result.none_passed:
        return f"not verified, the vote alone chose it: {blocked}"
    text = checks.get(result.winner, result.verdict)
    if result.by_verification:
        text += "; the verification rule chose it over an answer with more votes whose check failed"
    if result.none_passed:
        text += "; no answer passed its check"
    if result.pending:
        text += f"; checks still running when the job ended: {', '.join(result.pending)}"
    return text


def majority_text(result: JobResult) -> str:
    """Whether there was a majority and by how many votes, in words (the JobView and the CLI say it)."""
    margin = f"{result.votes} of {result.voters} vote{'s' if result.voters != 1 else ''}"
    same = [labels for labels in result.agree if result.winner in labels]
    with_same = (
        f" (with {', '.join(label for label in same[0] if label != result.winner)}: the same answer)"
        if same
        else ""
    )
    if result.fallback:
        return (
            f"no majority: the vote did not finish; the best-supported answer so far has {margin}{with_same}"
        )
    turnout = "every agent voted" if result.all_voted else "not every agent voted"
    if result.consensus:
        return f"a majority: {margin}{with_same}; {turnout}"
    tie = ", a tie broken by the earliest answer" if result.tie else ""
    return f"no majority: {margin}{with_same}{tie}; {turnout}"


def phase_of(event: JobEvent) -> str | None:
    """A short account of an event for `phase` and progress messages; None for minor events."""
    who = event.letter
    match event:
        case StartedEvent():
            return f"{len(event.agents)} agents are working on the task"
        case ResumedEvent():
            return (
                "resumed after its server stopped: answers, votes and notes kept; turns in flight run again"
            )
        case AnswerEvent():
            return f"{who} posted {event.label}"
        case VoteEvent():
            return f"{who} voted for {event.label}"
        case AnswerRefusedEvent():
            return f"{who}'s answer was refused ({event.error}); it is asked again"
        case VoteDiscardedEvent():
            why = "the answers changed or it named no current answer"
            return f"{who}'s vote for {event.label} was discarded ({why})"
        case AgentFailedEvent():
            return f"{who} dropped out: {event.error}"
        case DeadlineEvent() | BudgetReachedEvent():
            return f"stopping: {event.reason}"
        case CheckedEvent():
            return f"{event.label}'s check {event.check.status}"
        case PresentingEvent():
            return f"{who} is writing the final answer ({event.winner} won the vote)"
        case FinishedEvent():
            result = event.result
            return f"done: {result.winner} won" if result.winner else f"ended: {result.reason}"
        case SteeredEvent():
            return "a note from the person who asked reached the agents; the votes were cleared"
        case (
            TurnStartedEvent()
            | TurnCancelledEvent()
            | ToolCallEvent()
            | SnapshotFailedEvent()
            | NoDecisionEvent()
            | TurnFailedEvent()
            | UsageEvent()
            | CheckStartedEvent()
            | VerifyBlockedEvent()
            | NoteEvent()
        ):
            return None
        case _:
            assert_never(event)


def plural(count: int, noun: str) -> str:
    """`1 answer`, `2 answers`, `0 votes`."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


# The bundled 135M model: it shows the protocol working, it is no second opinion (skills/conclave/SKILL.md
# says the same to the calling agent).
DEMO_TEAM = "local"
DEMO_NOTE = "the `local` team is a 135M-parameter demo: do not rely on its answer for real work; {fix}"


def next_hint(state: str, job_id: str, team: str, surface: Surface = "mcp") -> str:
    """What to do now, in the words of the surface that shows it."""
    match state:
        case "queued" | "running" | "presenting":
            hint = (
                (
                    f"call get_status with job_id={job_id!r} and wait_seconds=45 to wait for the result; "
                    f"cancel_job stops it; {term('steer')}"
                )
                if surface == "mcp"
                else (f"wait with `conclave status {job_id}`; {term('steer')}")
            )
        case "completed":
            hint = (
                f"use the answer above; {term('read_transcript')} shows how the team got there; to go on "
                f"from it (a failing test, a new requirement), {term('follow_up')}"
            )
        case "interrupted":
            hint = (
                f"the server stopped while this job ran; its answers stay readable with "
                f"{term('read_answers')}; {term('ask_again')} to run it anew, or {term('follow_up')} to go "
                "on "
                "from its last best answer"
            )
        case "cancelled":
            hint = (
                f"the job was cancelled; its answers so far are readable with {term('read_answers')}; "
                f"to go on from its last best answer, {term('follow_up')}"
            )
        case _:
            hint = (
                f"see the errors and the reason above; fix what they name (a key, a team file, a provider) "
                f"and {term('ask_again')}"
            )
    if team == DEMO_TEAM and state not in ("failed", "cancelled"):
        hint += "; " + DEMO_NOTE.format(fix=term("demo_fix"))
    return say(hint, surface).replace("JOB", job_id)


def job_view(
    row: JobRow, now: float, notes: list[NoteView] | None = None, conversation: list[str] | None = None
) -> JobView:
    result = job_result(row)
    active = row.state not in FINAL_STATES
    start = row.started_at or row.created_at
    end = row.finished_at or now
    progress = row.progress
    if progress is not None and not active:  # the vote is the result's now
        progress = progress.model_copy(update={"tally": {}, "agree": [], "leading": None})
    checks = {label: check.text() for label, check in progress.checks.items()} if progress else {}
    usage = sum((agent.usage for agent in progress.agents), Usage()) if progress else Usage()
    if progress is not None and usage.tokens > 0:
        shares = [
            a.model_copy(update={"token_share": round(a.usage.tokens / usage.tokens, 4)})
            for a in progress.agents
        ]
        progress = progress.model_copy(update={"agents": shares})
    view = JobView(
        job_id=row.id,
        state=row.state,
        phase=row.phase,
        elapsed_s=round(max(0.0, end - start), 1),
        team=row.team_name,
        task=row.task if len(row.task) <= TASK_PREVIEW else row.task[: TASK_PREVIEW - 3] + "...",
        progress=progress,
        result=result,
        majority=majority_text(result) if result and result.winner else None,
        winner_check=winner_check(result, checks, progress.verify_blocked if progress else None)
        if result
        else None,
        estimate=row.options.estimate if active else None,
        budget=_budget(row),
        diff_summary=_diff_summary(row),
        usage=usage,
        notes=notes or [],
        follow_up=row.follow_up,
        thread=conversation if conversation and len(conversation) > 1 else [],
        next=next_hint(row.state, row.id, row.team_name),
    )
    return view.model_copy(update={"by_answer": by_answer(*view.votes())})


def job_result(row: JobRow) -> JobResult | None:
    """How the job ended: the stored result, with the job's own error when it failed outside the vote
    (a copy, a crash); a job that failed before any vote gets a result that says why."""
    result, error = row.result, row.error
    if error is None or row.state != "failed" or (result is not None and result.errors):
        return result
    if result is None:
        return JobResult(winner=None, consensus=False, reason=error, failed=True, errors={"job": error})
    return result.model_copy(update={"errors": {"job": error}})


def _budget(row: JobRow) -> dict[str, float]:
    """The job's limits, as its stored team says (jobs/admission/team_shape.py put the caller's there)."""
    rules = json.loads(row.team_json).get("coordination") or {}
    return {key: rules[key] for key in ("max_tokens", "max_cost_usd") if rules.get(key) is not None}


def _diff_summary(row: JobRow) -> FilesResult | None:
    """The files the winner changed per context path, with how to read the whole patch."""
    if row.files is None or not row.files.patch_chars:
        return row.files
    return row.files.model_copy(
        update={"read": f"read_workspace(job_id={row.id!r}, path='@diff') pages through the patch"}
    )
