"""How `conclave ask` shows a job to a person: the live view, the tally by answer, the closing lines.

Pure functions of a JobView (and the answers' texts, for what each group of votes says), so they
render without a job. Lines are wrapped at word boundaries with a
hanging indent: a phrase like "2 of 3 votes" never breaks across lines.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass

from rich.console import Group
from rich.table import Table
from rich.text import Text

from conclave.cli.terminal import printable
from conclave.coordination.answers import final_answer
from conclave.coordination.reports import ShownAnswer
from conclave.jobs.read.views import JobView, cost_text, estimate_text, input_notes, plural

SHOWN_ANSWER = 40  # characters of an answer's short form in the tally
# each member's spend: tokens in (cached among them, as providers bill them), out, its part of the job's
SPEND_COLUMNS = ("in", "cached", "out", "share")


@dataclass(frozen=True)
class SaidVotes:
    """A group of the served tally (JobView.by_answer) with what its answer says, when its text is known."""

    labels: tuple[str, ...]
    votes: int
    says: str | None  # the short final answer

    def text(self) -> str:
        said = f'"{self.says}": ' if self.says else ""
        return f"{said}{' = '.join(self.labels)}, {plural(self.votes, 'vote')}"


def tally_by_answer(view: JobView, texts: Mapping[str, str]) -> list[SaidVotes]:
    """The tally by answer as the server grouped it (view.by_answer), each group with its short answer."""
    found = []
    for group in view.by_answer:
        text = next((texts[label] for label in group.labels if label in texts), None)
        says = (final_answer(text, view.task) or "").removeprefix("#") if text else None
        if says and len(says) > SHOWN_ANSWER:
            says = says[: SHOWN_ANSWER - 3].rstrip() + "..."
        found.append(SaidVotes(group.labels, group.votes, says))
    return found


def wrapped(text: str, width: int, style: str = "") -> Text:
    """`text` wrapped at word boundaries to `width`, continuation lines indented; control sequences in
    it (model text) stripped (terminal.py)."""
    lines = textwrap.wrap(
        printable(text),
        max(width, 40),
        subsequent_indent="    ",
        break_long_words=False,
        break_on_hyphens=False,
    ) or [""]
    return Text("\n".join(lines), style=style)


def render(view: JobView, texts: Mapping[str, str] | None = None, width: int = 100) -> Group:
    """The live view: a line per agent (state, answers, vote), the tally by answer, elapsed time."""
    texts = texts or {}
    table = Table(title=printable(f"{view.job_id} - team {view.team} - {view.state}"), title_justify="left")
    for column in ("agent", "model", "state", "answers", "vote", "in", "cached", "out", "share"):
        table.add_column(column, justify="right" if column in SPEND_COLUMNS else "left")
    for agent in view.agents:
        state = agent.state if not agent.error else f"{agent.state}: {agent.error[:60]}"
        used = agent.usage
        share = f"{agent.token_share:.0%}" if agent.token_share is not None else "-"
        estimated = f" (~{used.estimated_input_tokens:,} est.)" if used.estimated else ""
        taken_in = f"{used.input_tokens:,}{estimated}"
        spend = (taken_in, f"{used.cached_input_tokens:,}", f"{used.output_tokens:,}", share)
        cells = (agent.letter, agent.model, state, str(agent.answers), agent.vote or "-", *spend)
        table.add_row(*(printable(cell) for cell in cells))
    lines: list[Table | Text] = [table]
    round_ = view.progress.round if view.progress is not None else 0
    status = f"{view.phase} | round {round_} | {view.elapsed_s:.0f}s"
    lines.append(wrapped(status, width))
    groups = tally_by_answer(view, texts)
    if any(group.votes for group in groups):
        lines.append(wrapped("votes by answer: " + "; ".join(group.text() for group in groups), width))
    if checks := view.checks():
        lines.append(
            wrapped("checks: " + "; ".join(f"{label} {check}" for label, check in checks.items()), width)
        )
    if (blocked := view.verify_blocked) is not None:
        lines.append(wrapped(f"verification cannot decide: {blocked}", width, "bold"))
    if view.estimate is not None and (view.estimate.tokens or view.estimate.cost_usd):
        lines.append(wrapped(f"estimate: {estimate_text(view.estimate)}", width))
    leading = view.progress.leading if view.progress is not None else None
    if leading is not None and leading.votes > 0:
        lines.append(wrapped(f"leading: {leading.label} with {plural(leading.votes, 'vote')}", width))
    lines += [
        wrapped(f"note{'' if note.seen else ' (not seen yet)'}: {note.text}", width) for note in view.notes
    ]
    if view.done:
        lines += closing(view, width)
    return Group(*lines)


def closing(view: JobView, width: int) -> list[Text]:
    """The result in words: the winner and its majority, why the job ended, usage."""
    lines = []
    result = view.result
    if result is not None and result.winner:
        lines.append(wrapped(f"winner {result.winner}: {view.majority}", width, "bold"))
        if view.winner_check:
            lines.append(wrapped(f"its check: {view.winner_check}", width))
    if result is not None:
        lines.append(wrapped(f"why: {result.reason}", width))
    for letter, error in (result.errors if result is not None else {}).items():
        lines.append(wrapped(f"{letter} {view.dropped(letter)}: {error}", width))
    for note in view.diff_summary.file_notes() if view.diff_summary else []:
        lines.append(wrapped(note, width))
    used = view.usage
    cost = f", {cost_text(used)}" if used.cost_usd is not None else ""
    lines.append(
        Text(f"usage: {used.input_tokens:,} tokens in {input_notes(used)}, {used.output_tokens:,} out{cost}")
    )
    return lines


def see_more(view: JobView) -> str:
    """The closing line: how to see more of this job."""
    more = f"conclave show {view.job_id} --answers | --transcript"
    if view.diff_summary:
        more += " | --diff"
    return f"See more: {more}"


def answer_text(answer: ShownAnswer) -> str:
    """One answer for `conclave show --answers`: a heading (its author, its votes now or that it was
    replaced, its check) and its text."""
    about = [f"agent {answer.letter}", plural(answer.votes, "vote") if answer.latest else "replaced"]
    if answer.check:
        about.append(f"check {answer.check}")
    return f"## {answer.label} ({', '.join(about)})\n{answer.content}"
