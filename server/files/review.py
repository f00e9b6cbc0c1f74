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
- it can run code or widen a coding agent's permissions on its own (editor tasks, direnv, agent settings
  and hooks, MCP registrations, install scripts, CI workflows, git hooks: the table in autorun.py), added,
  modified or deleted (deleting an agent's settings can drop its deny rules): needs `allow_autorun`;
- it is not in the patch at all (defence in depth: apply's plan and the patch are built apart).
A file that holds a secret of a member (`secret`) is never in the patch at all: it was left out of the
answer's snapshot (workspaces.py, secrets.py), and the result names it with the others.
A deletion shows in the patch whatever the content, so it needs no consent (VCS metadata and the autorun
files excepted).
docs/apply-and-verify.md tells users each rule.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict

from conclave.files.autorun import classify
from conclave.files.diff import Patch
from conclave.files.folding import folded_parts

HoldReason = Literal[
    "binary", "became_binary", "artifact", "vcs_metadata", "autorun", "not_in_patch", "secret"
]
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
FIXES: dict[HoldReason, str] = {
    "binary": "binary: the patch cannot show it; review it in the job's files, then pass force_binary=true "
    "(CLI: --force-binary) to apply it",
    "became_binary": "a text file that became binary (the patch shows an escaped excerpt); pass "
    "force_binary=true (CLI: --force-binary) to apply it",
    "artifact": "a compiled or loadable artefact (it can run on your next import or load); pass "
    "allow_artifacts=true (CLI: --allow-artifacts) to apply it",
    "vcs_metadata": "version-control metadata (.git, .hg, .svn in any letter case) is never applied",
    "autorun": "review it in the patch, then pass allow_autorun=true (CLI: --allow-autorun) to apply it",
    "not_in_patch": "not in the reviewed patch, so never applied",
    "secret": "it holds a team member's login token or key (as it is, or base64 or hex): left out of the "
    "answer's files, so no peer, diff or apply has it; never applied",
}


class Consent(BaseModel):
    """What the caller allowed, by name, beyond the reviewable text changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    force_binary: bool = False
    allow_artifacts: bool = False
    allow_autorun: bool = False


class HeldBack(BaseModel):
    """One change apply did not write, with why and what to do."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    reason: HoldReason
    fix: str  # why, and what would allow it


def is_vcs_metadata(rel: str) -> bool:
    return any(part in VCS_NAMES for part in folded_parts(rel))


def is_artifact(rel: str) -> bool:
    parts = folded_parts(rel)
    if any(part in ARTIFACT_DIRS for part in parts[:-1]):
        return True
    name = parts[-1] if parts else ""
    return name.endswith(ARTIFACT_SUFFIXES) or ".so." in name  # libfoo.so.1


def hold_back(patch: Patch, consent: Consent, planned: Iterable[str] = ()) -> list[HeldBack]:
    """The changes of `patch` (and of `planned`, apply's own list) that apply must not write."""
    held: dict[str, HeldBack] = {}
    for change in patch.files:
        reason: HoldReason | None = None
        # the patch marks it from both sides' content; its path alone is checked again in case it did not
        autorun = change.autorun or classify(change.path, None, None)
        if is_vcs_metadata(change.path):
            reason = "vcs_metadata"
        elif autorun is not None and not consent.allow_autorun:
            reason = "autorun"
        elif change.change != "deleted" and is_artifact(change.path) and not consent.allow_artifacts:
            reason = "artifact"
        elif change.status == "binary" and change.change != "deleted" and not consent.force_binary:
            reason = "became_binary" if change.became_binary else "binary"
        if reason is not None:
            why = f"{autorun.why}; " if reason == "autorun" and autorun is not None else ""
            held[change.path] = HeldBack(path=change.path, reason=reason, fix=why + FIXES[reason])
    shown = {change.path for change in patch.files}
    for rel in planned:
        if rel not in shown:
            held.setdefault(rel, HeldBack(path=rel, reason="not_in_patch", fix=FIXES["not_in_patch"]))
    return [held[path] for path in sorted(held)]
