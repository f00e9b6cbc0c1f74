"""Settling a tree an agent's commands wrote: unsafe mode bits cleared, entries handed to the command user,
and the whole measured, through safe.py's no-follow walk (sandbox/container.py runs it after every
command)."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from conclave.errors import TreeTooLarge
from conclave.files.safe import _O_PATH, _REOPEN, UNSAFE_MODE_BITS, UidGid
from conclave.files.walking import Found, walk


@dataclass(slots=True)
class Settled:
    """What `settle` found and changed in a tree."""

    total_bytes: int = 0
    files: int = 0
    stripped: int = 0
    chowned: int = 0
    limited: str | None = None  # why the walk stopped early (a cap), else None


def settle(root: Path, owner: UidGid | None = None) -> Settled:
    """Clear setuid, setgid and world-write bits in a tree, hand every entry to `owner` (as root), and
    measure it (the bytes of its regular files, by size). Links are changed themselves, never followed.
    """
    report = Settled()
    as_root = owner is not None and os.geteuid() == 0
    if as_root and owner is not None:
        os.chown(root, *owner, follow_symlinks=False)
    try:
        for _, fd, listed in walk(root):
            _settle_folder(fd, listed, owner if as_root else None, report)
    except TreeTooLarge as exc:  # what lies past the cap is never copied, diffed or applied
        report.limited = str(exc)
    return report


def _settle_folder(fd: int, listed: list[Found], owner: UidGid | None, report: Settled) -> None:
    for entry in listed:
        info = entry.info
        if stat.S_ISREG(info.st_mode):
            report.total_bytes += info.st_size
            report.files += 1
        if owner is not None and (info.st_uid, info.st_gid) != owner:
            try:
                os.chown(entry.name, *owner, dir_fd=fd, follow_symlinks=False)
                report.chowned += 1
            except FileNotFoundError:
                pass
        if info.st_mode & UNSAFE_MODE_BITS and not stat.S_ISLNK(info.st_mode):
            report.stripped += _strip(fd, entry)


def _strip(dir_fd: int, entry: Found) -> int:
    """Clear the unsafe bits of one entry through an O_PATH fd of exactly the inode that was listed."""
    if not _REOPEN:
        try:
            os.chmod(
                entry.name,
                stat.S_IMODE(entry.info.st_mode) & ~UNSAFE_MODE_BITS,
                dir_fd=dir_fd,
                follow_symlinks=False,
            )
            return 1
        except (OSError, NotImplementedError):
            return 0
    try:
        handle = os.open(entry.name, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return 0
    try:
        info = os.fstat(handle)
        if stat.S_ISLNK(info.st_mode) or (info.st_dev, info.st_ino) != (entry.info.st_dev, entry.info.st_ino):
            return 0
        os.chmod(f"/proc/self/fd/{handle}", stat.S_IMODE(info.st_mode) & ~UNSAFE_MODE_BITS)
        return 1
    finally:
        os.close(handle)
