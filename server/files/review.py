"""What `apply` may write of a reviewed patch: the hold-back rules, pure (no I/O).

`apply` writes exactly what the patch shows a reviewer, and only what a reviewer can judge from it. A
change is held back (never written to the caller's folder, and named in the result with why and how to
allow it) when:
- it is binary, added or modified (the patch only says `Binary files ... differ`; a text file that became
  binary also shows an escaped excerpt): needs `force_binary`;
- it is a compiled or loadable artefact (`__pycache__/`, `*.pyc`, `*.so`, `*.dll`, ...): a copy keeps
  mtimes, so cached byte-code can be made to match its source and run on the caller's next import.
  Needs `allow_artifacts`;
- it is VCS metadata (`.git`, `.hg`, `.svn`, ... in any letter case, with the spellings case-insensitive
  and Windows/HFS+ filesystems fold onto them, as git's own `verify_dotfile` rule does): never applied;
- it is not in the patch at all (defence in depth: apply's plan and the patch are built apart).
A file that holds a secret of a member (`secret`) is never in the patch at all: it was left out of the
answer's snapshot (workspaces.py, secrets.py), and the result names it with the others.
A deletion shows in the patch whatever the content, so it needs no consent (VCS metadata excepted).
tests/security/test_apply_review.py covers each rule; docs/apply-and-verify.md tells users.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict

from conclave.files.diff import Patch

HoldReason = Literal["binary", "became_binary", "artifact", "vcs_metadata", "not_in_patch", "secret"]
VCS_NAMES = frozenset({".git", ".hg", ".svn", ".bzr", "_darcs"})
ARTIFACT_DIRS = frozenset({"__pycache__"})
ARTIFACT_SUFFIXES = (
    ".pyc",
    ".pyo",
    ".pyd",
    ".so",
    ".dylib",
    ".dll",
    ".exe",
    ".o",
    ".obj",
    ".a",
    ".lib",
    ".class",
    ".jar",
    ".node",
    ".wasm",
    ".bundle",
)
# Code points HFS+ ignores in names (git's is_hfs_dotgit): `.g\u200cit` is `.git` there.
_IGNORABLE = dict.fromkeys(
    [0x200C, 0x200D, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF]
)
FIXES: dict[HoldReason, str] = {
    "binary": "binary: the patch cannot show it; review it in the job's files, then pass force_binary=true "
    "(CLI: --force-binary) to apply it",
    "became_binary": "a text file that became binary (the patch shows an escaped excerpt); pass "
    "force_binary=true (CLI: --force-binary) to apply it",
    "artifact": "a compiled or loadable artefact (it can run on your next import or load); pass "
    "allow_artifacts=true (CLI: --allow-artifacts) to apply it",
    "vcs_metadata": "version-control metadata (.git, .hg, .svn in any letter case) is never applied",
    "not_in_patch": "not in the reviewed patch, so never applied",
    "secret": "it holds a team member's login token or key (as it is, or base64 or hex): left out of the "
    "answer's files, so no peer, diff or apply has it; never applied",
}


class Consent(BaseModel):
    """What the caller allowed, by name, beyond the reviewable text changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    force_binary: bool = False
    allow_artifacts: bool = False


class HeldBack(BaseModel):
    """One change apply did not write, with why and what to do."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    reason: HoldReason
    fix: str


def _folded(name: str) -> str:
    """A name as case-insensitive, HFS+ and NTFS filesystems compare it (trailing dots and spaces dropped)."""
    name = name.translate(_IGNORABLE).casefold().rstrip(" .")
    return ".git" if name == "git~1" else name  # NTFS's 8.3 short name of .git


def is_vcs_metadata(rel: str) -> bool:
    return any(_folded(part) in VCS_NAMES for part in PurePosixPath(rel).parts)


def is_artifact(rel: str) -> bool:
    parts = [_folded(part) for part in PurePosixPath(rel).parts]
    if any(part in ARTIFACT_DIRS for part in parts[:-1]):
        return True
    name = parts[-1] if parts else ""
    return name.endswith(ARTIFACT_SUFFIXES) or ".so." in name  # libfoo.so.1


def hold_back(patch: Patch, consent: Consent, planned: Iterable[str] = ()) -> list[HeldBack]:
    """The changes of `patch` (and of `planned`, apply's own list) that apply must not write."""
    held: dict[str, HoldReason] = {}
    for change in patch.files:
        reason: HoldReason | None = None
        if is_vcs_metadata(change.path):
            reason = "vcs_metadata"
        elif change.change != "deleted" and is_artifact(change.path) and not consent.allow_artifacts:
            reason = "artifact"
        elif change.status == "binary" and change.change != "deleted" and not consent.force_binary:
            reason = "became_binary" if change.became_binary else "binary"
        if reason is not None:
            held[change.path] = reason
    shown = {change.path for change in patch.files}
    for rel in planned:
        if rel not in shown:
            held.setdefault(rel, "not_in_patch")
    return [HeldBack(path=path, reason=reason, fix=FIXES[reason]) for path, reason in sorted(held.items())]
