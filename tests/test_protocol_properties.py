"""Property tests for the coordination protocol: random event orders, invariants after every step."""

from __future__ import annotations

import string

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from conclave.coordination.protocol import Coordination
from conclave.coordination.protocol_events import (
    AnswerPosted,
    CancelTurn,
    Deadline,
    Finish,
    NoDecision,
    Present,
    PresentationFailed,
    Presented,
    Start,
    StartTurn,
    Steer,
    Stop,
    TurnFailed,
    Verified,
    Verify,
    VoteCast,
    WorkStarted,
)

TEXTS = st.sampled_from(["an answer", "another answer", "a third answer", "", "   "])
KEYS = st.sampled_from(["", "paris", "#42"])  # the driver's normalised answers: equal keys agree
RARE = st.integers(0, 9).map(lambda n: n == 9)  # destructive events, kept rare so jobs run deep


class Turns:
    """The driver's view of turns in flight, kept only from the actions the protocol returns."""

    def __init__(self) -> None:
        self.in_flight: dict[str, StartTurn] = {}
        self.cancelled: list[tuple[str, int]] = []
        self.worked: set[int] = set()
        self.present_seen = False
        self.checks: list[str] = []  # labels sent to be checked and not yet answered
        self.checked: set[str] = set()

    def track(self, c: Coordination, actions: list, *, steering: bool = False) -> None:
        ending = any(isinstance(a, (Present, Finish)) for a in actions)
        for action in actions:
            if isinstance(action, StartTurn):
                assert action.letter not in self.in_flight, f"two turns in flight for {action.letter}"
                assert sorted(action.labels) == sorted(a.label for a in c.latest.values())  # an order of them
                self.in_flight[action.letter] = action
            elif isinstance(action, CancelTurn):
                assert self.in_flight.pop(action.letter).turn_id == action.turn_id
                if not ending:  # a turn that did work or will give a first answer keeps going
                    assert action.turn_id not in self.worked  # (a note restarts a first answer's thinking)
                    assert steering or c.agents[action.letter].answers > 0
                self.cancelled.append((action.letter, action.turn_id))
            elif isinstance(action, Verify):
                assert action.label == c.answers[-1].label, "a check is asked for the answer just posted"
                assert action.label not in self.checked and action.label not in self.checks
                self.checks.append(action.label)
            elif isinstance(action, (Present, Finish)):
                assert not self.in_flight, "the job ended with turns still running"
                self.present_seen |= isinstance(action, Present)


class ProtocolMachine(RuleBasedStateMachine):
    """Posts answers, votes (valid, stale, invalid), work, no-decisions, failures and a deadline."""

    @initialize(
        n=st.integers(1, 5),
        cap=st.integers(1, 3),
        rule_=st.sampled_from(["all_voted", "majority"]),
        present=st.booleans(),
        max_failed=st.integers(2, 3),
        verify=st.booleans(),
    )
    def start(self, n: int, cap: int, rule_: str, present: bool, max_failed: int, verify: bool) -> None:
        letters = list(string.ascii_uppercase[:n])
        self.c = Coordination(
            letters,
            max_answers=cap,
            consensus=rule_,
            present=present,
            max_failed_turns=max_failed,
            verify=verify,
        )
        self.turns = Turns()
        self.just_answered = False
        self.stopped = False  # a Stop ended the job: it never presents
        self.turns.track(self.c, self.c.apply(Start()))

    # Helpers -------------------------------------------------------------------------------------
    def running(self) -> bool:
        return bool(self.turns.in_flight)

    def can_vote(self) -> bool:
        return bool(self.turns.in_flight) and bool(self.c.latest)

    def pick(self, data: st.DataObject) -> StartTurn:
        return data.draw(st.sampled_from(sorted(self.turns.in_flight.values(), key=lambda t: t.letter)))

    def votes(self) -> dict[str, object]:
        return {letter: agent.vote for letter, agent in self.c.agents.items()}

    def end_turn(self, turn: StartTurn, event: object) -> list:
        """Apply an event that ends `turn` (the driver no longer runs it, whatever the protocol says)."""
        del self.turns.in_flight[turn.letter]
        actions = self.c.apply(event)
        self.turns.track(self.c, actions)
        return actions

    # Rules ---------------------------------------------------------------------------------------
    @precondition(running)
    @rule(data=st.data(), text=TEXTS, key=KEYS)
    def post_answer(self, data: st.DataObject, text: str, key: str) -> None:
        turn = self.pick(data)
        before = len(self.c.answers)
        self.end_turn(turn, AnswerPosted(turn.letter, turn.turn_id, text, key))
        self.just_answered = len(self.c.answers) > before
        if self.just_answered:
            assert text.strip() and self.c.answers[-1].content == text

    @precondition(can_vote)
    @rule(data=st.data())
    def vote_current(self, data: st.DataObject) -> None:
        turn = self.pick(data)
        label = data.draw(st.sampled_from([a.label for a in self.c.latest_answers()]))
        self.end_turn(turn, VoteCast(turn.letter, turn.turn_id, label))
        self.just_answered = False

    @precondition(can_vote)
    @rule(data=st.data())
    def vote_from_turn_picture(self, data: st.DataObject) -> None:
        """Votes for a label the turn was shown; stale when the answers changed since it started."""
        turn = self.pick(data)
        label = data.draw(st.sampled_from(turn.labels)) if turn.labels else "A1"
        self.end_turn(turn, VoteCast(turn.letter, turn.turn_id, label))
        self.just_answered = False

    @precondition(running)
    @rule(data=st.data())
    def vote_invalid(self, data: st.DataObject) -> None:
        turn = self.pick(data)
        current = {a.label for a in self.c.latest.values()}
        old = [a.label for a in self.c.answers if a.label not in current]
        label = data.draw(st.sampled_from([*old, "Z9", "", "a1"]))
        before = self.c.agents[turn.letter].failed_turns
        self.end_turn(turn, VoteCast(turn.letter, turn.turn_id, label))
        agent = self.c.agents[turn.letter]
        assert agent.vote is None
        if turn.version == self.c.version and agent.active:
            assert agent.failed_turns == before + 1
        elif turn.version != self.c.version:
            assert agent.failed_turns == before  # a stale vote is re-asked, not a failed turn
        self.just_answered = False

    @precondition(running)
    @rule(data=st.data())
    def work_started(self, data: st.DataObject) -> None:
        turn = self.pick(data)
        assert self.c.apply(WorkStarted(turn.letter, turn.turn_id)) == []
        assert self.c.agents[turn.letter].turn.did_work
        self.turns.worked.add(turn.turn_id)
        self.just_answered = False

    @precondition(running)
    @rule(data=st.data(), text=TEXTS)
    def no_decision(self, data: st.DataObject, text: str) -> None:
        turn = self.pick(data)
        self.end_turn(turn, NoDecision(turn.letter, turn.turn_id, text))
        self.just_answered = False

    @precondition(running)
    @rule(data=st.data(), fatal=RARE, transient=st.booleans())
    def fail_turn(self, data: st.DataObject, fatal: bool, transient: bool) -> None:
        if not (fatal or transient):
            return
        turn = self.pick(data)
        self.end_turn(turn, TurnFailed(turn.letter, turn.turn_id, f"error of {turn.letter}", fatal))
        if fatal:
            assert not self.c.agents[turn.letter].active
        self.just_answered = False

    @precondition(lambda self: self.turns.checks)
    @rule(data=st.data(), passed=st.booleans())
    def check_result(self, data: st.DataObject, passed: bool) -> None:
        label = data.draw(st.sampled_from(self.turns.checks))
        self.turns.checks.remove(label)
        self.turns.checked.add(label)
        current = self.c.latest.get(label[0]) is self.c.answer(label)
        coordinating, version, votes = self.c.phase == "coordinating", self.c.version, self.votes()
        waiting = {letter for letter, agent in self.c.agents.items() if agent.waiting}
        actions = self.c.apply(Verified(label, passed))
        self.turns.track(self.c, actions)
        started = {a.letter for a in actions if isinstance(a, StartTurn)}
        if coordinating:
            assert self.c.verdicts[label] == ("passed" if passed else "failed")
            assert self.c.version == version and votes == self.votes()  # a result is no new round
            if self.c.pending() or not current:
                assert not started, "a turn started while a current answer was being checked"
            else:  # the last result in: every waiting agent gets its turn, once
                assert started == waiting and not any(a.waiting for a in self.c.agents.values())
        assert self.c.apply(Verified(label, not passed)) == []  # a result counts once
        self.just_answered = False

    @precondition(lambda self: self.c.phase != "done")
    @rule(now=RARE)
    def stop(self, now: bool) -> None:
        if not now:
            return
        self.stopped = self.c.phase == "coordinating"
        actions = self.c.apply(Stop("budget reached"))
        assert not any(isinstance(a, (Present, StartTurn)) for a in actions)
        self.turns.track(self.c, actions)
        assert self.c.phase == "done" and isinstance(actions[-1], Finish) and actions[-1].final_text is None
        self.just_answered = False

    @precondition(lambda self: self.c.phase == "coordinating")
    @rule(note=TEXTS)
    def steer(self, note: str) -> None:
        before = self.c.version
        actions = self.c.apply(Steer(note))
        self.turns.track(self.c, actions, steering=True)
        assert self.c.version == before + 1 and self.c.notes[-1] == note
        assert all(a.notes[-1] == note for a in actions if isinstance(a, StartTurn))
        self.just_answered = True  # a note clears every vote, as a new answer does

    @precondition(lambda self: self.turns.cancelled)
    @rule(data=st.data())
    def late_event(self, data: st.DataObject) -> None:
        letter, turn_id = data.draw(st.sampled_from(self.turns.cancelled))
        snapshot = (len(self.c.answers), self.c.version, self.c.phase)
        assert self.c.apply(VoteCast(letter, turn_id, "A1")) == []
        assert self.c.apply(AnswerPosted(letter, turn_id, "late")) == []
        assert self.c.apply(TurnFailed(letter, turn_id, "late", fatal=True)) == []
        assert (len(self.c.answers), self.c.version, self.c.phase) == snapshot

    @precondition(lambda self: self.c.phase == "coordinating")
    @rule(now=RARE)
    def deadline(self, now: bool) -> None:
        if not now:
            return
        self.turns.track(self.c, self.c.apply(Deadline("job timeout")))
        self.just_answered = False
        assert self.c.phase != "coordinating" and self.c.outcome.consensus is False
        assert self.c.outcome.fallback or self.c.outcome.failed

    @precondition(lambda self: self.c.phase == "presenting")
    @rule(now=RARE)
    def deadline_while_presenting(self, now: bool) -> None:
        if not now:
            return
        before = self.c.outcome
        actions = self.c.apply(Deadline("job timeout"))
        assert len(actions) == 1 and isinstance(actions[0], Finish) and actions[0].final_text is None
        assert self.c.phase == "done" and self.c.outcome.winner == before.winner
        assert self.c.outcome.consensus == before.consensus and "not presented" in self.c.outcome.reason

    @precondition(lambda self: self.c.phase == "presenting")
    @rule(ok=st.booleans())
    def presentation(self, ok: bool) -> None:
        event = Presented("final text") if ok else PresentationFailed("provider down")
        actions = self.c.apply(event)
        assert len(actions) == 1 and isinstance(actions[0], Finish)
        assert actions[0].final_text == ("final text" if ok else None)
        assert self.c.phase == "done"

    @precondition(lambda self: self.c.phase == "done")
    @rule(data=st.data())
    def events_after_done(self, data: st.DataObject) -> None:
        letter = data.draw(st.sampled_from(sorted(self.c.agents)))
        for event in (Start(), Deadline("late"), Presented("late"), AnswerPosted(letter, 1, "late")):
            assert self.c.apply(event) == []

    # Invariants ----------------------------------------------------------------------------------
    @invariant()
    def votes_name_current_answers(self) -> None:
        current = {a.label for a in self.c.latest.values()}
        for agent in self.c.agents.values():
            assert agent.vote is None or agent.vote.label in current

    @invariant()
    def no_vote_survives_a_new_answer(self) -> None:
        if self.just_answered:
            assert all(agent.vote is None for agent in self.c.agents.values())

    @invariant()
    def outcome_is_consistent(self) -> None:
        outcome = self.c.outcome
        if outcome is None:
            assert self.c.phase == "coordinating"
            return
        posted = {a.label for a in self.c.answers}
        assert outcome.winner is None or outcome.winner in posted
        assert (outcome.winner is None) == outcome.failed
        passed = [a for a in self.c.latest_answers() if self.c.verdicts.get(a.label) == "passed"]
        if any(
            outcome.tally.get(a.label, 0) for a in passed
        ):  # an answer that passed holds votes: one of those wins
            assert outcome.verdict == "passed"
        if not (outcome.fallback or outcome.failed):
            assert outcome.pending == (), "the vote ended while a current answer was being checked"
        if any(outcome.tally.values()):  # decided on current votes, by groups of equal keys
            totals: dict[str, int] = {}  # in order of each group's first posting
            among = passed if any(outcome.tally.get(a.label, 0) for a in passed) else self.c.latest_answers()
            for answer in among:
                totals[answer.key] = totals.get(answer.key, 0) + outcome.tally[answer.label]
            tied = [key for key, total in totals.items() if total == max(totals.values())]
            assert self.c.answer(outcome.winner).key == tied[0] and outcome.tie == (len(tied) > 1)
            assert outcome.votes == max(totals.values()) and outcome.voters == sum(outcome.tally.values())
        if outcome.consensus:  # a strict majority of the votes cast, in a vote that finished
            assert not outcome.fallback and outcome.votes * 2 > outcome.voters
        if outcome.consensus and self.c.consensus_rule == "majority":
            assert outcome.votes * 2 > len(self.c.active())
        if not (outcome.fallback or outcome.failed) and self.c.consensus_rule == "all_voted":
            assert outcome.all_voted
        winner = self.c.answer(outcome.winner) if outcome.winner else None
        if self.c.present and winner and self.c.agents[winner.letter].active and not self.stopped:
            assert self.turns.present_seen

    @invariant()
    def turns_match_the_protocol(self) -> None:
        for letter, agent in self.c.agents.items():
            driver = self.turns.in_flight.get(letter)
            assert (agent.turn.turn_id if agent.turn else None) == (driver.turn_id if driver else None)
            if agent.turn is not None:
                assert agent.active and agent.vote is None
                stale = agent.turn.version < self.c.version
                assert not stale or agent.turn.did_work or agent.answers == 0  # else cancelled
            if not agent.active:
                assert agent.vote is None and agent.turn is None
            else:
                assert agent.failed_turns < self.c.max_failed_turns

    @invariant()
    def every_vote_knows_every_result(self) -> None:
        """While a current answer is being checked no vote stands and no turn of this round runs: the
        agents wait (each with its next turn held back) and decide once the results are in."""
        if self.c.pending() and self.c.phase == "coordinating":
            assert all(agent.vote is None for agent in self.c.agents.values())
            assert all(t.version < self.c.version for t in self.turns.in_flight.values())
        for agent in self.c.agents.values():
            assert agent.waiting is None or (agent.turn is None and agent.active and self.c.pending())

    @invariant()
    def a_coordinating_job_never_stalls(self) -> None:
        if self.c.phase == "coordinating":
            waiting = set(self.c.pending()) <= set(self.turns.checks) and self.c.pending()
            assert self.turns.in_flight or waiting, (
                "coordinating, but no turn and no check runs: the job would hang"
            )
            if len(self.c.agents) > 1 and self.c.answers:
                assert len(self.c.active()) > 1, "all but one agent failed, yet the job goes on"

    @invariant()
    def every_pending_answer_was_sent_to_be_checked(self) -> None:
        pending = {label for label, verdict in self.c.verdicts.items() if verdict == "pending"}
        if self.c.phase == "coordinating":  # once done, the driver drops the checks still running
            assert pending == set(self.turns.checks), "a check result is awaited that nobody was asked to run"
        else:  # and the result names only checks that were asked for
            assert set(self.c.outcome.pending) <= set(self.turns.checks) | self.turns.checked

    @invariant()
    def answers_within_cap_and_labels_unique(self) -> None:
        labels = [a.label for a in self.c.answers]
        assert len(labels) == len(set(labels))
        for letter, agent in self.c.agents.items():
            mine = [a for a in self.c.answers if a.letter == letter]
            assert len(mine) == agent.answers <= self.c.max_answers
            assert [a.revision for a in mine] == list(range(1, len(mine) + 1))


ProtocolMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=50, deadline=None)
TestProtocolMachine = ProtocolMachine.TestCase


# Every job ends ---------------------------------------------------------------------------------
def step_bound(n: int, cap: int, max_failed: int, verify: bool = False) -> int:
    """Most decisions a job can take. Versions: V <= n*cap + 1 (a check's result is no new version).
    Per agent: at most one valid vote and one stale re-ask per version,
    one answer per version at most, and at most `max_failed` invalid votes between two successes (so
    max_failed * (V + 1)); plus one presentation, and one result per answer."""
    versions = n * cap + 1
    return n * (2 * versions + max_failed * (versions + 1)) + 1 + (n * cap if verify else 0)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 6),
    cap=st.integers(1, 3),
    rule_=st.sampled_from(["all_voted", "majority"]),
    present=st.booleans(),
    verify=st.booleans(),
    data=st.data(),
)
def test_every_job_ends(
    n: int, cap: int, rule_: str, present: bool, verify: bool, data: st.DataObject
) -> None:
    c = Coordination(
        list(string.ascii_uppercase[:n]), max_answers=cap, consensus=rule_, present=present, verify=verify
    )
    pending: dict[str, StartTurn] = {}
    checks: list[str] = []
    ended: list = []

    def feed(event: object) -> None:
        for action in c.apply(event):
            if isinstance(action, StartTurn):
                pending[action.letter] = action
            elif isinstance(action, CancelTurn):
                pending.pop(action.letter)
            elif isinstance(action, Verify):
                checks.append(action.label)
            else:
                ended.append(action)

    feed(Start())
    bound = step_bound(n, cap, c.max_failed_turns, verify)
    for _ in range(bound):
        if c.phase == "done":
            break
        if c.phase == "presenting":
            feed(Presented("final"))
            continue
        if checks and (not pending or data.draw(st.booleans())):
            label = checks.pop(data.draw(st.integers(0, len(checks) - 1)))
            feed(Verified(label, data.draw(st.booleans())))
            continue
        turn = pending.pop(data.draw(st.sampled_from(sorted(pending))))
        answer = turn.can_answer and (not turn.labels or data.draw(st.booleans()))
        if answer:
            feed(AnswerPosted(turn.letter, turn.turn_id, f"answer by {turn.letter}"))
        elif data.draw(st.integers(0, 9)) == 0:
            feed(VoteCast(turn.letter, turn.turn_id, "Z9"))  # occasionally invalid
        else:
            feed(VoteCast(turn.letter, turn.turn_id, data.draw(st.sampled_from(turn.labels))))
    assert c.phase == "done", f"no end within {bound} steps"
    assert isinstance(ended[-1], Finish) and not pending
    outcome = ended[-1].outcome
    assert outcome.failed or outcome.winner in {a.label for a in c.answers}
    assert (
        outcome.fallback or outcome.failed or outcome.pending == ()
    )  # a vote ends only with every check back
