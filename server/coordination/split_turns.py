"""The split turn: the answer as plain text from a short prompt; the decision as a separate short step.

    no answer of its own yet      answer(persona, task)                         -> AnswerPosted
    otherwise, a Scorer backend   score every current answer, vote for the best -> VoteCast
    otherwise                     choose a label or "new" (a JSON schema)       -> VoteCast, or a
                                  new plain answer with the others as material  -> AnswerPosted

A small model given the rules and a JSON envelope writes about the task instead of answering it and
votes by position (bench/quality.py measures both designs); here it only ever answers the task, and
the local model votes by how likely it finds each answer, which a 135M model does better than it
writes a vote (bench/results/quality-local.json).
"""

from __future__ import annotations

import json

from conclave.backends.base import Backend, Message, Request, Scorer
from conclave.coordination import prompts
from conclave.coordination.protocol_events import AnswerPosted, NoDecision, ProtocolEvent, StartTurn, VoteCast
from conclave.coordination.reports import ShownAnswer
from conclave.coordination.turn_context import TurnContext


async def split_turn(
    ctx: TurnContext, backend: Backend, scorer: Scorer | None, action: StartTurn, shown: list[ShownAnswer]
) -> ProtocolEvent:
    """One split turn to its decision; `shown` is every current answer in this voter's order; `scorer`
    (the backend itself, when it scores: agents.py) votes by likelihood."""
    own = any(answer.letter == ctx.letter for answer in shown)
    task = prompts.with_notes(ctx.task, action.notes)  # steering notes follow the task
    if action.can_answer and not (own and action.labels):
        return AnswerPosted(ctx.letter, action.turn_id, await _answer(ctx, backend, task, action.note))
    if scorer is not None:
        groups = agreeing_groups(shown)
        if len(groups) == 1:  # every answer says the same: any vote counts for all of them, so no scoring
            label = next((a.label for a in shown if a.letter == ctx.letter), shown[0].label)
            return VoteCast(ctx.letter, action.turn_id, label, "every answer gives the same final answer")
        # One score per group of equivalent answers, from its earliest-posted member (label order is
        # the same for every voter, so the choice does not depend on this voter's order).
        firsts = [min(group, key=lambda answer: answer.label) for group in groups]
        request = _answer_request(ctx, task, "")
        scores = await ctx.score(scorer, request, [answer.content for answer in firsts])
        by_label = {
            answer.label: score for group, score in zip(groups, scores, strict=True) for answer in group
        }
        label, reason = pick(shown, [by_label[answer.label] for answer in shown])
        return VoteCast(ctx.letter, action.turn_id, label, reason)
    request = ctx.request(
        [Message("user", prompts.choice_prompt(task, ctx.letter, shown, action.can_answer))],
        system=ctx.spec.system_prompt or "",
        max_tokens=64,
        response_schema=prompts.choice_schema(action.labels, action.can_answer),
    )
    completion = await ctx.call(backend, request)
    choice = _choice(completion.text)
    if choice == prompts.NEW and action.can_answer:
        text = await _answer(ctx, backend, task, action.note, shown)
        return AnswerPosted(ctx.letter, action.turn_id, text)
    if choice not in action.labels:
        return NoDecision(ctx.letter, action.turn_id, completion.text)
    return VoteCast(ctx.letter, action.turn_id, choice, "chosen as correct and complete")


def agreeing_groups(shown: list[ShownAnswer]) -> list[list[ShownAnswer]]:
    """The current answers grouped by final answer (`agrees_with`, from coordination/answers.py), in the
    order their first member is shown; equal texts always share a group."""
    groups: list[list[ShownAnswer]] = []
    for answer in shown:
        home = next(
            (
                g
                for g in groups
                if any(o.label in answer.agrees_with or o.content == answer.content for o in g)
            ),
            None,
        )
        if home is None:
            groups.append([answer])
        else:
            home.append(answer)
    return groups


def pick(shown: list[ShownAnswer], scores: list[float]) -> tuple[str, str]:
    """The vote of a scoring voter: the answer the model finds most likely, ties to the one shown
    first; the reason lists every score."""
    best = max(range(len(shown)), key=lambda index: (scores[index], -index))
    listed = ", ".join(f"{answer.label} {score:.2f}" for answer, score in zip(shown, scores, strict=True))
    return shown[best].label, f"the most likely answer by mean token log-probability ({listed})"


async def _answer(
    ctx: TurnContext, backend: Backend, task: str, note: str, material: list[ShownAnswer] | None = None
) -> str:
    completion = await ctx.call(backend, _answer_request(ctx, task, note, material or []))
    return completion.text.strip()


def _answer_request(
    ctx: TurnContext, task: str, note: str, material: list[ShownAnswer] | None = None
) -> Request:
    """The plain answer call: the persona as the system prompt, the task (and material) as the user's."""
    text = prompts.answer_prompt(task, note, material or [])
    return ctx.request([Message("user", text)], system=ctx.spec.system_prompt or "")


def _choice(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        return ""
    choice = data.get("choice") if isinstance(data, dict) else None
    return choice.strip() if isinstance(choice, str) else ""
