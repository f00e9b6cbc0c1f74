"""What a running job reports: its events, the live progress, usage per agent, and how it ended.

The orchestrator produces these; the job store keeps them and the views read them back.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter, model_validator

from conclave.backends.base import Usage
from conclave.coordination.tally import Outcome, Posted, StopReason
from conclave.coordination.verdicts import RunCounts


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


# stopped: the member reached its own token limit (budget.py MemberLimit) and takes no more turns
AgentStateName = Literal["working", "voted", "waiting", "presenting", "done", "failed", "stopped"]
CheckStatus = Literal["running", "passed", "failed", "error"]
TAIL_LINES, LINE_CHARS = 5, 200  # what a check keeps of its output's end for voters and the view


class Check(_Record):
    """One answer's verification: the caller's command run on that answer's reviewed patch
    (verification.py), judged by the runner's own summary (verdicts.py)."""

    status: CheckStatus
    exit_code: int | None = None
    duration_s: float | None = None
    timed_out: bool = False
    tail: list[str] = Field(default_factory=list, description="the last lines of the output")
    error: str | None = None  # why the check could not run (status "error")
    # protected files (verify_protect) the answer changed: put back as they were before the check ran
    protected: list[str] = Field(default_factory=list)
    # what apply would hold back of the answer (binaries, artefacts, ...): left out of the check too
    held: list[str] = Field(default_factory=list)
    tests: RunCounts | None = Field(default=None, description="the test runner's summary in the output")
    required: int | None = Field(
        default=None, description="tests the original files' run reported; null: it printed no summary"
    )
    verdict: Literal["tests", "exit_code"] | None = Field(
        default=None, description="tests: the runner's summary decided; exit_code: no summary to count"
    )
    reason: str | None = None  # why a run that exited 0 did not pass

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def text(self) -> str:
        """In words, on one line: "passed in 3.1 s (5 tests passed, as many as the original files
        ran)", "failed (exit 1): 2 failed, 3 passed", "running"; with what the answer changed of the
        protected files and what was held back."""
        notes = []
        if self.protected:
            notes.append(
                f"run with the original tests: this answer changed protected files {_few(self.protected)}"
            )
        if self.held:
            notes.append(f"not in the check, as apply holds them back: {_few(self.held)}")
        return " ".join([self._status_text(), *(f"[{note}]" for note in notes)])

    def _status_text(self) -> str:
        if self.status == "running":
            return "running"
        if self.status == "error":
            return f"could not run: {self.error}"
        took = f" in {self.duration_s:.1f} s" if self.duration_s is not None else ""
        if self.status == "passed":
            if self.verdict == "exit_code":
                return f"passed{took} (by its exit code: the original files' run printed no test summary)"
            if self.tests is not None and self.required is not None:
                ran = f"{self.tests.passed} test" + ("" if self.tests.passed == 1 else "s")
                return f"passed{took} ({ran} passed; the original files ran {self.required})"
            return f"passed{took}"
        if self.timed_out:
            return f"failed: timed out after {self.duration_s or 0:.0f} s"
        if self.reason:
            return f"failed (exit {self.exit_code}): {self.reason}"
        last = f": {self.tail[-1]}" if self.tail else ""
        return f"failed (exit {self.exit_code}){last}"


def _few(paths: list[str]) -> str:
    return ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")


class ShownAnswer(Posted):
    """One posted answer as every reader shows it: a voter's prompt (coordination/prompts.py), the web
    view's card (web/snapshot.py) and `conclave show --answers`. What is known of it now beside it."""

    at: float = 0.0  # seconds since the job started
    latest: bool = True  # still its author's latest answer
    votes: int = 0  # current valid votes (the tally's)
    agrees_with: tuple[str, ...] = ()  # the other current answers with the same final answer
    check: str = ""  # its verification in words ("passed in 3.1 s"; Check.text), with `verify`
    check_status: CheckStatus | None = None
    check_output: str | None = None  # the end of its check's output, where the reader has it

    @classmethod
    def of(cls, answer: Posted, check: Check | None = None, **known: Any) -> ShownAnswer:
        """`answer` (the protocol's, or as stored) with its check and what else is `known` of it now."""
        posted: dict[str, Any] = {name: getattr(answer, name) for name in Posted.model_fields}
        if check is not None:
            posted |= {"check": check.text(), "check_status": check.status}
        return cls(**posted, **known)


class Leading(_Record):
    """The answer that would win if the job stopped now."""

    label: str
    votes: int
    check: str | None = None  # its verification in words, with `verify`
    preview: str = Field(default="", description="the answer's first characters")


class AgentProgress(_Record):
    """One agent in the live picture (the job's view shows these as they are)."""

    letter: str = Field(description="the agent's anonymous letter in this job")
    model: str = Field(description="provider/model")
    state: AgentStateName
    answers: int = Field(default=0, description="answers posted so far")
    vote: str | None = Field(default=None, description="the answer label this agent currently votes for")
    error: str | None = None
    usage: Usage = Usage()
    # set as a job is read (jobs/read/views.py), from every member's usage then; never stored
    token_share: float | None = Field(
        default=None,
        description="this member's part of the job's tokens (in and out), 0 to 1: for a coding-agent CLI "
        "member on a plan, how much of the job's spend came out of that plan",
    )
    max_tokens: int | None = Field(
        default=None, description="this member's own token limit (budget.max_tokens in its team entry)"
    )


class Progress(_Record):
    """The live picture of a running job."""

    phase: str
    round: int = 0  # the answer-set version: bumps with every new answer
    agents: list[AgentProgress] = Field(default_factory=list)
    tally: dict[str, int] = Field(default_factory=dict)
    agree: list[list[str]] = Field(default_factory=list)  # current answers with the same final answer
    checks: dict[str, Check] = Field(default_factory=dict)  # per answer label, with `verify`
    verify_blocked: str | None = Field(
        default=None,
        description="with verify: why the check command cannot run on your own files at all (its run on "
        "them stopped before any test passed or failed) and what to do; no check then tells a fix apart",
    )
    leading: Leading | None = None
    notes: list[str] = Field(default_factory=list)  # steering notes the agents see, oldest first


class JobResult(Outcome):
    """How a job ended: the protocol's outcome (tally.py), built once from it, with the final text.
    `presented_by`: the agent that wrote the final answer (with `final: present`)."""

    answer: str | None = Field(default=None, description="the final answer")
    presented_by: str | None = None

    @classmethod
    def of(cls, outcome: Outcome, answer: str | None = None, presented_by: str | None = None) -> JobResult:
        return cls(**dict(outcome), answer=answer, presented_by=presented_by)

    @property
    def budget_reached(self) -> bool:
        return self.stopped_by is StopReason.BUDGET

    @model_validator(mode="before")
    @classmethod
    def _stored_before_stopped_by(cls, data: Any) -> Any:
        """A result stored before `stopped_by` said `budget_reached: true|false` (read back as data)."""
        if isinstance(data, dict) and "budget_reached" in data:
            data = dict(data)
            if data.pop("budget_reached") and data.get("stopped_by") is None:
                data["stopped_by"] = StopReason.BUDGET
        return data


_OWN = {"kind", "letter", "at"}  # every event's own columns in the events table, beside its payload


class _Event(BaseModel):
    """What every job event has: who it is about (an agent's letter, or none: the job) and when, in seconds
    since the job started. Each kind's own fields are its payload, stored as the events table's data_json
    (`payload`); the readers match on the class, so a kind no reader handles fails mypy (assert_never)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    letter: str | None = None
    at: float = 0.0

    def payload_json(self) -> str:
        """The kind's own fields as JSON: what the events table's data_json holds."""
        return self.model_dump_json(exclude=_OWN)


class Seat(_Record):
    """One agent as a job's start names it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    letter: str
    model: str


class StartedEvent(_Event):
    kind: Literal["started"] = "started"
    agents: tuple[Seat, ...] = ()


class ResumedEvent(_Event):
    """A job taken over after its server stopped: its journal replayed, what was in flight run again."""

    kind: Literal["resumed"] = "resumed"
    events: int = 0  # protocol events replayed
    turns: tuple[str, ...] = ()  # letters whose turns run again
    checks: tuple[str, ...] = ()  # labels whose checks run again


class TurnStartedEvent(_Event):
    kind: Literal["turn_started"] = "turn_started"
    turn_id: int
    round: int
    note: str = ""
    corrective: bool = False


class TurnCancelledEvent(_Event):
    kind: Literal["turn_cancelled"] = "turn_cancelled"
    turn_id: int


class ToolCallEvent(_Event):
    kind: Literal["tool_call"] = "tool_call"
    name: str
    arguments: dict[str, JsonValue] = Field(default_factory=dict)


class AnswerEvent(_Event):
    kind: Literal["answer"] = "answer"
    label: str
    revision: int
    content: str


class SnapshotFailedEvent(_Event):
    """An answer's (or the winner's) files could not be saved; the answer stands without them."""

    kind: Literal["snapshot_failed"] = "snapshot_failed"
    label: str | None = None
    error: str


class VoteEvent(_Event):
    kind: Literal["vote"] = "vote"
    label: str
    reason: str = ""


class VoteDiscardedEvent(_Event):
    kind: Literal["vote_discarded"] = "vote_discarded"
    label: str
    reason: str = ""


class NoDecisionEvent(_Event):
    kind: Literal["no_decision"] = "no_decision"
    text: str = ""


class _Failure(_Event):
    error: str = ""


class TurnFailedEvent(_Failure):
    kind: Literal["turn_failed"] = "turn_failed"


class AnswerRefusedEvent(_Failure):
    kind: Literal["answer_refused"] = "answer_refused"


class AgentFailedEvent(_Failure):
    kind: Literal["agent_failed"] = "agent_failed"


class UsageEvent(_Event):
    """One usage report charged to a member: the `charge` as priced, and the member's `total` after it
    (what the usage table keeps, jobs/store/sql.py)."""

    kind: Literal["usage"] = "usage"
    model: str = ""
    charge: Usage = Usage()
    total: Usage = Usage()

    @model_validator(mode="before")
    @classmethod
    def _stored_flat(cls, data: Any) -> Any:
        """A row stored before the charge was nested held the charge's fields alone (no total known)."""
        if isinstance(data, dict) and "charge" not in data and "input_tokens" in data:
            data = dict(data)
            charge = {name: data.pop(name) for name in list(data) if name in Usage.__dataclass_fields__}
            data |= {"charge": charge, "total": charge}
        return data


class CheckStartedEvent(_Event):
    kind: Literal["check_started"] = "check_started"
    label: str


class CheckedEvent(_Event):
    """An answer's check ended: what it found, and its whole output (capped as every command's is)."""

    kind: Literal["checked"] = "checked"
    label: str
    check: Check
    output: str = ""

    @model_validator(mode="before")
    @classmethod
    def _stored_flat(cls, data: Any) -> Any:
        """A row stored before the check was nested held its fields beside the label (and fields since
        dropped: left out)."""
        if isinstance(data, dict) and "check" not in data and "status" in data:
            check = {name: value for name, value in data.items() if name in Check.model_fields}
            kept = {name: data[name] for name in ("kind", "letter", "at", "label", "output") if name in data}
            data = kept | {"check": check}
        return data


class VerifyBlockedEvent(_Event):
    """The check command cannot run on the caller's own files (blocked_runs.py)."""

    kind: Literal["verify_blocked"] = "verify_blocked"
    reason: str


class BudgetReachedEvent(_Event):
    kind: Literal["budget_reached"] = "budget_reached"
    reason: str


class DeadlineEvent(_Event):
    kind: Literal["deadline"] = "deadline"
    reason: str


class PresentingEvent(_Event):
    kind: Literal["presenting"] = "presenting"
    winner: str | None = None


class NoteEvent(_Event):
    """A steering note as the caller left it (any process writes it; the job's owner delivers it)."""

    kind: Literal["note"] = "note"
    text: str
    seq: int = 0  # its number among the job's events, as its writer took it


class SteeredEvent(_Event):
    """The note reached the protocol: every later turn shows it, the votes were cleared (`late`: it came
    after the vote and changed nothing)."""

    kind: Literal["steered"] = "steered"
    note: str = ""
    round: int = 0
    late: bool = False


class FinishedEvent(_Event):
    kind: Literal["finished"] = "finished"
    result: JobResult

    @model_validator(mode="before")
    @classmethod
    def _stored_flat(cls, data: Any) -> Any:
        """A row stored before the result was nested held its fields alone."""
        if isinstance(data, dict) and "result" not in data:
            kept = {name: data[name] for name in ("kind", "letter", "at") if name in data}
            data = kept | {"result": {k: v for k, v in data.items() if k not in kept}}
        return data


# One thing that happened in a job, in order; the transcript is the list of these.
JobEvent = Annotated[
    StartedEvent
    | ResumedEvent
    | TurnStartedEvent
    | TurnCancelledEvent
    | ToolCallEvent
    | AnswerEvent
    | SnapshotFailedEvent
    | VoteEvent
    | VoteDiscardedEvent
    | NoDecisionEvent
    | TurnFailedEvent
    | AnswerRefusedEvent
    | AgentFailedEvent
    | UsageEvent
    | CheckStartedEvent
    | CheckedEvent
    | VerifyBlockedEvent
    | BudgetReachedEvent
    | DeadlineEvent
    | PresentingEvent
    | FinishedEvent
    | NoteEvent
    | SteeredEvent,
    Field(discriminator="kind"),
]
JOB_EVENT: TypeAdapter[JobEvent] = TypeAdapter(JobEvent)
# the kinds, as the events table's kind column holds them (a test checks it against JobEvent's members)
EventKind = Literal[
    "started",
    "resumed",
    "turn_started",
    "turn_cancelled",
    "tool_call",
    "answer",
    "snapshot_failed",
    "vote",
    "vote_discarded",
    "no_decision",
    "turn_failed",
    "answer_refused",
    "agent_failed",
    "usage",
    "check_started",
    "checked",
    "verify_blocked",
    "budget_reached",
    "deadline",
    "presenting",
    "finished",
    "note",
    "steered",
]


def stored_event(kind: str, letter: str | None, at: float, payload: dict[str, Any]) -> JobEvent:
    """An event as the events table holds it (its kind, letter and time, and its payload's JSON)."""
    return JOB_EVENT.validate_python({**payload, "kind": kind, "letter": letter, "at": at})
