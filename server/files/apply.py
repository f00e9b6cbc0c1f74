"""Apply the winner's final tree to a caller's folder: all of it, or nothing.

The changes are worked out from the final tree and the manifest taken at job start (sha256 and mode per
file), not by parsing the patch text, so binary files apply too. Before anything is written, every file
the changes touch is checked against the manifest: a file to modify or delete must still hold the sha256
it had at job start, a file to add must not exist, and no path may pass through a symlink. Any mismatch
raises `ApplyConflict` naming every such file, with nothing written.
A file that already is as the final tree has it (content and executable bit; absent for a deletion) is
no conflict and is not written again: a job resumed after an apply its dead server made applies again.

Writes are atomic per file (a temporary sibling made with O_EXCL, fsync, rename), and every step goes
through the folder's fd reached by safe.py's no-follow walk, never by name; each replaced or deleted file
is kept as a backup sibling until all writes succeed. A failure midway undoes every step in reverse and
raises `ApplyFailed`.

Only what the reviewed patch shows is written (review.py): binary changes without `force_binary`,
compiled artefacts without `allow_artifacts`, files that run code or widen an agent's permissions on their
own without `allow_autorun` (autorun.py), VCS metadata, and anything the patch does not list are held
back, never written, and returned in `Changes.held` with why. A file's mode is what the patch shows: a
modified file keeps the caller's own mode bits, with only the executable bit changed where the patch
says `old mode`/`new mode`; an added file is 0644 or 0755, as git writes it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Protocol, TypeVar

from conclave.errors import ApplyConflict, ApplyFailed, InputError, PathOutsideRoot
from conclave.files import safe
from conclave.files.diff import Patch, final_listing
from conclave.files.review import Consent, HeldBack, hold_back
from conclave.files.trees import CHUNK, list_tree, sha256_file

T = TypeVar("T")


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
    held: list[HeldBack] = field(default_factory=list)  # not written: why, and what would allow it

    @property
    def empty(self) -> bool:
        return not (self.added or self.modified or self.deleted)

    def without(self, held: list[HeldBack]) -> Changes:
        """These changes less the held-back paths, which are recorded in `held`."""
        out = {entry.path for entry in held}
        return Changes(
            [p for p in self.added if p not in out],
            [p for p in self.modified if p not in out],
            [p for p in self.deleted if p not in out],
            list(held),
        )


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
            info = safe.lstat(target, rel)
        except PathOutsideRoot:
            found[rel] = "its path now leads through a symlink"
            continue
        if info is None:
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
            info = safe.lstat(target, str(parent))
        except PathOutsideRoot:
            return f"'{parent}' is now reached through a symlink"
        if info is None:
            return ""
        if not stat.S_ISDIR(info.st_mode):
            return f"'{parent}' is now a symlink or a file"
    return ""


def apply_tree(
    final: Path,
    target: Path,
    recorded: Mapping[str, Recorded],
    base: Path | None = None,
    *,
    patch: Patch,
    consent: Consent = Consent(),
) -> Changes:
    """Make `target` match `final` where it changed since job start, as `patch` shows it; the rest is
    held back (review.py). All or nothing for what is written (blocking)."""
    planned = plan(final, recorded, base)
    changes = planned.without(hold_back(patch, consent, planned.added + planned.modified + planned.deleted))
    found = conflicts(target, changes, recorded)
    there = {rel for rel in found if already_applied(final, target, rel, changes)}
    if set(found) - there:
        raise ApplyConflict(str(target), {rel: why for rel, why in found.items() if rel not in there})
    pending = Changes(
        [rel for rel in changes.added if rel not in there],
        [rel for rel in changes.modified if rel not in there],
        [rel for rel in changes.deleted if rel not in there],
    )
    _write(final, target, pending)
    return changes


def already_applied(final: Path, target: Path, rel: str, changes: Changes) -> bool:
    """Whether `target` already holds `rel` as the final tree has it: content and executable bit, or
    absent for a deletion. A job resumed after its server died between its apply and its result applies
    again (jobs/upkeep/takeover.py), and what it finds written is its own change, not the caller's edit."""
    if _blocked_parent(target, rel):
        return False
    try:
        info = safe.lstat(target, rel)
    except PathOutsideRoot:
        return False
    if rel in changes.deleted:
        return info is None
    if info is None or not stat.S_ISREG(info.st_mode):
        return False
    wanted = os.lstat(final / rel)
    same_mode = (info.st_mode & 0o111 != 0) == (wanted.st_mode & 0o111 != 0)
    return same_mode and sha256_file(target, rel) == sha256_file(final, rel)


def write_patch(final: Path, scratch: Path, patch: Patch, consent: Consent = Consent()) -> Changes:
    """Write into `scratch`, a fresh copy of the files `patch` was made from, what `patch` shows of `final`,
    less what review.py holds back, as `apply_tree` writes it (same steps, same modes), for a check's copy
    (check_copy.py): its changes are the patch's own list, not planned again from the manifest (no file
    hashed twice), with no conflict check (no one else writes a fresh copy) and no fsync (it is removed
    after its check; a crash leaves nothing anyone reads). Blocking."""
    listed = {
        kind: [c.path for c in patch.files if c.change == kind] for kind in ("added", "modified", "deleted")
    }
    changes = Changes(listed["added"], listed["modified"], listed["deleted"]).without(
        hold_back(patch, consent)
    )
    _write(final, scratch, changes, durable=False)
    return changes


def _at(root: Path, rel: str, step: Callable[[int, str], T]) -> T:
    """Run `step(folder_fd, name)` for `root/rel`, its folder reached by the no-follow walk."""
    parts = safe.split(rel)
    with safe.directory(root, parts[:-1]) as fd:
        return step(fd, parts[-1])


def _rename(source: str, dest: str) -> Callable[[int, str], None]:
    return lambda fd, _name: os.rename(source, dest, src_dir_fd=fd, dst_dir_fd=fd)


def _rmdir(fd: int, name: str) -> None:
    os.rmdir(name, dir_fd=fd)


def _unlink(fd: int, name: str) -> None:
    os.unlink(name, dir_fd=fd)


def _unlink_other(other: str, fd: int, _name: str) -> None:
    os.unlink(other, dir_fd=fd)


def _write(final: Path, target: Path, changes: Changes, durable: bool = True) -> None:
    token = secrets.token_hex(4)
    undo: list[tuple[str, Callable[[], None]]] = []
    backups: list[str] = []
    current = ""
    try:
        for current in changes.deleted:
            name, backup = _names(current, "backup", token)
            _at(target, current, _rename(name, backup))
            backups.append(current)
            undo.append((current, partial(_at, target, current, _rename(backup, name))))
        for current in sorted(changes.modified + changes.added):
            for made in _make_parents(target, current):
                undo.append((current, partial(_at, target, made, _rmdir)))
            name, temp = _names(current, "tmp", token)
            _, backup = _names(current, "backup", token)
            modified = current in changes.modified

            def replace(
                fd: int,
                _name: str,
                rel: str = current,
                name: str = name,
                temp: str = temp,
                backup: str = backup,
                modified: bool = modified,
            ) -> None:
                now = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode if modified else None
                _copy_in(final, rel, fd, temp, now, durable=durable)
                try:
                    if modified:
                        os.link(name, backup, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
                    os.rename(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
                except BaseException:
                    os.unlink(temp, dir_fd=fd)
                    raise

            _at(target, current, replace)
            if modified:
                backups.append(current)
                undo.append((current, partial(_at, target, current, _rename(backup, name))))
            else:
                undo.append((current, partial(_at, target, current, _unlink)))
    except (OSError, InputError) as exc:
        unrestored = _rollback(undo)
        raise ApplyFailed(
            str(target), current, getattr(exc, "strerror", None) or str(exc), unrestored
        ) from exc
    for rel in backups:
        _, backup = _names(rel, "backup", token)
        with contextlib.suppress(OSError, InputError):
            _at(target, rel, partial(_unlink_other, backup))
    for rel in changes.deleted:
        _prune_empty_parents(target, rel)


def _copy_in(
    final: Path, rel: str, dir_fd: int, temp: str, current: int | None = None, *, durable: bool = True
) -> None:
    """Copy the regular file `final/rel` to a new file `temp` in `dir_fd` (O_EXCL, fsynced if `durable`),
    with the mode the patch shows: the `current` mode of the file it replaces (None: a new file, 0644),
    only its executable bits following `final`'s."""
    parts = safe.split(rel)
    with (
        safe.directory(final, parts[:-1]) as src_dir,
        os.fdopen(safe.open_regular(src_dir, parts[-1], rel), "rb") as src,
    ):
        mode = git_mode(current, bool(os.fstat(src.fileno()).st_mode & 0o111))
        out = os.open(
            temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd
        )
        with os.fdopen(out, "wb") as dst:
            while chunk := src.read(CHUNK):
                dst.write(chunk)
            dst.flush()
            os.fchmod(dst.fileno(), mode)
            if durable:
                os.fsync(dst.fileno())


def git_mode(current: int | None, executable: bool) -> int:
    """The mode a patch's `100644`/`100755` gives a file that has `current` (None: new) on disk."""
    mode = 0o644 if current is None else stat.S_IMODE(current) & 0o777
    if not executable:
        return mode & ~0o111
    return mode if mode & 0o111 else mode | (mode & 0o444) >> 2


def _rollback(undo: list[tuple[str, Callable[[], None]]]) -> list[str]:
    """Undo the journal in reverse; return the paths that could not be restored."""
    failed = []
    for rel, step in reversed(undo):
        try:
            step()
        except (OSError, InputError):
            failed.append(rel)
    return failed


def _names(rel: str, kind: str, token: str) -> tuple[str, str]:
    name = PurePosixPath(rel).name
    return name, f".{name}.conclave-{kind}-{token}"


def _make_parents(target: Path, rel: str) -> list[str]:
    """Create the missing folders of `rel` (no link followed); return them, shallowest first."""
    made = []
    for parent in reversed(PurePosixPath(rel).parents[:-1]):
        if safe.lstat(target, str(parent)) is None:
            _at(target, str(parent), lambda fd, name: os.mkdir(name, 0o755, dir_fd=fd))
            made.append(str(parent))
    return made


def _prune_empty_parents(target: Path, rel: str) -> None:
    for parent in PurePosixPath(rel).parents[:-1]:
        try:
            _at(target, str(parent), lambda fd, name: os.rmdir(name, dir_fd=fd))
        except (OSError, InputError):
            return
