"""The split turn's pure parts: which current answers agree (one score per group, no vote to score when
all agree) and the scoring voter's pick. The turns themselves run on the real model in tests/test_local.py."""

from __future__ import annotations

from conclave.coordination.reports import ShownAnswer
from conclave.coordination.split_turns import agreeing_groups, pick


def shown(label: str, content: str, *agrees: str) -> ShownAnswer:
    return ShownAnswer(
        label=label, letter=label[0], revision=int(label[1:]), content=content, agrees_with=agrees
    )


def test_answers_with_the_same_final_answer_form_one_group_in_the_order_shown() -> None:
    answers = [shown("B1", "Paris.", "A1"), shown("C1", "Lyon."), shown("A1", "It is Paris.", "B1")]
    assert [[a.label for a in group] for group in agreeing_groups(answers)] == [["B1", "A1"], ["C1"]]


def test_equal_texts_share_a_group_even_without_an_agreement_reading() -> None:
    answers = [shown("A1", "a long essay"), shown("B1", "a long essay"), shown("C1", "another essay")]
    assert [[a.label for a in group] for group in agreeing_groups(answers)] == [["A1", "B1"], ["C1"]]


def test_all_agreeing_answers_are_one_group() -> None:
    answers = [shown("A1", "4", "B1", "C1"), shown("B1", "four", "A1", "C1"), shown("C1", "4.", "A1", "B1")]
    assert len(agreeing_groups(answers)) == 1


def test_pick_takes_the_highest_score_and_breaks_ties_to_the_first_shown() -> None:
    answers = [shown("C1", "x"), shown("A1", "y"), shown("B1", "z")]
    assert pick(answers, [-2.0, -1.0, -1.0])[0] == "A1"
    label, reason = pick(answers, [-1.0, -3.0, -2.0])
    assert label == "C1" and "C1 -1.00" in reason and "log-probability" in reason
