"""The verification rule and the budget stop, rule by rule (server/coordination/protocol.py, tally.py)."""

from __future__ import annotations

from conclave.coordination.protocol_events import (
    CancelTurn,
    Deadline,
    Finish,
    Present,
    Presented,
    StartTurn,
    Steer,
    Stop,
    Verified,
    Verify,
)
from tests.test_protocol import Job, ends, first_answers


def verified(job: Job, **results: bool) -> list:
    """Feed each label's result (A1=True: passed) and return the actions of the last."""
    actions: list = []
    for label, passed in results.items():
        actions = job.feed(Verified(label, passed))
    return actions


def test_every_answer_is_sent_to_be_checked_once() -> None:
    job = Job(2, verify=True)
    assert [a for a in job.answer("A") if isinstance(a, Verify)] == [Verify("A1")]
    assert job.c.pending() == ("A1",)
    job.answer("B")  # B's first turn was under way: it goes on
    assert job.c.pending() == ("A1", "B1")
    assert verified(job, A1=True) == []  # B1 is still out
    assert verified(job, A1=False) == []  # a result counts once
    assert job.c.verdicts == {"A1": "passed", "B1": "pending"}


def test_no_verify_action_without_verification() -> None:
    job = Job(2)
    assert not [a for a in job.answer("A") if isinstance(a, Verify)] and job.c.pending() == ()


def test_no_turn_starts_while_a_current_answer_is_being_checked() -> None:
    """The agents wait for the results and then decide once: a result clears no vote, so no vote is paid
    for twice (bench/bench_checks.py counts the requests)."""
    job = Job(2, verify=True, present=False)
    assert not [a for a in job.answer("A") if isinstance(a, StartTurn)]  # A waits for its check
    assert not [a for a in job.answer("B") if isinstance(a, StartTurn)]
    assert all(agent.waiting is not None for agent in job.c.agents.values())
    assert verified(job, A1=True) == []  # B1 is still being checked: everyone still waits
    version = job.c.version
    released = [a for a in verified(job, B1=False) if isinstance(a, StartTurn)]
    assert {a.letter for a in released} == {"A", "B"} and all("answers changed" in a.note for a in released)
    assert job.c.version == version and all(a.version == version for a in released)  # no new round
    job.vote("A", "A1")
    assert job.c.agents["A"].vote is not None  # cast knowing every result: it counts as it is
    finish = ends(job.vote("B", "A1"))
    assert isinstance(finish, Finish) and finish.outcome.winner == "A1" and finish.outcome.consensus
    assert finish.outcome.verdict == "passed" and finish.outcome.pending == ()


def test_with_checks_the_agents_take_as_many_turns_as_without() -> None:
    """The same decisions with and without verify: the checks add no turn (they used to add a vote each);
    here they even save two, the turns a later answer would have cancelled and restarted."""
    counts = []
    for verify in (False, True):
        job = Job(3, verify=verify, present=False)
        turns = 3
        for letter in "ABC":
            turns += sum(isinstance(a, StartTurn) for a in job.answer(letter))
        if verify:
            turns += sum(isinstance(a, StartTurn) for a in verified(job, A1=True, B1=True, C1=False))
        for letter in "ABC":
            assert job.c.agents[letter].turn is not None
            actions = job.vote(letter, "A1")
            turns += sum(isinstance(a, StartTurn) for a in actions)
        assert ends(actions).outcome.winner == "A1"
        counts.append(turns)
    assert counts[1] <= counts[0]


def test_a_turn_asked_for_while_checks_run_waits_as_it_was_asked() -> None:
    """A stale vote, a corrective turn: held back while a check runs, then started with its note and kind."""
    job = Job(3, verify=True)
    job.answer("A")
    job.no_decision("B")  # B's first turn ends with no decision: its corrective turn waits for A1's check
    version = job.c.version
    assert job.c.agents["B"].waiting is not None and job.c.agents["B"].turn is None
    job.vote("C", "A1")  # C's turn began before A1: a stale vote, asked again once A1's check is in
    assert job.c.agents["C"].vote is None and job.c.agents["C"].waiting is not None
    started = {a.letter: a for a in verified(job, A1=True) if isinstance(a, StartTurn)}
    assert started["B"].corrective and not started["C"].corrective and "vote again" in started["C"].note
    assert set(started) == {"A", "B", "C"} and job.c.version == version


def test_a_note_while_checks_run_waits_with_them() -> None:
    job = Job(2, verify=True)
    job.answer("A")
    job.answer("B")
    assert [a for a in job.feed(Steer("use the metric system")) if isinstance(a, StartTurn)] == []
    started = [a for a in verified(job, A1=True, B1=True) if isinstance(a, StartTurn)]
    assert len(started) == 2 and all(a.notes == ("use the metric system",) for a in started)


def test_an_answer_that_passed_wins_over_one_that_failed_with_more_votes() -> None:
    job = Job(3, verify=True, present=False)
    first_answers(job, "ABC")
    verified(job, A1=True, B1=False, C1=False)
    job.vote("A", "A1")
    job.vote("B", "B1")
    outcome = ends(job.vote("C", "B1")).outcome
    assert outcome.winner == "A1" and outcome.by_verification and outcome.verdict == "passed"
    assert not outcome.consensus and (outcome.votes, outcome.voters) == (1, 3)  # honest: 1 of 3 chose it
    assert "verification rule chose A1" in outcome.reason and "over B1 (check failed)" in outcome.reason


def test_a_failed_answer_may_win_when_no_answer_that_passed_has_a_vote() -> None:
    job = Job(2, verify=True, present=False)
    first_answers(job, "AB")
    verified(job, A1=True, B1=False)
    job.vote("A", "B1")
    outcome = ends(job.vote("B", "B1")).outcome
    assert outcome.winner == "B1" and outcome.verdict == "failed" and not outcome.by_verification
    assert outcome.consensus and not outcome.none_passed


def test_when_no_answer_passed_the_outcome_says_so() -> None:
    job = Job(2, verify=True, present=False)
    first_answers(job, "AB")
    verified(job, A1=False, B1=False)
    job.vote("A", "B1")
    outcome = ends(job.vote("B", "B1")).outcome
    assert (
        outcome.winner == "B1" and outcome.none_passed and "no answer passed verification" in outcome.reason
    )


def test_each_member_of_a_group_counts_by_its_own_verdict() -> None:
    """A1 and B1 give the same final answer, but B1 failed its check: B1's votes do not carry A1."""
    job = Job(3, verify=True, present=False)
    job.answer("A", "Paris, with tests", key="paris")
    job.answer("B", "Paris, broken", key="paris")
    job.answer("C", "Rome", key="rome")
    verified(job, A1=True, B1=False, C1=True)
    job.vote("A", "B1")
    job.vote("B", "B1")
    outcome = ends(job.vote("C", "C1")).outcome
    assert outcome.winner == "C1" and outcome.by_verification and outcome.votes == 1


def test_a_deadline_while_checks_run_ends_the_job_and_names_them() -> None:
    job = Job(2, verify=True)
    first_answers(job, "AB")
    verified(job, A1=True)
    outcome = ends(job.feed(Deadline("the job reached its timeout"))).outcome
    assert outcome.fallback and not outcome.consensus and outcome.pending == ("B1",)
    assert "still being checked: B1" in outcome.reason
    assert outcome.winner == "A1" and "the latest answer that passed verification" in outcome.reason


def test_a_stop_ends_without_a_presentation_and_keeps_the_best_supported() -> None:
    job = Job(3)
    first_answers(job, "ABC")
    job.vote("A", "B1")
    actions = job.feed(Stop("budget reached"))
    finish = ends(actions)
    assert isinstance(finish, Finish) and not any(isinstance(a, Present) for a in actions)
    assert finish.final_text is None and finish.outcome.winner == "B1" and finish.outcome.fallback
    assert finish.outcome.reason.startswith("budget reached; the answer with the most current votes")
    assert {a.letter for a in actions if isinstance(a, CancelTurn)} == {"B", "C"}  # turns in flight cancelled
    assert job.c.phase == "done" and job.feed(Presented("late")) == []


def test_a_stop_during_the_presentation_returns_the_winning_answer_as_it_stands() -> None:
    job = Job(2)
    first_answers(job, "AB")
    job.vote("A", "A1")
    assert isinstance(ends(job.vote("B", "A1")), Present)
    finish = ends(job.feed(Stop("budget reached")))
    assert (
        finish.final_text is None and finish.outcome.consensus and "budget reached" in finish.outcome.reason
    )


def test_the_leading_answer_is_a_query() -> None:
    job = Job(3, verify=True)
    assert job.c.leading() is None
    first_answers(job, "ABC")
    assert job.c.leading().winner == "C1"  # no votes: the latest
    verified(job, A1=True)
    assert job.c.leading().winner == "A1"  # no votes: the latest that passed
    verified(job, B1=True, C1=True)
    job.vote("B", "B1")
    job.vote("C", "B1")
    lead = job.c.leading()
    assert lead.winner == "B1" and lead.votes == 2 and lead.verdict == "passed"
    assert job.c.phase == "coordinating" and job.c.outcome is None


def test_an_answer_that_ends_the_job_at_once_is_not_left_pending() -> None:
    """The other agents failed before any answer: the lone survivor's answer ends the job, unchecked,
    and the result does not claim a check that was never asked for."""
    job = Job(2, verify=True, max_failed_turns=1)
    job.fail("B", fatal=True)
    actions = job.answer("A")
    assert not any(isinstance(a, Verify) for a in actions) and ends(actions).outcome.pending == ()
    assert "still being checked" not in ends(actions).outcome.reason and job.c.verdicts == {}
