"""A check's copy of one context folder: the caller's files at job start plus exactly what apply would write.

A check (coordination/verification.py) tests the patch the caller reviews, not the answer's whole
workspace: a workspace also holds what the patch never shows (files its .gitignore ignores, byte-code
caches, binaries, compiled artefacts), and any of those can change what the caller's command does (a
cached `.pyc` of a test file with its source's mtime and size runs instead of the test). So the copy
starts from base/ (the job-start copy, which honours the caller's .gitignore files) and takes the
answer's changes as apply writes them, with its hold-back rules (apply.py `write_patch`, review.py
`hold_back`): the changes the reviewed patch lists, no consent given: binaries, artefacts, VCS
metadata, and whatever else apply holds back are held back from the check too, and named. A context
given read-only (the default) is checked with what apply would write were it given `write`: the caller
reviews that patch all the same. Nothing outside the context folders gets in. The copy is scratch
(removed after its check), so it is written without apply's conflict check and fsyncs, and without
planning the changes again from the manifest: that hashed every file a second time
(bench/bench_checks.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from conclave.files.apply import Changes, write_patch
from conclave.files.diff import diff_trees
from conclave.files.review import Consent
from conclave.files.trees import Listing, copy_tree


def reviewed_copy(
    base: Path,
    answer: Path | None,
    dest: Path,
    *,
    listed: Listing,
    known: Mapping[str, str],
    answer_known: Mapping[str, str],
) -> Changes:
    """Fill the new folder `dest` with `base` (one context at job start, `listed` its listing and `known`
    its files' sha256 in the manifest) and, when given, what apply would write of `answer` (that context
    in an answer's snapshot, `answer_known` its files' sha256 as the snapshot recorded them); return what
    was written and what apply would hold back (blocking)."""
    copy_tree(base, dest, listed)  # copied, never linked: the check may write anywhere
    if answer is None or not answer.is_dir():
        return Changes()
    # the patch the caller reviews for this answer, without listing base/ again, and without reading a
    # file whose digest, base's and the answer's as each was copied, is the same
    patch = diff_trees(base, answer, listed=listed, known=known, final_known=answer_known)
    return write_patch(answer, dest, patch, Consent())
