"""A coding-agent CLI member's turn: the CLI does the work in its container, then decides in a short
constrained call to the same CLI. Both become the protocol's usual events.

    no answer of its own yet   work run (edits /workspace, final message)         -> AnswerPosted
    its vote cannot matter     no run: a vote for its own answer                  -> VoteCast
    otherwise                  decision run (JSON: vote LABEL, or new_answer)     -> VoteCast, or
                               a work run with the current answers as material    -> AnswerPosted

A decision needs no run when every current answer gives the same final answer with the same changes
(any vote counts for all of them, as a scoring voter's does: split_turns.py), or when every other current
answer's author already votes for this member's answer and no vote goes elsewhere. A decision run is as
small as its CLI allows (clis/: our system prompt, no tools but a read-only one) and is shown each answer
as what changed (its patch, job_files.py) and what its check said, the full files staying at
/peers/<letter>. Each prompt puts what stays the same over a job first (the member, the task, the rules)
and what changes last (the answers, why it is asked), so the CLI's prompt cache can hit across its runs.

The answers reach the CLI in this voter's own order (the orchestrator's `shown`, ordered by the
action's labels), with their author's letter and where their files are (/peers/<letter>). Usage and
cost come from each run's JSON output (clis/), while it runs and a killed run's included. Neither
run tells the protocol it did work (`CLI_WORK` is only reported), so a turn that goes stale is
cancelled like one that has only been thinking: a decision run, and a revision's work run (its answer
would be written against answers that changed; the protocol never cancels a first answer's). A
cancelled turn (stale, the job cancelled, its deadline, its budget) kills the CLI's whole process tree
at once (clis/member.py) and charges what it used; the next turn starts from the files as the killed
run left them. The workspace is snapshotted by the orchestrator like any agent's.
"""

from __future__ import annotations

from typing import Any

from conclave.backends.base import ToolCall
from conclave.clis.cli_adapter import CliOutput, last_json_object
from conclave.clis.member import CliMember
from conclave.coordination import diff_digest, prompts
from conclave.coordination.protocol_events import (
    AnswerPosted,
    NoDecision,
    ProtocolEvent,
    StartTurn,
    TurnFailed,
    VoteCast,
)
from conclave.coordination.reports import ShownAnswer
from conclave.coordination.split_turns import agreeing_groups
from conclave.coordination.turn_context import TurnContext

NEW = "new_answer"
CLI_WORK = "cli_work"  # the transcript's mark of a work run; not the protocol's WorkStarted (see above)
MAX_SHOWN = 12_000  # characters of each answer in a CLI's prompt (an argument has a size limit)
MAX_SUMMARY = 800  # a decision or a presentation shows this much of an answer's own text
# a decision shows this many characters of the answers' diffs in all, whatever their size: a stat and
# the hunks that tell them apart (diff_digest.py), the full files at /peers/<letter>
DIFF_BUDGET = 4_000
DECISION_SYSTEM = """\
You are one voter in a team of agents that each worked on the same task in their own copy of the
files. You judge the team's current answers; you change no files. Each answer is shown as its author's
summary, what it changed (a unified diff of its files) and what the caller's check said. Where you
have a tool to read files, each agent's full files are read-only at /peers/<letter>, yours in the
current folder: read them only if the diffs leave you unsure. Reply with the one JSON object asked for
and nothing else."""


async def cli_turn(
    ctx: TurnContext,
    member: CliMember,
    action: StartTurn,
    shown: list[ShownAnswer],
    files: prompts.FilesPicture | None,
) -> ProtocolEvent:
    """One turn of the CLI `member` (its agent's, agents.py) to its decision, as drawn above."""
    own = any(answer.letter == ctx.letter for answer in shown)
    if action.can_answer and not own:
        return AnswerPosted(ctx.letter, action.turn_id, await _work(ctx, member, action, shown, files))
    if not action.labels:
        return NoDecision(ctx.letter, action.turn_id, "")
    settled = settled_vote(ctx.letter, shown, files)
    if settled is not None:
        return VoteCast(ctx.letter, action.turn_id, *settled)
    schema = decision_schema(action.labels, action.can_answer)
    # Only thinking: when a new answer makes it stale, the turn is cancelled, which kills the CLI's whole
    # tree at once (clis/member.py) and charges what its stream reported; the protocol asks again.
    prompt = decision_prompt(ctx, action, shown, files)
    output = await _run(ctx, member, prompt, schema, DECISION_SYSTEM)
    decision = output.structured or last_json_object(output.text) or {}
    choice, label = decision.get("decision"), str(decision.get("answer") or "").strip()
    reason = str(decision.get("reason") or "")[:500]
    if choice == "vote" and label in action.labels:
        return VoteCast(ctx.letter, action.turn_id, label, reason)
    if choice == NEW and action.can_answer:
        return AnswerPosted(ctx.letter, action.turn_id, await _work(ctx, member, action, shown, files))
    if action.corrective:  # its second unreadable decision: never take a decision's text as an answer
        return TurnFailed(ctx.letter, action.turn_id, f"no valid decision: {output.text[:300]!r}")
    return NoDecision(ctx.letter, action.turn_id, "")


async def _work(
    ctx: TurnContext,
    member: CliMember,
    action: StartTurn,
    shown: list[ShownAnswer],
    files: prompts.FilesPicture | None,
) -> str:
    # the transcript says a work run started; the turn stays cancellable when it goes stale (see above)
    await ctx.on_work(ToolCall(f"cli-{action.turn_id}", CLI_WORK, {"cli": member.adapter.facts.name}))
    output = await _run(ctx, member, work_prompt(ctx, action, shown, files), None)
    return output.text.strip()


async def _run(
    ctx: TurnContext, member: CliMember, prompt: str, schema: dict[str, Any] | None, system: str = ""
) -> CliOutput:
    """One run under the job's budget gate and the provider limit; its usage charged as reported, while
    it runs too (clis/meter.py, or its egress proxy's count for a key login, which also refuses calls
    once `ctx.stopped`): reaching the budget mid-run ends the job, which kills the run."""
    await ctx.gate()
    async with ctx.limiter:
        return await member.run(prompt, schema, ctx.on_usage, system=system, stopped=ctx.stopped)


def settled_vote(
    letter: str, shown: list[ShownAnswer], files: prompts.FilesPicture | None
) -> tuple[str, str] | None:
    """The vote (label, reason) of a decision that needs no run, else None: every answer gives the same
    final answer with the same changes, or every other answer's author votes for `letter`'s answer."""
    own = next((answer for answer in shown if answer.letter == letter), None)
    changes = files.changes if files is not None else {}
    if len(agreeing_groups(shown)) == 1 and len({changes.get(answer.label, "") for answer in shown}) == 1:
        label = own.label if own is not None else shown[0].label
        return label, "every answer gives the same final answer with the same changes"
    others = len(shown) - 1
    if own is not None and others and own.votes == others == sum(answer.votes for answer in shown):
        return own.label, "every other answer's author votes for this answer"
    return None


def work_prompt(
    ctx: TurnContext,
    action: StartTurn,
    shown: list[ShownAnswer],
    files: prompts.FilesPicture | None,
) -> str:
    """The work run: what stays the same over the job first (the member, what its final message must
    be, the task), then the others' answers as material and why it is asked."""
    parts = [
        f"You are agent {ctx.letter}, one member of a team of agents working on the same task; each works in "
        "its own copy of the files. Work in the current folder: read, edit and run what you need.",
        "When you are done, reply with your complete answer to the task as your final message: what "
        "you changed and why, or the answer itself. It is shown to the team as it stands.",
        f"Task:\n{ctx.task}",
    ]
    others = [answer for answer in shown if answer.letter != ctx.letter]
    mine = [answer for answer in shown if answer.letter == ctx.letter]
    if others:
        parts.append(
            "The other members' current answers (their files are read-only at /peers/<letter>):\n"
            + "\n\n".join(_answer(answer) for answer in others)
        )
    if mine:
        parts.append(
            f"Your own current answer ({mine[0].label}); your folder is as your last run left it:\n"
            + _answer(mine[0], own=True)
        )
    if action.note:
        parts.append(action.note)
    return "\n\n".join(parts)


def decision_prompt(
    ctx: TurnContext, action: StartTurn, shown: list[ShownAnswer], files: prompts.FilesPicture | None = None
) -> str:
    """The decision run: the member, the task and the reply's form first (the same on every decision of
    the job), then the current answers in this voter's order, each as what it changed and what its check
    said, and the labels it may choose."""
    changes = files.changes if files is not None else {}
    shown_changes = diff_digest.digests({a.label: changes.get(a.label, "") for a in shown}, DIFF_BUDGET)
    listed = "\n\n".join(
        _answer(
            answer,
            answer.letter == ctx.letter,
            shown_changes.get(answer.label, "") if answer.label in changes else None,
        )
        for answer in shown
    )
    new = f', or "{NEW}" if you can write a clearly better answer than all of them (answer: "")'
    labels = ", ".join(action.labels)
    return (
        f"You are agent {ctx.letter}.\n\nTask:\n{ctx.task}\n\n"
        'Decide: "vote" for the answer that best solves the task (it may be your own). '
        'Reply with one JSON object and nothing else: {"decision": "vote" or "new_answer", "answer": LABEL, '
        '"reason": "one sentence"}\n\n'
        f"The current answers:\n\n{listed}\n\n"
        f"Choose one of {labels}{new if action.can_answer else ''}. {action.note}".rstrip()
    )


def presentation_answers(shown: list[ShownAnswer], winner: str) -> list[ShownAnswer] | None:
    """What a CLI winner's presentation is shown: the winning answer's text whole (up to MAX_SHOWN), the
    others' cut to MAX_SUMMARY (their files stay at /peers); None when presenting would add nothing and
    the winning answer stands as it is: no other answer, or every vote went to it, as many as the other
    answers' authors at least (none of the others had a vote to fold in)."""
    won = next((answer for answer in shown if answer.label == winner), None)
    others = [answer for answer in shown if answer.label != winner]
    if won is not None and (not others or sum(a.votes for a in shown) == won.votes >= len(others)):
        return None
    cut = [answer.model_copy(update={"content": _cut(answer.content, MAX_SUMMARY)}) for answer in others]
    return [won.model_copy(update={"content": _cut(won.content, MAX_SHOWN)}), *cut] if won else cut


def decision_schema(labels: tuple[str, ...], can_answer: bool) -> dict[str, Any]:
    """Strict (every property required, none other): Codex's --output-schema accepts only that."""
    return {
        "type": "object",
        "properties": {
            "decision": {"type": "string", "enum": ["vote", NEW] if can_answer else ["vote"]},
            "answer": {"type": "string", "enum": [*labels, ""]},
            "reason": {"type": "string"},
        },
        "required": ["decision", "answer", "reason"],
        "additionalProperties": False,
    }


def _answer(answer: ShownAnswer, own: bool = False, changes: str | None = None) -> str:
    """An answer's heading (its check beside it), then its text; in a decision (`changes` known: "" for
    none), a shorter text and what it changed."""
    check = f" [check: {answer.check}]" if answer.check else ""
    who = "your own" if own else f"agent {answer.letter}"
    heading = f"=== {answer.label} ({who}){check} ==="
    if changes is None:
        return f"{heading}\n{_cut(answer.content, MAX_SHOWN)}"
    where = "the current folder" if own else f"/peers/{answer.letter}"
    diff = f"Its changes (full files at {where}):\n{changes}" if changes else ""
    return f"{heading}\n{_cut(answer.content, MAX_SUMMARY)}\n{diff or 'No file changed.'}"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "\n[... cut]"
