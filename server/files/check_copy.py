"""A check's copy of one context folder: the caller's files at job start plus exactly what apply would write.

A check (coordination/verification.py) tests the patch the caller reviews, not the answer's whole
workspace: a workspace also holds what the patch never shows (files its .gitignore ignores, byte-code
caches, binaries, compiled artefacts), and any of those can change what the caller's command does (a
cached `.pyc` of a test file with its source's mtime and size runs instead of the test). So the copy
starts from base/ (the job-start copy, which honours the caller's .gitignore files) and takes the
answer's changes through apply's own planning and hold-back rules (apply.py `apply_tree`, review.py
`hold_back`), with no consent given: binaries, artefacts, VCS metadata, and whatever else apply holds
back are held back from the check too, and named. A context given read-only (the default) is checked
with what apply would write were it given `write`: the caller reviews that patch all the same. Nothing
outside the context folders gets in. The copy is scratch (removed after its check, rebuilt if the
server dies), so apply's per-file fsync is skipped: on a busy disk it was most of a check copy's time.
"""

from __future__ import annotations

from pathlib import Path

from conclave.files.apply import apply_tree
from conclave.files.contexts import CopiedContext
from conclave.files.diff import diff_trees
from conclave.files.review import Consent, HeldBack
from conclave.files.trees import copy_tree, list_tree


def reviewed_copy(base: Path, answer: Path | None, context: CopiedContext, dest: Path) -> list[HeldBack]:
    """Fill the new folder `dest` with `base` (one context at job start) and, when given, what apply
    would write of `answer` (that context in an answer's snapshot); return what apply would hold back
    (blocking)."""
    copy_tree(base, dest, list_tree(base))  # copied, never linked: the check may write anywhere
    if answer is None or not answer.is_dir():
        return []
    patch = diff_trees(base, answer)  # the patch the caller reviews for this answer
    changes = apply_tree(answer, dest, context.files, base, patch=patch, consent=Consent(), durable=False)
    return changes.held
