"""One or more unit tests per coordination rule (docs/ARCHITECTURE.md, "The protocol")."""

from __future__ import annotations

import string

import pytest

from conclave.coordination.members import assign_letters
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
    TurnFailed,
    VoteCast,
    WorkStarted,
)


class Job:
    """Drives a `Coordination` like a script; `turns` maps letter -> the turn id it is in now."""

    def __init__(self, n: int = 3, **options: object) -> None:
        self.c = Coordination(list(string.ascii_uppercase[:n]), **options)
        self.turns: dict[str, int] = {}
        self.last = self.feed(Start())

    def feed(self, event: object) -> list:
        self.last = self.c.apply(event)
        for action in self.last:
            if isinstance(action, StartTurn):
                self.turns[action.letter] = action.turn_id
            elif isinstance(action, CancelTurn):
                self.turns.pop(action.letter, None)
        return self.last

    def answer(self, letter: str, content: str | None = None, key: str = "") -> list:
        return self.feed(AnswerPosted(letter, self.turns[letter], content or f"answer by {letter}", key))

    def vote(self, letter: str, label: str) -> list:
        return self.feed(VoteCast(letter, self.turns[letter], label, "because"))

    def work(self, letter: str) -> list:
        return self.feed(WorkStarted(letter, self.turns[letter]))

    def fail(self, letter: str, error: str = "boom", fatal: bool = False) -> list:
        return self.feed(TurnFailed(letter, self.turns[letter], error, fatal))

    def no_decision(self, letter: str, text: str = "") -> list:
        return self.feed(NoDecision(letter, self.turns[letter], text))

    def started(self, letter: str) -> StartTurn:
        """The StartTurn for `letter` in the last actions (fails if there is none)."""
        return next(a for a in self.last if isinstance(a, StartTurn) and a.letter == letter)


def first_answers(job: Job, letters: str) -> None:
    """Each letter posts its first answer, in order; afterwards every turn is at the current version."""
    for letter in letters:
        job.answer(letter)


def ends(actions: list):
    """The Present or Finish among `actions`, or None."""
    return next((a for a in actions if isinstance(a, (Present, Finish))), None)


# Letters and labels -----------------------------------------------------------------------------
def test_letters_same_seed_same_result() -> None:
    assert assign_letters(8, 1234) == assign_letters(8, 1234)


def test_letters_differ_for_some_seed() -> None:
    assert len({tuple(assign_letters(6, seed)) for seed in range(20)}) > 1


@pytest.mark.parametrize("count", [1, 2, 5, 16])
def test_each_letter_once(count: int) -> None:
    assert sorted(assign_letters(count, 7)) == list(string.ascii_uppercase[:count])


def test_labels_are_letter_plus_revision() -> None:
    job = Job(2)
    first_answers(job, "AB")
    job.answer("A")
    assert [a.label for a in job.c.answers] == ["A1", "B1", "A2"]
    assert sorted(job.started("B").labels) == ["A2", "B1"]


# Each voter's own order ---------------------------------------------------------------------------
def test_each_voter_sees_the_answers_in_its_own_order_and_it_replays() -> None:
    def orders(seed: int) -> dict[str, tuple[str, ...]]:
        job = Job(5, seed=seed)
        first_answers(job, "ABCDE")  # after E's answer every agent gets a turn at the same version
        return {letter: job.started(letter).labels for letter in "ABCD"}

    first = orders(7)
    assert all(sorted(labels) == ["A1", "B1", "C1", "D1", "E1"] for labels in first.values())
    assert len(set(first.values())) > 1, "every voter saw the same order: position would be a vote"
    assert orders(7) == first  # drawn from data: the same job replays the same orders
    assert orders(8) != first


def test_a_voters_order_changes_with_the_answer_set_version() -> None:
    job = Job(4, seed=3)
    first_answers(job, "ABCD")
    seen = {job.c.order_for("A", version) for version in range(job.c.version, job.c.version + 6)}
    assert len(seen) > 1


def test_first_shown_label_is_not_always_the_earliest_answer() -> None:
    """A voter that takes whatever is shown first no longer hands the win to the earliest answer."""
    earliest_first = 0
    for seed in range(30):
        job = Job(3, seed=seed, present=False)
        first_answers(job, "ABC")
        firsts = {letter: job.started(letter).labels[0] for letter in "AB"}
        firsts["C"] = job.c.order_for("C", job.c.version)[0]
        earliest_first += all(label == "A1" for label in firsts.values())
    assert earliest_first < 10  # with a fixed order it would be all 30


# Versions and vote invalidation ------------------------------------------------------------------
def test_new_answer_bumps_version_and_clears_every_vote() -> None:
    job = Job(3)
    first_answers(job, "ABC")
    job.vote("A", "B1")
    job.vote("B", "B1")
    version = job.c.version
    job.answer("C")
    assert job.c.version == version + 1
    assert all(agent.vote is None for agent in job.c.agents.values())
    assert {job.started(x).version for x in "AB"} == {job.c.version}  # voters are asked again


def test_vote_from_older_version_is_reasked_not_failed() -> None:
    job = Job(2, max_failed_turns=1)  # one failed turn would fail the agent
    job.answer("A")  # B's first-answer turn keeps running, now stale
    actions = job.vote("B", "A1")
    assert job.c.agents["B"].vote is None
    assert job.started("B").version == job.c.version
    assert job.c.agents["B"].failed_turns == 0 and job.c.agents["B"].active
    assert ends(actions) is None
    job.vote("B", "A1")
    assert job.c.agents["B"].vote is not None


@pytest.mark.parametrize("label", ["A1", "Z9"])
def test_vote_for_non_current_label_is_a_failed_turn_with_note(label: str) -> None:
    job = Job(2)
    first_answers(job, "AB")
    job.answer("A")  # A2 replaces A1
    job.vote("B", label)
    assert job.c.agents["B"].vote is None
    assert job.c.agents["B"].failed_turns == 1
    restart = job.started("B")
    assert label in restart.note and "B1" in restart.note and "A2" in restart.note
    assert sorted(restart.labels) == ["A2", "B1"]


# Stale turns ------------------------------------------------------------------------------------
def test_stale_thinking_turn_is_cancelled_then_restarted() -> None:
    job = Job(2)
    first_answers(job, "AB")
    old = job.turns["B"]
    actions = job.answer("A")
    kinds = [(type(a), a.letter) for a in actions if isinstance(a, (CancelTurn, StartTurn))]
    assert kinds.index((CancelTurn, "B")) < kinds.index((StartTurn, "B"))
    assert CancelTurn("B", old) in actions
    assert job.started("B").turn_id != old and job.started("B").version == job.c.version


def test_stale_turn_that_did_work_is_not_cancelled() -> None:
    job = Job(2)
    first_answers(job, "AB")
    job.work("B")
    old = job.turns["B"]
    actions = job.answer("A")
    assert not any(a.letter == "B" for a in actions if isinstance(a, (CancelTurn, StartTurn)))
    assert job.turns["B"] == old
    job.answer("B")  # its new_answer is still accepted
    assert job.c.latest["B"].label == "B2"


def test_turn_producing_first_answer_is_not_cancelled() -> None:
    job = Job(2)
    old = job.turns["B"]
    actions = job.answer("A")
    assert not any(isinstance(a, CancelTurn) for a in actions)
    assert job.turns["B"] == old
    job.answer("B")
    assert job.c.latest["B"].label == "B1"


def test_late_events_from_a_cancelled_turn_are_ignored() -> None:
    job = Job(2)
    first_answers(job, "AB")
    old = job.turns["B"]
    job.answer("A")
    assert job.turns["B"] != old
    answers, version = len(job.c.answers), job.c.version
    for event in (
        WorkStarted("B", old),
        AnswerPosted("B", old, "late"),
        VoteCast("B", old, "A2"),
        NoDecision("B", old, "late"),
        TurnFailed("B", old, "late", fatal=True),
    ):
        assert job.c.apply(event) == []
    assert (len(job.c.answers), job.c.version) == (answers, version)
    agent = job.c.agents["B"]
    assert agent.active and agent.failed_turns == 0 and not agent.turn.did_work


# Answer cap -------------------------------------------------------------------------------------
def test_agent_at_cap_is_offered_only_vote() -> None:
    job = Job(2, max_answers=1)
    assert job.started("B").can_answer
    job.answer("A")
    assert job.started("A").can_answer is False
    job.answer("A")  # refused
    assert [a.label for a in job.c.answers] == ["A1"]
    assert job.c.agents["A"].failed_turns == 1
    assert "maximum" in job.started("A").note and job.started("A").can_answer is False


# Consensus and winner ---------------------------------------------------------------------------
def test_all_voted_consensus() -> None:
    job = Job(3, present=False)
    first_answers(job, "ABC")
    assert ends(job.vote("A", "B1")) is None
    assert ends(job.vote("B", "B1")) is None
    finish = ends(job.vote("C", "A1"))
    assert isinstance(finish, Finish)
    assert finish.outcome.consensus and finish.outcome.winner == "B1" and not finish.outcome.tie
    assert finish.outcome.tally == {"A1": 1, "B1": 2, "C1": 0}
    assert job.c.phase == "done"


def test_majority_stops_early_and_cancels_turns_in_flight() -> None:
    job = Job(3, consensus="majority")
    first_answers(job, "ABC")
    assert ends(job.vote("A", "C1")) is None
    c_turn = job.turns["C"]
    actions = job.vote("B", "C1")
    assert CancelTurn("C", c_turn) in actions
    present = ends(actions)
    assert isinstance(present, Present) and present.letter == "C"
    assert present.outcome.consensus and present.outcome.winner == "C1"


def test_majority_needs_more_than_half() -> None:
    job = Job(4, consensus="majority")
    first_answers(job, "ABCD")
    job.vote("A", "B1")
    assert ends(job.vote("B", "B1")) is None  # 2 of 4 is half, not more
    assert ends(job.vote("C", "B1")).outcome.winner == "B1"


def test_majority_with_every_vote_split_has_no_consensus() -> None:
    job = Job(3, consensus="majority", present=False)
    first_answers(job, "ABC")
    job.vote("A", "A1")
    job.vote("B", "B1")
    outcome = ends(job.vote("C", "C1")).outcome
    assert outcome.consensus is False and outcome.tie and outcome.winner == "A1" and outcome.all_voted


@pytest.mark.parametrize("order", ["AB", "BA"])
def test_tie_breaks_to_the_earliest_posted_answer_without_consensus(order: str) -> None:
    job = Job(2, present=False)
    first_answers(job, order)
    job.vote("A", "B1")
    outcome = ends(job.vote("B", "A1")).outcome
    assert outcome.tie and not outcome.consensus and outcome.all_voted
    assert outcome.winner == f"{order[0]}1" and (outcome.votes, outcome.voters) == (1, 2)


def test_split_of_self_votes_is_not_consensus() -> None:
    job = Job(3, present=False)
    first_answers(job, "ABC")
    for letter in "ABC":
        job.vote(letter, f"{letter}1")
    outcome = ends(job.last).outcome
    assert outcome.all_voted and not outcome.consensus and outcome.tie
    assert (outcome.votes, outcome.voters) == (1, 3) and "no answer has a majority" in outcome.reason


def test_consensus_is_a_strict_majority_of_the_votes_cast() -> None:
    job = Job(3, present=False)
    first_answers(job, "ABC")
    job.vote("A", "C1")
    job.vote("B", "C1")
    outcome = ends(job.vote("C", "A1")).outcome
    assert outcome.consensus and outcome.all_voted and (outcome.votes, outcome.voters) == (2, 3)


# Equivalent answers ------------------------------------------------------------------------------
def test_votes_for_equivalent_answers_count_for_their_group() -> None:
    job = Job(4, present=False)
    job.answer("A", "Paris.", key="paris")
    job.answer("B", "London", key="london")
    job.answer("C", "The capital is Paris", key="paris")
    job.answer("D", "Rome", key="rome")
    assert job.c.agreeing() == (("A1", "C1"),)
    job.vote("A", "A1")
    job.vote("B", "B1")
    job.vote("C", "C1")
    outcome = ends(job.vote("D", "B1")).outcome
    # 2 for Paris (A1 + C1) against 2 for London: a tie of groups, broken by the group posted first
    assert outcome.tie and not outcome.consensus and outcome.winner == "A1"
    assert outcome.agree == (("A1", "C1"),) and (outcome.votes, outcome.voters) == (2, 4)


def test_a_group_with_a_majority_is_consensus_though_no_single_answer_has_one() -> None:
    job = Job(3, present=False)
    job.answer("A", "42", key="#42")
    job.answer("B", "It is 42.", key="#42")
    job.answer("C", "41", key="#41")
    job.vote("A", "A1")
    job.vote("B", "B1")
    outcome = ends(job.vote("C", "C1")).outcome
    assert outcome.consensus and outcome.winner == "A1" and (outcome.votes, outcome.voters) == (2, 3)


def test_within_a_group_the_answer_with_most_votes_wins() -> None:
    job = Job(3, present=False)
    job.answer("A", "42", key="#42")
    job.answer("B", "It is 42.", key="#42")
    job.answer("C", "41", key="#41")
    job.vote("A", "B1")
    job.vote("B", "B1")
    outcome = ends(job.vote("C", "C1")).outcome
    assert outcome.winner == "B1" and outcome.consensus


def test_majority_rule_counts_groups() -> None:
    job = Job(4, consensus="majority", present=False)
    job.answer("A", "x", key="same")
    job.answer("B", "y", key="same")
    job.answer("C", "z", key="other")
    job.answer("D", "w", key="other2")
    job.vote("A", "A1")
    job.vote("B", "B1")
    assert ends(job.last) is None  # 2 of 4 active agents is not more than half
    outcome = ends(job.vote("C", "A1")).outcome
    assert outcome.consensus and outcome.winner == "A1" and not outcome.all_voted


# Deadline fallback ------------------------------------------------------------------------------
def test_deadline_picks_most_current_votes() -> None:
    job = Job(3)
    first_answers(job, "ABC")
    job.vote("C", "B1")
    actions = job.feed(Deadline("job timeout"))
    outcome = ends(actions).outcome
    assert outcome.winner == "B1" and outcome.consensus is False
    assert "job timeout" in outcome.reason and "current votes" in outcome.reason
    assert {a.letter for a in actions if isinstance(a, CancelTurn)} == {"A", "B"}


def test_deadline_picks_most_votes_ever() -> None:
    job = Job(3)
    first_answers(job, "ABC")
    job.vote("C", "B1")
    job.answer("A")  # clears C's vote; A2 is now the latest answer
    outcome = ends(job.feed(Deadline("job timeout"))).outcome
    assert outcome.winner == "B1" and outcome.consensus is False and "ever" in outcome.reason


def test_deadline_picks_latest_answer() -> None:
    job = Job(3)
    first_answers(job, "AB")
    outcome = ends(job.feed(Deadline("budget"))).outcome
    assert outcome.winner == "B1" and outcome.consensus is False and "latest" in outcome.reason
    assert outcome.fallback and not outcome.all_voted


def test_deadline_without_votes_picks_the_answer_most_agents_agree_on() -> None:
    job = Job(3)
    job.answer("A", "Paris", key="paris")
    job.answer("B", "London", key="london")
    job.answer("C", "It is Paris.", key="paris")
    outcome = ends(job.feed(Deadline("job timeout"))).outcome
    assert outcome.winner == "A1" and outcome.fallback and not outcome.consensus
    assert "agree" in outcome.reason and outcome.agree == (("A1", "C1"),)


def test_deadline_with_a_majority_of_the_votes_so_far_is_still_no_consensus() -> None:
    job = Job(3)
    first_answers(job, "ABC")
    job.vote("A", "B1")
    job.vote("B", "B1")  # C has not voted: the vote never finished
    outcome = ends(job.feed(Deadline("job timeout"))).outcome
    assert outcome.winner == "B1" and outcome.fallback and not outcome.consensus
    assert (outcome.votes, outcome.voters) == (2, 2) and not outcome.all_voted


def test_deadline_during_the_presentation_returns_the_winner_as_it_stands() -> None:
    job, actions = voted_job()
    assert isinstance(ends(actions), Present)
    finish = ends(job.feed(Deadline("the job reached its timeout")))
    assert isinstance(finish, Finish) and finish.final_text is None and job.c.phase == "done"
    assert finish.outcome.consensus and not finish.outcome.fallback  # the vote itself had finished
    assert "not presented" in finish.outcome.reason and "timeout" in finish.outcome.reason
    assert job.c.apply(Presented("too late")) == []


def test_deadline_with_no_answers_fails() -> None:
    job = Job(2)
    finish = ends(job.feed(Deadline("job timeout")))
    assert isinstance(finish, Finish) and finish.outcome.failed and finish.outcome.winner is None


# Failures ---------------------------------------------------------------------------------------
def test_fatal_failure_marks_agent_failed_and_job_goes_on() -> None:
    job = Job(3, present=False)
    first_answers(job, "ABC")
    actions = job.fail("A", "provider down", fatal=True)
    assert not job.c.agents["A"].active and job.c.agents["A"].vote is None
    assert ends(actions) is None and not any(isinstance(a, StartTurn) for a in actions)
    job.vote("B", "C1")
    outcome = ends(job.vote("C", "C1")).outcome  # A's vote is not needed
    assert outcome.consensus and outcome.tally == {"A1": 0, "B1": 0, "C1": 2}


def test_all_but_one_failed_ends_without_consensus() -> None:
    job = Job(3, present=False)
    first_answers(job, "ABC")
    job.vote("C", "B1")
    job.fail("A", fatal=True)
    outcome = ends(job.fail("B", fatal=True)).outcome
    assert outcome.consensus is False and "all but one" in outcome.reason and outcome.winner == "B1"


def test_lone_survivor_answer_ends_without_consensus() -> None:
    """Agents fail before any answer; the survivor's own vote must not count as the team's consensus."""
    job = Job(3, present=False)
    job.fail("A", fatal=True)
    job.fail("B", fatal=True)
    outcome = ends(job.answer("C")).outcome  # the survivor's answer ends the job: no vote is asked
    assert outcome.winner == "C1" and outcome.consensus is False and "all but one" in outcome.reason


def test_every_agent_failed_carries_every_error() -> None:
    job = Job(2)
    job.fail("A", "no key", fatal=True)
    finish = ends(job.fail("B", "quota", fatal=True))
    assert isinstance(finish, Finish)
    assert finish.outcome.failed and finish.outcome.winner is None
    assert finish.outcome.errors == {"A": "no key", "B": "quota"}


def test_non_fatal_failures_up_to_the_limit_then_agent_failed() -> None:
    job = Job(2, max_failed_turns=3)
    job.fail("A", "flaky 1")
    assert job.started("A").note == "flaky 1"
    job.fail("A", "flaky 2")
    assert job.c.agents["A"].active
    actions = job.fail("A", "flaky 3")
    assert not job.c.agents["A"].active and job.c.agents["A"].error == "flaky 3"
    assert not any(isinstance(a, StartTurn) for a in actions)


def test_success_resets_the_failed_turn_count() -> None:
    job = Job(2, max_failed_turns=2)
    job.fail("A")
    job.answer("A")
    job.fail("A")
    assert job.c.agents["A"].active


# Presentation -----------------------------------------------------------------------------------
def voted_job(**options: object) -> tuple[Job, list]:
    job = Job(2, **options)
    first_answers(job, "AB")
    job.vote("A", "B1")
    return job, job.vote("B", "B1")


def test_present_then_presented_finishes_with_text() -> None:
    job, actions = voted_job()
    present = ends(actions)
    assert isinstance(present, Present) and present.letter == "B" and job.c.phase == "presenting"
    finish = ends(job.feed(Presented("the final answer")))
    assert isinstance(finish, Finish) and finish.final_text == "the final answer"
    assert finish.outcome.winner == "B1" and job.c.phase == "done"


def test_presentation_failed_finishes_with_the_answer_as_is() -> None:
    job, _ = voted_job()
    finish = ends(job.feed(PresentationFailed("rate limited")))
    assert isinstance(finish, Finish) and finish.final_text is None
    assert "not presented" in finish.outcome.reason and "rate limited" in finish.outcome.reason


def test_reuse_finishes_at_once() -> None:
    job, actions = voted_job(present=False)
    assert not any(isinstance(a, Present) for a in actions)
    finish = ends(actions)
    assert isinstance(finish, Finish) and finish.final_text is None and job.c.phase == "done"


# Corrective retry -------------------------------------------------------------------------------
def test_no_decision_gets_one_corrective_turn() -> None:
    job = Job(2)
    job.no_decision("A", "I think the answer is 4")
    assert job.started("A").corrective is True
    assert job.c.agents["A"].failed_turns == 0


def test_no_decision_on_corrective_turn_with_text_is_an_answer() -> None:
    job = Job(2)
    job.no_decision("A", "thinking")
    job.no_decision("A", "the answer is 4")
    assert job.c.latest["A"].content == "the answer is 4"


def test_no_decision_on_corrective_turn_without_text_fails_the_turn() -> None:
    job = Job(2)
    job.no_decision("A")
    job.no_decision("A", "   ")
    assert not job.c.answers and job.c.agents["A"].failed_turns == 1
    assert job.started("A").corrective is False


# Done -------------------------------------------------------------------------------------------
def test_no_events_accepted_after_done() -> None:
    job, _ = voted_job(present=False)
    assert job.c.phase == "done"
    outcome = job.c.outcome
    turn = job.turns["A"]
    late = [AnswerPosted("A", turn, "late"), VoteCast("A", turn, "A1"), TurnFailed("A", turn, "x", True)]
    for event in [Start(), Deadline("late"), Presented("late"), PresentationFailed("late"), *late]:
        assert job.c.apply(event) == []
    assert job.c.outcome is outcome and job.c.phase == "done" and len(job.c.answers) == 2
