"""What an answer says, read without a model: its equivalence key, and whether it answers at all.

Pure functions, no state: the orchestrator hands the protocol a reading of every answer (the protocol
groups answers by key and refuses non-answers), and bench/quality.py checks answers with the same
words.

    answer_key("The capital of France is Paris.", "What is the capital of France?")  -> "paris"
    answer_key("6 times 7 is 42", "What is 6 times 7?")                               -> "#42"
    refusal("This is a question about France.", "What is the capital of France?")    -> "the reply ..."
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import replace

from conclave.coordination.protocol_events import (
    AnswerPosted,
    NoDecision,
    ProtocolEvent,
    StartTurn,
    TurnFailed,
)

# Kept even when the task has them: a yes/no answer repeats the task's own words.
KEEP = frozenset({"yes", "no", "true", "false", "not", "none", "never", "always"})
STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "of",
        "in",
        "on",
        "at",
        "to",
        "for",
        "from",
        "by",
        "with",
        "as",
        "and",
        "or",
        "but",
        "so",
        "it",
        "its",
        "this",
        "that",
        "these",
        "those",
        "there",
        "here",
        "which",
        "who",
        "whom",
        "whose",
        "what",
        "when",
        "where",
        "why",
        "how",
        "than",
        "then",
        "also",
        "very",
        "just",
        "called",
        "known",
        "i",
        "we",
        "you",
        "he",
        "she",
        "they",
        "my",
        "our",
        "your",
        "his",
        "her",
        "their",
        "me",
        "us",
        "them",
        "do",
        "does",
        "did",
        "can",
        "could",
        "would",
        "will",
        "shall",
        "may",
        "might",
        "there's",
        "it's",
        "that's",
    ]
)
# Words about the task rather than in answer to it: a reply made only of these (and the task's own words)
# talks about the question instead of answering it.
META = frozenset(
    [
        "question",
        "questions",
        "task",
        "tasks",
        "ask",
        "asks",
        "asking",
        "asked",
        "answer",
        "answers",
        "reply",
        "replies",
        "response",
        "respond",
        "prompt",
        "request",
        "requests",
        "provide",
        "please",
        "incomplete",
        "complete",
        "current",
        "edit",
        "edits",
        "must",
        "need",
        "needs",
        "should",
        "want",
        "wants",
        "user",
        "assistant",
        "agent",
        "write",
        "writing",
        "given",
        "following",
        "about",
        "regarding",
        "topic",
        "simple",
        "simply",
        "short",
        "sentence",
        "one",
        "two",
        "correct",
    ]
)
META_OPENINGS = re.compile(
    r"^\s*(this|that|it|here)\s+(is|was|seems)\s+(a|an|the)\s+(question|task|query|request)\b"
    r"|^\s*(the|this|your)\s+(question|task|answer|prompt)\s+(is|asks|wants|requires|must|should)\b",
    re.IGNORECASE,
)
NUMBER_WORDS = {
    word: str(value)
    for value, word in enumerate(
        [
            "zero",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
            "twenty",
        ]
    )
} | {
    "thirty": "30",
    "forty": "40",
    "fifty": "50",
    "sixty": "60",
    "seventy": "70",
    "eighty": "80",
    "ninety": "90",
    "hundred": "100",
    "thousand": "1000",
}
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
_TOKEN = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?|[^\W_]+")
# typographic quotes are quotes too
_QUOTED = re.compile(r"(?<!\w)['\"‘“]([^'\"‘’“”\n]{1,40})['\"’”](?!\w)")  # noqa: RUF001
_FINAL_LINE = re.compile(r"^\s*(?:\**\s*)?(?:final\s+answer|answer)\s*\**\s*[:=-]\s*(.+)$", re.IGNORECASE)
SHORT_LINE_WORDS = 15  # a last line this short holds the final answer of a longer reply
LONG_REPLY_WORDS = 60  # a reply longer than this is read for its final line


REFUSED = "answer refused: "  # a failed turn's error when the driver refused its answer


def words(text: str) -> list[str]:
    """Casefolded words and normalised numbers ("1,000.0" -> "1000", "seven" -> "7"), punctuation dropped."""
    text = unicodedata.normalize("NFKC", text).casefold()
    found = []
    for token in _TOKEN.findall(text):
        token = NUMBER_WORDS.get(token, token)
        if _NUMBER.fullmatch(token):
            token = _number(token)
        found.append(token)
    return found


def _number(token: str) -> str:
    value = token.replace(",", "")
    if "." in value:
        value = value.rstrip("0").rstrip(".")
    return value if value not in ("-0", "") else "0"


def _quoted(text: str) -> set[str]:
    """Words said in quotes ("is 'a'"): an answer even when they are short words like "a"."""
    return {word for span in _QUOTED.findall(text) for word in words(span)}


def is_number(word: str) -> bool:
    return bool(_NUMBER.fullmatch(word))


def final_part(text: str) -> str:
    """The part of a reply that holds its final answer: an `Answer:` line, else the short last line of
    a long reply, else all of it."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if match := _FINAL_LINE.match(line):
            return match.group(1)
    long = len(words(text)) > LONG_REPLY_WORDS
    if long and len(lines) > 1 and len(words(lines[-1])) <= SHORT_LINE_WORDS:
        return lines[-1]
    return text


def answer_key(text: str, task: str = "") -> str:
    """The normalised final answer: answers with equal keys agree.

    The last number that is not in the task, else the sorted content words not in the task, else the
    last number, else every word. Words the task already has are dropped, so "Paris" and "The capital
    of France is Paris" agree on the task "What is the capital of France?".
    """
    part = final_part(text)
    tokens, quoted = words(part), _quoted(part)
    given = set(words(task)) - KEEP
    numbers = [token for token in tokens if is_number(token)]
    fresh = [number for number in numbers if number not in given]
    if fresh:
        return "#" + fresh[-1]
    kept = {t for t in tokens if (t not in STOP or t in quoted) and t not in given}
    content = sorted(t for t in kept if not is_number(t))
    if content:
        return " ".join(content)
    if numbers:
        return "#" + numbers[-1]
    return " ".join(tokens)


def final_answer(text: str, task: str = "") -> str | None:
    """The key of `text` when it has a recognisable final answer (a number, a short reply, an
    `Answer:` line, the short last line of a long reply); None for a long answer without one."""
    key = answer_key(text, task)
    return key if key.startswith("#") or len(words(final_part(text))) <= LONG_REPLY_WORDS else None


def presentation_problem(presented: str, winning: str, task: str = "") -> str | None:
    """Why a presentation may not replace the winning answer (it is no answer, or it changes the
    winner's final answer); None when it may. A long winner without a final answer may be rewritten."""
    why = refusal(presented, task)
    if why is not None:
        return f"the presentation is no answer: {why}"
    want, got = final_answer(winning, task), answer_key(presented, task)
    if want is not None and got != want:
        return f"the presentation changed the final answer from {want!r} to {got!r}"
    return None


def refusal(text: str, task: str = "") -> str | None:
    """Why `text` is not an answer to `task` (empty, a JSON fragment, the task restated, talk about the
    task), or None when it is one. The message is shown to the agent in its corrective turn."""
    stripped = text.strip()
    if not stripped:
        return "the answer is empty; write the answer to the task"
    if stripped[0] in "{[":
        try:
            data = json.loads(stripped)
        except ValueError:
            return "the answer is a fragment of JSON, not an answer; write the answer itself in plain text"
        if isinstance(data, dict) and {"action", "choice"} & set(data):  # our own decision envelopes
            return "the answer is a JSON decision, not an answer; write the answer itself in plain text"
    tokens = words(stripped)
    if any(is_number(token) or token in KEEP for token in tokens):
        return None
    given, quoted = set(words(task)), _quoted(stripped)
    own = {t for t in tokens if (t not in STOP or t in quoted) and t not in given}
    if given and not own:
        return "the answer only restates the task; give the answer itself"
    if not own - META and (META_OPENINGS.search(stripped) or own & META):
        return "the reply talks about the task instead of answering it; give the answer itself"
    return None


def matches(answer: str, expected: str, task: str = "") -> bool:
    """Whether `answer` gives `expected` (bench/quality.py's check): for a number, the answer's key is
    that number (as the team's grouping reads it); else the expected words, in order, among its words."""
    want = words(expected)
    if len(want) == 1 and is_number(want[0]):
        return answer_key(answer, task) == "#" + want[0]
    have = words(final_part(answer))
    return any(have[i : i + len(want)] == want for i in range(len(have) - len(want) + 1)) if want else False


def read_decision(action: StartTurn, task: str, event: ProtocolEvent) -> ProtocolEvent:
    """A turn's answer (or a corrective turn's text, taken as one) with its key; a non-answer becomes a
    refused, failed turn whose note tells the agent why."""
    if isinstance(event, AnswerPosted):
        text = event.content
    elif isinstance(event, NoDecision) and action.corrective:
        text = event.text
    else:
        return event
    why = refusal(text, task)
    if why is not None:
        return TurnFailed(action.letter, action.turn_id, f"{REFUSED}{why}", refused=True)
    return replace(event, key=answer_key(text, task))
