"""The pure answer reader (coordination/answers.py): keys that make equivalent answers agree, the refusal
of non-answers, the presentation guard and the benchmark's check."""

from __future__ import annotations

import pytest

from conclave.coordination.answers import (
    answer_key,
    final_answer,
    matches,
    presentation_problem,
    refusal,
    words,
)

CAPITAL = "What is the capital of France?"
TIMES = "What is 6 times 7?"


def test_words_casefold_drop_punctuation_and_normalise_numbers() -> None:
    assert words("The Answer: 1,000.50 apples, SEVEN pears!") == [
        "the",
        "answer",
        "1000.5",
        "apples",
        "7",
        "pears",
    ]
    assert words("3.0 and -0 and 12") == ["3", "and", "0", "and", "12"]


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("Paris", "The capital of France is Paris."),
        ("Paris.", "Paris is the capital of France"),
        ("PARIS!", "paris"),
        ("It is Paris, France.", "Paris"),
    ],
)
def test_equivalent_answers_share_a_key(one: str, other: str) -> None:
    assert answer_key(one, CAPITAL) == answer_key(other, CAPITAL) == "paris"


@pytest.mark.parametrize(("one", "other"), [("Paris", "London"), ("Paris", "Not Paris"), ("Paris", "")])
def test_different_answers_have_different_keys(one: str, other: str) -> None:
    assert answer_key(one, CAPITAL) != answer_key(other, CAPITAL)


@pytest.mark.parametrize(
    "text",
    ["42", "6 times 7 is 42.", "The answer is forty-two? No: 42", "6 * 7 = 42", "42.0", "It's 42, clearly."],
)
def test_numbers_key_on_the_last_number_the_task_does_not_have(text: str) -> None:
    assert answer_key(text, TIMES) == "#42"


def test_a_long_reply_keys_on_its_final_line_or_answer_line() -> None:
    reasoning = " ".join(["We multiply the two numbers step by step and check the work."] * 8)
    assert answer_key(f"{reasoning}\nSo the result is 42.", TIMES) == "#42"
    assert answer_key(f"Answer: Paris\n{reasoning}", CAPITAL) == "paris"
    assert final_answer(f"{reasoning}\nSo the result is 42.", TIMES) == "#42"
    essay = " ".join(
        f"point {word} matters"
        for word in ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"] * 4
    )
    assert final_answer(essay, "Discuss.") is None  # a long answer with no final answer to hold on to


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("   \n", "empty"),
        ("{", "JSON"),
        ('{"action": "new_answer", "content": "Paris"}', "JSON"),
        ('{"action": ', "JSON"),
        ('{"choice": "B1"}', "JSON"),
        ("The capital of France.", "restates"),
        ("What is the capital of France?", "restates"),
        ("This is a question about France. It asks for the capital of France.", "talks about the task"),
        ("Your answer is incomplete. Please provide your current edit.", "talks about the task"),
        ("This is a task. The answer must be the capital of France.", "talks about the task"),
    ],
)
def test_non_answers_are_refused_saying_why(text: str, why: str) -> None:
    found = refusal(text, CAPITAL)
    assert found is not None and why in found


@pytest.mark.parametrize(
    "text",
    [
        "Paris.",
        "The question asks for the capital of France, which is Paris.",
        '{"capital": "Paris"}',  # JSON can be an answer
        "No.",
        "42",
        "France's capital city is Paris, on the Seine.",
    ],
)
def test_answers_are_not_refused(text: str) -> None:
    assert refusal(text, CAPITAL) is None


def test_a_quoted_short_word_is_an_answer() -> None:
    task = "What is the last letter of the word 'apple'?"
    assert refusal("The last letter of the word 'apple' is 'A'.", task) is None
    assert answer_key("The last letter of the word 'apple' is 'e'.", task) == answer_key("e", task) == "e"
    assert answer_key("It is 'a'.", task) == "a" != answer_key("It is 'e'.", task)
    assert refusal("A day is a day, and a day is a day.", "How many hours are in a day?") is not None


def test_a_yes_or_no_answer_is_not_a_restatement() -> None:
    assert refusal("Yes, 7 is a prime number.", "Is 7 a prime number? Answer yes or no.") is None


def test_the_presentation_guard() -> None:
    assert (
        presentation_problem("Paris is the capital of France.", "The capital of France is Paris.", CAPITAL)
        is None
    )
    changed = presentation_problem("The capital of France is Lyon.", "Paris.", CAPITAL)
    assert changed is not None and "'paris'" in changed and "'lyon'" in changed
    assert "no answer" in (presentation_problem("{", "Paris.", CAPITAL) or "")
    long_winner = " ".join(
        f"idea {n} helps" for n in ["red", "green", "blue", "amber", "violet", "teal", "pink", "grey"] * 4
    )
    assert (
        presentation_problem(
            "A shorter rewrite of the ideas, with the best of both.", long_winner, "Discuss."
        )
        is None
    )


@pytest.mark.parametrize(
    ("answer", "expected", "task", "ok"),
    [
        ("The capital of France is Paris.", "Paris", CAPITAL, True),
        ("London.", "Paris", CAPITAL, False),
        ("7 times 8 is 56.", "56", "What is 7 times 8?", True),
        ("7 times 8 is 54.", "56", "What is 7 times 8?", False),
        ("A spider has eight legs.", "8", "How many legs does a spider have?", True),
        ("Water freezes at 0 degrees Celsius.", "0", "At how many degrees Celsius does water freeze?", True),
        (
            "2 + 2 = 4, but in reality it equals 5.",
            "4",
            "What is 2 plus 2?",
            False,
        ),  # the final number counts
        ("The formula is H2O.", "H2O", "What is the chemical formula of water?", True),
        ("The closest star is the Sun.", "the Sun", "What is the closest star to Earth?", True),
        ("Sunflower", "sunflower", "What word do you get by putting 'sun' and 'flower' together?", True),
        ("", "Paris", CAPITAL, False),
    ],
)
def test_the_benchmark_check(answer: str, expected: str, task: str, ok: bool) -> None:
    assert matches(answer, expected, task) is ok
