"""The coordination protocol: a pure state machine. Feed it events, carry out the actions it returns.

No I/O, no clock, no randomness: the seed for letters and every moment in time come in as data, so a
job replays exactly from its event log. The rules (docs/ARCHITECTURE.md, "The protocol"):

- Every agent works on the whole task; answers are labelled letter + revision (A1, B2).
- A new answer bumps the answer-set version and clears every vote. A vote counts only if its turn
  started at the current version and it names a current latest answer; otherwise it is discarded and
  the agent gets a fresh turn (a wrong label counts as a failed turn, a stale one does not).
- When an answer lands, a turn in flight that started at an older version, has done no work yet and
  is not its agent's first answer is cancelled and restarted (tests/test_protocol.py::test_stale_*).
- An agent at `max_answers` may only vote. `all_voted`: done when every active agent holds a vote.
  `majority`: done when one answer holds votes from more than half of the active agents.
- Winner: most votes, ties to the earliest-posted answer. Without consensus (deadline, all but one
  agent failed): most current votes, else most votes ever, else the latest answer.
- A turn that ends with plain text gets one corrective retry; after that non-empty text is an answer.
"""

from __future__ import annotations

import random
import string
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

AgentStatus = Literal["working", "voted", "waiting", "failed"]
Phase = Literal["coordinating", "presenting", "done"]


def assign_letters(count: int, seed: int) -> list[str]:
    """Anonymous letters for `count` agents, shuffled by `seed`; item i is agent i's letter."""
    letters = list(string.ascii_uppercase[:count])
    random.Random(seed).shuffle(letters)
    return letters


@dataclass(frozen=True)
class Answer:
    label: str
    letter: str
    revision: int
    content: str
    seq: int  # posting order across the job, for the tie-break


@dataclass(frozen=True)
class Vote:
    voter: str
    label: str
    reason: str


# Events: what happened. Turn events carry the turn id the protocol gave out; late ones are ignored.
@dataclass(frozen=True)
class Start:
    pass


@dataclass(frozen=True)
class WorkStarted:
    letter: str
    turn_id: int


@dataclass(frozen=True)
class AnswerPosted:
    letter: str
    turn_id: int
    content: str


@dataclass(frozen=True)
class VoteCast:
    letter: str
    turn_id: int
    label: str
    reason: str = ""


@dataclass(frozen=True)
class NoDecision:
    letter: str
    turn_id: int
    text: str


@dataclass(frozen=True)
class TurnFailed:
    """`fatal`: the provider kept failing after retries, so the agent is out."""

    letter: str
    turn_id: int
    error: str
    fatal: bool = False


@dataclass(frozen=True)
class Deadline:
    reason: str


@dataclass(frozen=True)
class Presented:
    text: str


@dataclass(frozen=True)
class PresentationFailed:
    error: str


Event = (
    Start | WorkStarted | AnswerPosted | VoteCast | NoDecision | TurnFailed | Deadline | Presented
    | PresentationFailed
)


# Actions: what the driver must do.
@dataclass(frozen=True)
class StartTurn:
    letter: str
    turn_id: int
    version: int
    can_answer: bool
    labels: tuple[str, ...]  # the current latest answers: the only valid vote targets
    corrective: bool = False  # the last turn ended without new_answer/vote
    note: str = ""  # why this turn, for the agent (e.g. an invalid vote)


@dataclass(frozen=True)
class CancelTurn:
    letter: str
    turn_id: int


@dataclass(frozen=True)
class Outcome:
    winner: str | None
    consensus: bool
    tie: bool
    reason: str
    tally: dict[str, int]
    failed: bool = False
    errors: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Present:
    letter: str
    outcome: Outcome


@dataclass(frozen=True)
class Finish:
    outcome: Outcome
    final_text: str | None  # the presented text; None means "use the winner's answer as it stands"


Action = StartTurn | CancelTurn | Present | Finish


@dataclass(frozen=True)
class Turn:
    turn_id: int
    version: int
    did_work: bool = False
    corrective: bool = False


@dataclass
class AgentState:
    letter: str
    answers: int = 0
    vote: Vote | None = None
    turn: Turn | None = None
    failed_turns: int = 0
    error: str | None = None

    @property
    def active(self) -> bool:
        return self.error is None

    @property
    def status(self) -> AgentStatus:
        if not self.active:
            return "failed"
        if self.turn is not None:
            return "working"
        return "voted" if self.vote else "waiting"


class Coordination:
    """The state of one job's coordination. Not thread-safe; one driver feeds it."""

    def __init__(
        self,
        letters: list[str],
        *,
        max_answers: int = 3,
        consensus: Literal["all_voted", "majority"] = "all_voted",
        present: bool = True,
        max_failed_turns: int = 3,
    ) -> None:
        if not letters or len(set(letters)) != len(letters):
            raise ValueError("letters must be distinct and non-empty")
        self.agents = {letter: AgentState(letter) for letter in letters}
        self.max_answers, self.consensus_rule = max_answers, consensus
        self.present, self.max_failed_turns = present, max_failed_turns
        self.answers: list[Answer] = []
        self.latest: dict[str, Answer] = {}
        self.version = 0
        self.votes_ever: Counter[str] = Counter()
        self.phase: Phase = "coordinating"
        self.outcome: Outcome | None = None
        self._next_turn = 0

    # Queries -------------------------------------------------------------------------------------
    def active(self) -> list[AgentState]:
        return [agent for agent in self.agents.values() if agent.active]

    def tally(self) -> dict[str, int]:
        """Current valid votes per latest label (labels with none included as 0), in posting order."""
        counts = Counter(agent.vote.label for agent in self.active() if agent.vote)
        return {answer.label: counts[answer.label] for answer in self.latest_answers()}

    def latest_answers(self) -> list[Answer]:
        return sorted(self.latest.values(), key=lambda answer: answer.seq)

    def answer(self, label: str) -> Answer | None:
        return next((answer for answer in self.answers if answer.label == label), None)

    # The one entry point -------------------------------------------------------------------------
    def apply(self, event: Event) -> list[Action]:
        """Advance the state by one event and return what the driver must do next."""
        if self.phase == "done":
            return []
        if isinstance(event, (Presented, PresentationFailed)):
            return self._on_presentation(event)
        if self.phase != "coordinating":
            return []
        if isinstance(event, Start):
            return [self._start_turn(agent) for agent in self.active()]
        if isinstance(event, Deadline):
            return self._finish(self._fallback(event.reason))
        agent = self.agents.get(event.letter)
        if agent is None or agent.turn is None or agent.turn.turn_id != event.turn_id:
            return []  # a late event from a cancelled or finished turn
        if isinstance(event, WorkStarted):
            agent.turn = Turn(agent.turn.turn_id, agent.turn.version, True, agent.turn.corrective)
            return []
        if isinstance(event, AnswerPosted):
            return self._on_answer(agent, event.content)
        if isinstance(event, VoteCast):
            return self._on_vote(agent, event)
        if isinstance(event, NoDecision):
            if not agent.turn.corrective:
                return [self._start_turn(agent, corrective=True)]
            if event.text.strip():
                return self._on_answer(agent, event.text)
            return self._on_failed_turn(agent, "the turn ended with no text and no decision")
        return self._on_failed_turn(agent, event.error, fatal=event.fatal)

    # Handlers ------------------------------------------------------------------------------------
    def _on_answer(self, agent: AgentState, content: str) -> list[Action]:
        if agent.answers >= self.max_answers:
            return self._on_failed_turn(
                agent, f"you have posted the maximum of {self.max_answers} answers; vote instead"
            )
        if not content.strip():
            return self._on_failed_turn(agent, "new_answer needs non-empty content")
        agent.answers += 1
        agent.turn = None
        agent.failed_turns = 0
        answer = Answer(f"{agent.letter}{agent.answers}", agent.letter, agent.answers, content, len(self.answers))
        self.answers.append(answer)
        self.latest[agent.letter] = answer
        self.version += 1
        if len(self.agents) > 1 and len(self.active()) == 1:
            # the others failed before any answer: a lone survivor's self-vote is not consensus
            # (tests/test_protocol.py::test_lone_survivor_answer_ends_without_consensus)
            return self._finish(self._fallback("all but one agent failed"))
        actions: list[Action] = []
        for other in self.active():
            other.vote = None  # vote invalidation: every vote is cast with the full current picture
            turn = other.turn
            if turn is None:
                actions.append(self._start_turn(other, note="the answers changed; look again"))
            elif turn.version < self.version and not turn.did_work and other.answers > 0:
                actions.append(CancelTurn(other.letter, turn.turn_id))
                actions.append(self._start_turn(other, note="the answers changed while you were thinking"))
        return actions

    def _on_vote(self, agent: AgentState, event: VoteCast) -> list[Action]:
        assert agent.turn is not None
        if agent.turn.version != self.version:
            return [self._start_turn(agent, note="the answers changed since your vote; vote again")]
        current = [answer.label for answer in self.latest_answers()]
        if event.label not in current:
            valid = ", ".join(current) or "none yet: post an answer"
            return self._on_failed_turn(agent, f"{event.label!r} is not a current answer (current: {valid})")
        agent.vote = Vote(agent.letter, event.label, event.reason)
        agent.turn = None
        agent.failed_turns = 0
        self.votes_ever[event.label] += 1
        return self._check_consensus()

    def _on_failed_turn(self, agent: AgentState, error: str, *, fatal: bool = False) -> list[Action]:
        agent.failed_turns += 1
        if not fatal and agent.failed_turns < self.max_failed_turns:
            return [self._start_turn(agent, note=error)]
        agent.error, agent.turn, agent.vote = error, None, None
        active = self.active()
        if not active:
            errors = {a.letter: a.error or "" for a in self.agents.values()}
            outcome = Outcome(None, False, False, "every agent failed", {}, failed=True, errors=errors)
            return self._finish(outcome)
        if len(self.agents) > 1 and len(active) == 1 and self.answers:
            return self._finish(self._fallback("all but one agent failed"))
        return self._check_consensus()

    def _on_presentation(self, event: Presented | PresentationFailed) -> list[Action]:
        if self.phase != "presenting" or self.outcome is None:
            return []
        self.phase = "done"
        if isinstance(event, Presented) and event.text.strip():
            return [Finish(self.outcome, event.text)]
        error = event.error if isinstance(event, PresentationFailed) else "empty presentation"
        reason = f"{self.outcome.reason}; presentation failed ({error}), the winning answer is returned as is"
        self.outcome = Outcome(**{**self.outcome.__dict__, "reason": reason})
        return [Finish(self.outcome, None)]

    # Ending --------------------------------------------------------------------------------------
    def _check_consensus(self) -> list[Action]:
        active = self.active()
        tally = self.tally()
        if self.consensus_rule == "majority":
            if any(count * 2 > len(active) for count in tally.values()):
                return self._finish(self._decide(tally, True, "a majority voted for it"))
            if not all(agent.vote for agent in active):
                return []
            return self._finish(self._decide(tally, False, "every agent voted but no answer won a majority"))
        if active and all(agent.vote for agent in active):
            return self._finish(self._decide(tally, True, "every active agent voted"))
        return []

    def _decide(self, tally: dict[str, int], consensus: bool, reason: str) -> Outcome:
        best = max(tally.values())
        tied = [label for label, count in tally.items() if count == best]  # posting order: earliest first
        return Outcome(tied[0], consensus, len(tied) > 1, reason, tally)

    def _fallback(self, reason: str) -> Outcome:
        tally = self.tally()
        errors = {a.letter: a.error for a in self.agents.values() if a.error}
        if not self.answers:
            return Outcome(None, False, False, f"{reason}; no answer was posted", tally, True, errors)
        if any(tally.values()):
            outcome = self._decide(tally, False, f"{reason}; the answer with the most current votes")
        elif self.votes_ever:
            best = max(self.votes_ever.values())
            tied = [a.label for a in self.answers if self.votes_ever[a.label] == best]
            outcome = Outcome(tied[0], False, len(tied) > 1, f"{reason}; the answer with most votes ever", tally)
        else:
            outcome = Outcome(self.answers[-1].label, False, False, f"{reason}; the latest answer", tally)
        return Outcome(**{**outcome.__dict__, "errors": errors})

    def _finish(self, outcome: Outcome) -> list[Action]:
        dropped = {a.letter: a.error for a in self.agents.values() if a.error}
        outcome = Outcome(**{**outcome.__dict__, "errors": {**dropped, **outcome.errors}})
        actions: list[Action] = []
        for agent in self.agents.values():
            if agent.turn is not None:
                actions.append(CancelTurn(agent.letter, agent.turn.turn_id))
                agent.turn = None
        self.outcome = outcome
        winner = self.answer(outcome.winner) if outcome.winner else None
        if self.present and winner is not None and self.agents[winner.letter].active:
            self.phase = "presenting"
            actions.append(Present(winner.letter, outcome))
        else:
            self.phase = "done"
            actions.append(Finish(outcome, None))
        return actions

    def _start_turn(self, agent: AgentState, *, corrective: bool = False, note: str = "") -> StartTurn:
        self._next_turn += 1
        agent.turn = Turn(self._next_turn, self.version, False, corrective)
        return StartTurn(
            agent.letter,
            self._next_turn,
            self.version,
            can_answer=agent.answers < self.max_answers,
            labels=tuple(answer.label for answer in self.latest_answers()),
            corrective=corrective,
            note=note,
        )
