"""An answer's changes as a voter is shown them, bounded whatever the diff's size: a stat of every file
it changed, then the hunks that tell the answers apart, up to a share of a budget, and a line for each
hunk left out (the full files stay at /peers/<letter>, where a voter with a read tool may look).

A hunk that every answer's diff holds word for word cannot help a voter choose, so it is named, not
shown; of the others, the smallest come first, so one long rewrite cannot crowd out the line that
differs. Pure functions of the diffs' text: the decision prompt (cli_turns.py) calls them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

HUNK = re.compile(r"^@@ .*? @@")


@dataclass(frozen=True)
class FileDiff:
    """One file of a unified diff: its path, its header lines and its hunks (each with its @@ line)."""

    path: str
    header: str
    hunks: tuple[str, ...]

    def counts(self) -> tuple[int, int]:
        """Lines added and removed."""
        lines = [line for hunk in self.hunks for line in hunk.splitlines()[1:]]
        return sum(line.startswith("+") for line in lines), sum(line.startswith("-") for line in lines)


def parse(diff: str) -> list[FileDiff]:
    """The files of a `git diff` (lines before the first `diff --git`, e.g. `# proj:` headings, dropped)."""
    files: list[FileDiff] = []
    for block in re.split(r"(?m)^(?=diff --git )", diff):
        if not block.startswith("diff --git "):
            continue
        header, hunks = [], []
        for line in block.splitlines(keepends=True):
            if HUNK.match(line):
                hunks.append(line)
            elif hunks:
                hunks[-1] += line
            else:
                header.append(line)
        path = block.split("\n", 1)[0].rsplit(" b/", 1)[-1]
        files.append(FileDiff(path, "".join(header), tuple(hunks)))
    return files


def stat(files: list[FileDiff]) -> str:
    """`git diff --stat`'s idea, one line a file: its path, lines added and removed."""
    lines = []
    for diff in files:
        added, removed = diff.counts()
        binary = not diff.hunks and "Binary" in diff.header
        lines.append(f" {diff.path} | {'binary' if binary else f'+{added} -{removed}'}")
    return "\n".join(lines)


def digest(diff: str, others: list[str], budget: int) -> str:
    """`diff` for a voter in about `budget` characters: as it is when it fits; else its stat, then its
    hunks that not every one of `others` also holds, smallest first, as many as fit, and a line for
    each hunk left out."""
    files = parse(diff)
    if len(diff) <= budget or not files:
        return diff if len(diff) <= budget else diff[:budget] + "\n[... cut]"
    shared = set.intersection(*({h for f in parse(o) for h in f.hunks} for o in others)) if others else set()
    parts = [f"{len(files)} file(s) changed:\n{stat(files)}"]
    used = len(parts[0])
    candidates = sorted(
        (
            (len(hunk), index, diff_file, hunk)
            for index, diff_file in enumerate(files)
            for hunk in diff_file.hunks
        ),
        key=lambda item: (item[0], item[1]),
    )
    chosen: dict[int, list[str]] = {}
    skipped: list[str] = []
    for size, index, diff_file, hunk in candidates:
        where = f"{diff_file.path} {hunk.splitlines()[0]}"
        if hunk in shared:
            skipped.append(f"{where} (the same in every answer)")
        elif used + size <= budget:
            chosen.setdefault(index, []).append(hunk)
            used += size
        else:
            skipped.append(f"{where} ({hunk.count(chr(10))} lines)")
    for index, diff_file in enumerate(files):
        if index in chosen:
            ordered = [hunk for hunk in diff_file.hunks if hunk in chosen[index]]
            parts.append(f"--- a/{diff_file.path}\n+++ b/{diff_file.path}\n{''.join(ordered)}".rstrip("\n"))
    if skipped:
        parts.append("Hunks not shown:\n" + "\n".join(f"- {line}" for line in skipped))
    return "\n".join(parts)


def digests(changes: Mapping[str, str], budget: int) -> dict[str, str]:
    """Each answer's digest (label -> text), `budget` characters shared among the answers with changes."""
    changed = {label: diff for label, diff in changes.items() if diff}
    share = budget // max(len(changed), 1)
    return {
        label: digest(diff, [other for key, other in changed.items() if key != label], share)
        for label, diff in changed.items()
    }
