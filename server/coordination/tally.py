"""Who wins: pure functions over a job's answers, its votes and its verification results.

The protocol (protocol.py) keeps the state and calls these to decide; they read a `Board` and return
an `Outcome`, no I/O, no clock, and import nothing of ours. The rules:
- Answers with equal keys agree (a group). The group holding most of the counted votes wins (groups
  tied go to the one posted first); in it, the answer with most votes, then the earliest.
- Verification (`verdicts`, when the caller gave a check command): while an answer that passed holds
  votes, only answers that passed may win, and each answer counts by its own verdict (a failed answer's
  votes do not lift its passed equivalents). The outcome says when this changed the winner, and when no
  current answer passed at all.
- Ending early picks the best-supported answer: most current votes, else most votes ever, else most
  agents agreeing, else the latest answer (with verification: the latest that passed, if any did).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Verdict = Literal["pending", "passed", "failed"]


class StopReason(StrEnum):
    """What ended the vote before it finished: data the driver and the views branch on, never words."""

    DEADLINE = "deadline"  # the job's timeout
    BUDGET = "budget"  # the job's max_tokens or max_cost_usd (coordination/budget.py)


class _Value(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Posted(_Value):
    """An answer as every reader names it: its label (letter + revision) and its text."""

    label: str
    letter: str
    revision: int
    content: str


class Answer(Posted):
    seq: int  # posting order across the job, for the tie-break
    key: str  # the normalised final answer: equal keys agree


class Outcome(_Value):
    """How the vote ended. `votes` of `voters` valid votes went to the winner's group; `consensus` is
    a strict majority of them; `fallback`: the vote never finished, the winner is the best supported.
    With verification: `verdict` is the winner's, `by_verification` says the rule changed the winner,
    `none_passed` that no current answer passed, `pending` which checks were still running at the end.
    The job's result (coordination/reports.py JobResult) is this plus the final text."""

    # Optional in the published schema too: a job can end with no answer to win (every agent failed,
    # the budget or the deadline came first), and the views leave out what is None
    winner: str | None = Field(
        default=None,
        description="the winning answer's label, e.g. B2; absent when no answer won: `failed`, `reason` "
        "and `errors` say why",
    )
    consensus: bool = Field(
        description="true only when a strict majority of the votes cast chose the winner (or answers with "
        "the same final answer)"
    )
    tie: bool = False
    reason: str = Field(description="why the job ended the way it did")
    tally: dict[str, int] = Field(
        default_factory=dict, description="valid votes per latest answer at the end"
    )
    failed: bool = False
    errors: dict[str, str] = Field(default_factory=dict, description="why each agent that dropped out failed")
    votes: int = Field(default=0, description="valid votes for the winner and its equivalents")
    voters: int = Field(default=0, description="valid votes cast")
    all_voted: bool = Field(default=False, description="every active agent held a valid vote")
    fallback: bool = Field(
        default=False,
        description="the vote never finished (timeout, agents failed): the best-supported answer",
    )
    agree: tuple[tuple[str, ...], ...] = Field(default=(), description="answers with the same final answer")
    verdict: Verdict | None = None
    by_verification: bool = False
    none_passed: bool = False
    pending: tuple[str, ...] = ()
    stopped_by: StopReason | None = Field(
        default=None, description="what stopped the vote early, if anything"
    )


@dataclass(frozen=True)
class Board:
    """What a decision reads: every answer posted, the current ones (posting order), the valid votes per
    current label, the votes ever cast per label, and each answer's verdict (empty: no verification)."""

    answers: tuple[Answer, ...]
    latest: tuple[Answer, ...]
    tally: Mapping[str, int]
    votes_ever: Mapping[str, int]
    all_voted: bool
    verdicts: Mapping[str, Verdict] = field(default_factory=dict)

    @property
    def verifying(self) -> bool:
        return bool(self.verdicts)

    def passed(self, answers: Sequence[Answer]) -> list[Answer]:
        return [answer for answer in answers if self.verdicts.get(answer.label) == "passed"]


class AnswerVotes(_Value):
    """Answers with the same final answer (one label when none agrees with it) and the votes they hold
    together: the tally as a person reads it."""

    labels: tuple[str, ...] = Field(description="the answers' labels, e.g. [A1, C1]")
    votes: int = Field(description="valid votes for any of them")


def by_answer(tally: Mapping[str, int], agree: Sequence[Sequence[str]]) -> list[AnswerVotes]:
    """The tally grouped by answer: each group of agreeing answers counts together, every other answer
    alone; most votes first (equal ones in the groups' order). The views serve it, so the CLI and the
    web page show it without adding votes up themselves."""
    groups = [tuple(sorted(group)) for group in agree]
    grouped = {label for group in groups for label in group}
    groups += [(label,) for label in tally if label not in grouped]
    found = [
        AnswerVotes(labels=labels, votes=sum(tally.get(label, 0) for label in labels)) for labels in groups
    ]
    return sorted(found, key=lambda group: -group.votes)


def agreeing(latest: Sequence[Answer]) -> tuple[tuple[str, ...], ...]:
    """The current answers that agree (one key), in groups of two or more, in posting order."""
    groups: dict[str, list[str]] = {}
    for answer in latest:
        groups.setdefault(answer.key, []).append(answer.label)
    return tuple(tuple(labels) for labels in groups.values() if len(labels) > 1)


def _pick(counts: Mapping[str, int], among: Sequence[Answer]) -> tuple[Answer, bool]:
    """The most-counted answer of the most-counted group among `among`, and whether groups tied."""
    groups: dict[str, list[Answer]] = {}
    for answer in among:
        groups.setdefault(answer.key, []).append(answer)
    totals = {key: sum(counts.get(a.label, 0) for a in group) for key, group in groups.items()}
    tied = [key for key, total in totals.items() if total == max(totals.values())]
    return max(groups[tied[0]], key=lambda a: (counts.get(a.label, 0), -a.seq)), len(tied) > 1


def decide(board: Board, counts: Mapping[str, int], among: Sequence[Answer], reason: str) -> Outcome:
    """The winner among `among` by `counts` (per label), with the verification rule. No consensus yet:
    the protocol judges that from `votes` and `voters`."""
    winner, tie = _pick(counts, among)
    candidates, by_verification = list(among), False
    passed = board.passed(among)
    if passed and any(counts.get(a.label, 0) for a in passed):
        chosen, tie = _pick(counts, passed)
        if chosen.label != winner.label:
            by_verification = True
            reason = (
                f"{reason}; the verification rule chose {chosen.label} (passed its check) over "
                f"{winner.label} (check {board.verdicts.get(winner.label)})"
            )
        winner, candidates = chosen, passed
    current = {a.label for a in board.latest}
    votes = sum(board.tally.get(a.label, 0) for a in candidates if a.key == winner.key and a.label in current)
    none_passed = board.verifying and not board.passed(board.latest)
    if none_passed:
        reason = f"{reason}; no answer passed verification"
    return Outcome(
        winner=winner.label,
        consensus=False,
        tie=tie,
        reason=reason,
        tally=dict(board.tally),
        votes=votes,
        voters=sum(board.tally.values()),
        all_voted=board.all_voted,
        agree=agreeing(board.latest),
        verdict=board.verdicts.get(winner.label),
        by_verification=by_verification,
        none_passed=none_passed,
    )


def fallback(board: Board, reason: str) -> Outcome:
    """The best-supported answer when the vote cannot finish, marked `fallback`; `failed` with none."""
    latest, tally = list(board.latest), board.tally
    if not board.answers:
        return Outcome(
            winner=None,
            consensus=False,
            reason=f"{reason}; no answer was posted",
            tally=dict(tally),
            failed=True,
        )
    if any(tally.values()):
        counts, among, why = tally, latest, "the answer with the most current votes"
    elif any(board.votes_ever.values()):
        counts, among, why = board.votes_ever, list(board.answers), "the answer with most votes ever"
    elif len({a.key for a in latest}) < len(latest):
        counts, among, why = {a.label: 1 for a in latest}, latest, "the answer most agents agree on"
    elif board.passed(board.answers):
        last = board.passed(board.answers)[-1]
        counts, among, why = (
            {last.label: 1},
            list(board.answers),
            "the latest answer that passed verification",
        )
    else:
        counts, among, why = {board.answers[-1].label: 1}, list(board.answers), "the latest answer"
    return decide(board, counts, among, f"{reason}; {why}").model_copy(update={"fallback": True})


def leading(board: Board) -> Outcome | None:
    """The answer that would win if the job stopped now (get_status shows it while a job runs)."""
    return None if not board.answers else fallback(board, "leading")
