"""Apply the winner's final tree to a caller's folder: all of it, or nothing.

The changes are worked out from the final tree and the manifest taken at job start (sha256 and mode per
file), not by parsing the patch text, so binary files apply too. Before anything is written, every file
the changes touch is checked against the manifest: a file to modify or delete must still hold the sha256
it had at job start, a file to add must not exist, and no path may pass through a symlink. Any mismatch
raises `ApplyConflict` naming every such file, with nothing written (`test_apply_conflict_changes_nothing`).

Writes are atomic per file (a temporary sibling, fsync, `os.replace`); each replaced or deleted file is
kept as a backup sibling until all writes succeed. A failure midway undoes every step in reverse and
raises `ApplyFailed` (`test_apply_failure_midway_rolls_back`).
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Protocol

from conclave.files.diff import final_listing
from conclave.errors import ApplyConflict, ApplyFailed, PathOutsideRoot
from conclave.files.trees import copy_file, list_tree, resolve_inside, sha256_file


class Recorded(Protocol):
    """What the manifest holds for one file at job start."""

    sha256: str
    mode: int


@dataclass
class Changes:
    """What applying the final tree would do, by posix path relative to the target."""

    added: list[str] = field(default_factory=list)
    modified: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.added or self.modified or self.deleted)


def plan(final: Path, recorded: Mapping[str, Recorded], base: Path | None = None) -> Changes:
    """Compare the final tree with the files recorded at job start.

    With `base` (the job-start copy), a final file that is the same inode as its base file (an immutable
    tree's hard link) is unchanged without hashing it.
    """
    listing = final_listing(final, recorded)
    linked = list_tree(base).files if base is not None else {}
    changes = Changes()
    for rel, entry in listing.files.items():
        old, same = recorded.get(rel), linked.get(rel)
        if old is None:
            changes.added.append(rel)
        elif same is not None and (same.dev, same.ino) == (entry.dev, entry.ino):
            continue
        elif (entry.mode & 0o111 != 0) != (old.mode & 0o111 != 0) or sha256_file(final, rel) != old.sha256:
            changes.modified.append(rel)
    changes.deleted = sorted(set(recorded) - set(listing.files))
    return changes


def conflicts(target: Path, changes: Changes, recorded: Mapping[str, Recorded]) -> dict[str, str]:
    """Every touched file of `target` that no longer matches job start, with the reason."""
    found: dict[str, str] = {}
    for rel in changes.added + changes.modified + changes.deleted:
        blocked = _blocked_parent(target, rel)
        if blocked:
            found[rel] = blocked
            continue
        try:
            resolve_inside(target, rel)
            info = os.lstat(target / rel)
        except PathOutsideRoot:
            found[rel] = "its path now leads outside the folder"
            continue
        except FileNotFoundError:
            if rel not in changes.added:
                found[rel] = "deleted since the job started"
            continue
        if rel in changes.added:
            found[rel] = "created since the job started"
        elif not stat.S_ISREG(info.st_mode):
            found[rel] = "no longer a regular file"
        elif sha256_file(target, rel) != recorded[rel].sha256:
            found[rel] = "modified since the job started"
    return found


def _blocked_parent(target: Path, rel: str) -> str:
    for parent in reversed(PurePosixPath(rel).parents[:-1]):
        try:
            info = os.lstat(target / parent)
        except FileNotFoundError:
            return ""
        if not stat.S_ISDIR(info.st_mode):
            return f"'{parent}' is now a symlink or a file"
    return ""


def apply_tree(
    final: Path, target: Path, recorded: Mapping[str, Recorded], base: Path | None = None
) -> Changes:
    """Make `target` match `final` where it changed since job start; all or nothing (blocking)."""
    changes = plan(final, recorded, base)
    found = conflicts(target, changes, recorded)
    if found:
        raise ApplyConflict(str(target), found)
    _write(final, target, changes)
    return changes


def _write(final: Path, target: Path, changes: Changes) -> None:
    token = secrets.token_hex(4)
    undo: list[tuple[str, Callable[[], None]]] = []
    backups: list[Path] = []
    current = ""
    try:
        for current in changes.deleted:
            path = target / current
            backup = _sibling(path, "backup", token)
            os.replace(path, backup)
            backups.append(backup)
            undo.append((current, lambda path=path, backup=backup: os.replace(backup, path)))
        for current in sorted(changes.modified + changes.added):
            path = target / current
            for made in _make_parents(target, current):
                undo.append((current, lambda made=made: os.rmdir(made)))
            temp = _sibling(path, "tmp", token)
            try:
                copy_file(final, current, temp, fsync=True)
                if current in changes.modified:
                    backup = _sibling(path, "backup", token)
                    _keep(path, backup)
                    backups.append(backup)
                    os.replace(temp, path)
                    undo.append((current, lambda path=path, backup=backup: os.replace(backup, path)))
                else:
                    os.replace(temp, path)
                    undo.append((current, lambda path=path: os.unlink(path)))
            finally:
                temp.unlink(missing_ok=True)
    except OSError as exc:
        unrestored = _rollback(undo)
        raise ApplyFailed(str(target), current, exc.strerror or str(exc), unrestored) from exc
    for backup in backups:
        backup.unlink(missing_ok=True)
    for rel in changes.deleted:
        _prune_empty_parents(target, rel)


def _rollback(undo: list[tuple[str, Callable[[], None]]]) -> list[str]:
    """Undo the journal in reverse; return the paths that could not be restored."""
    failed = []
    for rel, step in reversed(undo):
        try:
            step()
        except OSError:
            failed.append(rel)
    return failed


def _sibling(path: Path, kind: str, token: str) -> Path:
    return path.with_name(f".{path.name}.conclave-{kind}-{token}")


def _keep(path: Path, backup: Path) -> None:
    """Keep the current content of `path` at `backup`: a hard link (cheap), else a copy."""
    try:
        os.link(path, backup, follow_symlinks=False)
    except OSError:
        shutil.copy2(path, backup, follow_symlinks=False)


def _make_parents(target: Path, rel: str) -> list[Path]:
    made = []
    for parent in reversed(PurePosixPath(rel).parents[:-1]):
        directory = target / parent
        if not directory.exists():
            directory.mkdir()
            made.append(directory)
    return made


def _prune_empty_parents(target: Path, rel: str) -> None:
    for parent in PurePosixPath(rel).parents[:-1]:
        try:
            (target / parent).rmdir()
        except OSError:
            return
