"""The coordination protocol: a pure state machine. Feed it events, carry out the actions it returns.

No I/O, no clock, no randomness: seeds and moments come in as data, so a job replays from its event
log. Who wins is tally.py's (pure too). The rules:
- Answers are labelled letter + revision (A1, B2); the driver gives each a key, its normalised final
  answer, and answers with equal keys agree (a group). Each turn lists the current answers in the
  voter's own order, drawn from (seed, voter, version), labels unchanged: position is never a vote.
- A new answer bumps the version and clears every vote. A vote counts only if its turn started at the
  current version and names a current answer; else the agent gets a fresh turn (a wrong label is a
  failed turn, a stale one is not). A stale turn that has done no work and is not its agent's first
  answer is cancelled and restarted. An agent at `max_answers` may only vote.
- Verification (`verify`): each accepted answer gets a `Verify` action and is pending until `Verified`.
  While a current answer is pending no turn starts: the agent waits (`Deferred`), and every waiting
  turn starts once the last current result is in. So every vote knows every result, and a result
  clears no vote (voters are not paid twice). The vote cannot end while a current answer is pending
  (a deadline or a stop can, naming what was pending).
- `all_voted` ends when every active agent holds a vote; `majority` when one group holds votes from
  more than half of the active agents. The winner: tally.py. Consensus: a strict majority of the votes.
- Ending early (deadline, all but one agent failed, a `Stop` such as a budget) picks the best-supported
  answer, marked `fallback`, never consensus. A deadline while presenting returns the winning answer as
  it stands; a `Stop` never presents.
- A turn that ends with plain text gets one corrective retry; after that non-empty text is an answer.
- Steering (`Steer`): the note joins every later turn's picture and clears every vote like a new
  answer; a turn in flight that has only been thinking restarts with it, a first answer's included.
  A note before `Start` waits for the first turns; after the vote it is kept but changes nothing.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import assert_never

from conclave.coordination.protocol_events import (
    Action,
    AnswerPosted,
    CancelTurn,
    Deadline,
    Finish,
    NoDecision,
    Present,
    PresentationFailed,
    Presented,
    ProtocolEvent,
    Start,
    StartTurn,
    Steer,
    Stop,
    TurnEvents,
    TurnFailed,
    Verified,
    Verify,
    VoteCast,
    WorkStarted,
)
from conclave.coordination.protocol_state import AgentState, Deferred, Phase, Rule, Turn, Vote
from conclave.coordination.tally import (
    Answer,
    Board,
    Outcome,
    StopReason,
    Verdict,
    agreeing,
    decide,
    fallback,
    leading,
)


class Coordination:
    """The state of one job's coordination. Not thread-safe; one driver feeds it."""

    def __init__(
        self,
        letters: list[str],
        *,
        max_answers: int = 3,
        consensus: Rule = "all_voted",
        present: bool = True,
        max_failed_turns: int = 3,
        seed: int = 0,  # seed: the voters' orders
        verify: bool = False,  # every answer is checked (Verify / Verified) before the vote may end
    ) -> None:
        if not letters or len(set(letters)) != len(letters):
            raise ValueError("letters must be distinct and non-empty")
        self.agents = {letter: AgentState(letter) for letter in letters}
        self.max_answers, self.consensus_rule = max_answers, consensus
        self.present, self.max_failed_turns, self.seed = present, max_failed_turns, seed
        self.verify = verify
        self.answers: list[Answer] = []
        self.latest: dict[str, Answer] = {}
        self.verdicts: dict[str, Verdict] = {}
        self.version = 0
        self.votes_ever: Counter[str] = Counter()
        self.phase: Phase = "coordinating"
        self.outcome: Outcome | None = None
        self.notes: tuple[str, ...] = ()  # steering notes, oldest first
        self.started = False
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

    def agreeing(self) -> tuple[tuple[str, ...], ...]:
        """The current answers that agree (one key), in groups of two or more, in posting order."""
        return agreeing(self.latest_answers())

    def pending(self) -> tuple[str, ...]:
        """Current answers whose verification has not come back yet."""
        return tuple(a.label for a in self.latest_answers() if self.verdicts.get(a.label) == "pending")

    def leading(self) -> Outcome | None:
        """The answer that would win if the job stopped now (a query: nothing changes)."""
        return leading(self._board())

    def order_for(self, letter: str, version: int) -> tuple[str, ...]:
        """The current labels in the order voter `letter` sees them at `version`: drawn from the seed."""
        labels = [answer.label for answer in self.latest_answers()]
        random.Random(f"{self.seed}:{letter}:{version}").shuffle(labels)
        return tuple(labels)

    # The one entry point -------------------------------------------------------------------------
    def apply(self, event: ProtocolEvent) -> list[Action]:
        """Advance the state by one event and return what the driver must do next."""
        match event:
            case Steer():  # in every phase: a note is kept even after the vote
                return self._on_steer(event.note)
            case _ if self.phase == "done":
                return []
            case Presented() | PresentationFailed():
                return self._on_presentation(event)
            case Deadline() | Stop() if self.phase == "presenting":
                failed = PresentationFailed(f"{event.reason} during the presentation")
                return self._on_presentation(failed, stopped_by=_stopped_by(event))
            case _ if self.phase != "coordinating":
                return []
            case Start():
                self.started = True
                return [self._start_turn(agent) for agent in self.active()]
            case Deadline() | Stop():
                outcome = fallback(self._board(), event.reason).model_copy(
                    update={"stopped_by": _stopped_by(event)}
                )
                return self._finish(outcome, present=isinstance(event, Deadline))
            case Verified():
                return self._on_verified(event)
            case WorkStarted() | AnswerPosted() | VoteCast() | NoDecision() | TurnFailed():
                return self._on_turn_event(event)
            case _:
                assert_never(event)

    def _on_turn_event(self, event: TurnEvents) -> list[Action]:
        agent = self.agents.get(event.letter)
        if agent is None or agent.turn is None or agent.turn.turn_id != event.turn_id:
            return []  # a late event from a cancelled or finished turn
        match event:
            case WorkStarted():
                agent.turn = Turn(agent.turn.turn_id, agent.turn.version, True, agent.turn.corrective)
                return []
            case AnswerPosted():
                return self._on_answer(agent, event.content, event.key)
            case VoteCast():
                return self._on_vote(agent, event)
            case NoDecision():
                if not agent.turn.corrective:
                    agent.turn = None
                    return self._turn_or_wait(agent, corrective=True)
                if event.text.strip():
                    return self._on_answer(agent, event.text, event.key)
                return self._on_failed_turn(agent, "the turn ended with no text and no decision")
            case TurnFailed():
                return self._on_failed_turn(agent, event.error, fatal=event.fatal)
            case _:
                assert_never(event)

    # Handlers ------------------------------------------------------------------------------------
    def _on_answer(self, agent: AgentState, content: str, key: str) -> list[Action]:
        if agent.answers >= self.max_answers:
            why = f"you have posted the maximum of {self.max_answers} answers; vote instead"
            return self._on_failed_turn(agent, why)
        if not content.strip():
            return self._on_failed_turn(agent, "new_answer needs non-empty content")
        agent.answers += 1
        agent.turn = None
        agent.failed_turns = 0
        label, seq = f"{agent.letter}{agent.answers}", len(self.answers)
        answer = Answer(
            label=label,
            letter=agent.letter,
            revision=agent.answers,
            content=content,
            seq=seq,
            key=key or content.strip(),
        )
        self.answers.append(answer)
        self.latest[agent.letter] = answer
        if len(self.agents) > 1 and len(self.active()) == 1:
            # the others failed before any answer: a lone survivor's self-vote is not consensus
            return self._finish(fallback(self._board(), "all but one agent failed"))
        if not self.verify:
            return self._invalidate("the answers changed")
        self.verdicts[label] = "pending"  # only now: a check is asked for every pending answer
        return [Verify(label), *self._invalidate("the answers changed")]

    def _on_verified(self, event: Verified) -> list[Action]:
        if self.verdicts.get(event.label) != "pending":
            return []  # unknown, or already known: a result counts once
        self.verdicts[event.label] = "passed" if event.passed else "failed"
        if self.pending():
            return []  # the turns wait for every current result
        actions: list[Action] = []
        for agent in self.active():  # no vote was cast since the answers changed: nothing to clear
            if agent.waiting is not None:
                deferred, agent.waiting = agent.waiting, None
                actions.append(self._start_turn(agent, corrective=deferred.corrective, note=deferred.note))
        return actions

    def _on_steer(self, note: str) -> list[Action]:
        self.notes = (*self.notes, note)
        if not self.started or self.phase != "coordinating":
            return []  # before Start the first turns carry it; after the vote it changes nothing
        return self._invalidate("the person who asked added a note", first_answers=True)

    def _invalidate(self, why: str, *, first_answers: bool = False) -> list[Action]:
        """The picture changed: bump the version, clear every vote, give idle agents a turn and restart
        stale ones that have only been thinking (every vote is cast with the full current picture);
        with `first_answers`, a first answer's thinking too (a steering note changes the task)."""
        self.version += 1
        actions: list[Action] = []
        for other in self.active():
            other.vote = None
            turn = other.turn
            if turn is None:
                actions += self._turn_or_wait(other, note=f"{why}; look again")
            elif turn.version < self.version and not turn.did_work and (other.answers > 0 or first_answers):
                other.turn = None
                actions.append(CancelTurn(other.letter, turn.turn_id))
                actions += self._turn_or_wait(other, note=f"{why} while you were thinking")
        return actions

    def _on_vote(self, agent: AgentState, event: VoteCast) -> list[Action]:
        assert agent.turn is not None
        if agent.turn.version != self.version:
            agent.turn = None
            return self._turn_or_wait(agent, note="the answers changed since your vote; vote again")
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
            agent.turn = None
            return self._turn_or_wait(agent, note=error)
        agent.error, agent.turn, agent.vote = error, None, None
        active = self.active()
        if not active:
            errors = {a.letter: a.error or "" for a in self.agents.values()}
            outcome = Outcome(
                winner=None, consensus=False, reason="every agent failed", failed=True, errors=errors
            )
            return self._finish(outcome)
        if len(self.agents) > 1 and len(active) == 1 and self.answers:
            return self._finish(fallback(self._board(), "all but one agent failed"))
        return self._check_consensus()

    def _on_presentation(
        self, event: Presented | PresentationFailed, *, stopped_by: StopReason | None = None
    ) -> list[Action]:
        if self.phase != "presenting" or self.outcome is None:
            return []
        self.phase = "done"
        if isinstance(event, Presented) and event.text.strip():
            return [Finish(self.outcome, event.text)]
        error = event.error if isinstance(event, PresentationFailed) else "empty presentation"
        reason = f"not presented ({error}): the winning answer is returned as it stands"
        update = {
            "reason": f"{self.outcome.reason}; {reason}",
            "stopped_by": stopped_by or self.outcome.stopped_by,
        }
        self.outcome = self.outcome.model_copy(update=update)
        return [Finish(self.outcome, None)]

    # Ending ------------------------------------------------------------------------------------
    def _board(self) -> Board:
        return Board(
            tuple(self.answers),
            tuple(self.latest_answers()),
            self.tally(),
            self.votes_ever,
            all(agent.vote for agent in self.active()),
            self.verdicts,
        )

    def _check_consensus(self) -> list[Action]:
        if not any(self.tally().values()) or self.pending():
            return []  # no vote yet, or a check still running: the vote cannot end
        outcome = decide(self._board(), self.tally(), self.latest_answers(), "")
        if self.consensus_rule == "majority" and outcome.votes * 2 > len(self.active()):
            return self._finish(_reason(outcome, True, "a majority of the agents chose it"))
        if not outcome.all_voted:
            return []
        majority = outcome.votes * 2 > outcome.voters
        why = "a majority chose it" if majority else "no answer has a majority"
        return self._finish(_reason(outcome, majority, f"every active agent voted; {why}"))

    def _finish(self, outcome: Outcome, *, present: bool = True) -> list[Action]:
        dropped = {a.letter: a.error for a in self.agents.values() if a.error}
        outcome = outcome.model_copy(
            update={"errors": {**dropped, **outcome.errors}, "pending": self.pending()}
        )
        if outcome.pending:
            reason = f"{outcome.reason}; still being checked: {', '.join(outcome.pending)}"
            outcome = outcome.model_copy(update={"reason": reason})
        actions: list[Action] = []
        for agent in self.agents.values():
            agent.waiting = None
            if agent.turn is not None:
                actions.append(CancelTurn(agent.letter, agent.turn.turn_id))
                agent.turn = None
        self.outcome = outcome
        winner = self.answer(outcome.winner) if outcome.winner else None
        if present and self.present and winner is not None and self.agents[winner.letter].active:
            self.phase = "presenting"
            actions.append(Present(winner.letter, outcome))
        else:
            self.phase = "done"
            actions.append(Finish(outcome, None))
        return actions

    def _turn_or_wait(self, agent: AgentState, *, corrective: bool = False, note: str = "") -> list[Action]:
        """The agent's next turn, or none yet while a current answer is being checked (it waits)."""
        if self.pending():
            agent.waiting = Deferred(note, corrective)
            return []
        return [self._start_turn(agent, corrective=corrective, note=note)]

    def _start_turn(self, agent: AgentState, *, corrective: bool = False, note: str = "") -> StartTurn:
        self._next_turn += 1
        agent.turn = Turn(self._next_turn, self.version, False, corrective)
        can_answer, labels = agent.answers < self.max_answers, self.order_for(agent.letter, self.version)
        return StartTurn(
            agent.letter, self._next_turn, self.version, can_answer, labels, corrective, note, self.notes
        )


def _reason(outcome: Outcome, consensus: bool, why: str) -> Outcome:  # why it ended, then decide()'s notes
    return outcome.model_copy(update={"consensus": consensus, "reason": f"{why}{outcome.reason}"})


def _stopped_by(event: Deadline | Stop) -> StopReason:
    return event.cause if isinstance(event, Stop) else StopReason.DEADLINE
