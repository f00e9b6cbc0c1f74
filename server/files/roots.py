"""A caller's folder, pinned: opened with no link followed, and known by its identity (st_dev, st_ino).

The access check (jobs/admission/access.py) resolves a context path when the job is submitted; the copy
runs when the job gets a slot and the apply after the vote, minutes later. Opening the folder by name again
then would follow whatever link was swapped in meanwhile (the folder, or any folder above it), and read
or write outside the allowed roots. So:

    identify(path) -> (dev, ino)             at submit: every component opened with O_NOFOLLOW
    with pinned(path, identity) as root:     at copy and at apply: the same walk, the same identity or
                                             PathOutsideRoot; `root` names that very directory
                                             (/proc/self/fd/N), so later opens by name cannot drift
    run_pinned(path, identity, step)         step(root) with messages naming `path`, not the descriptor

A folder swapped for a link between submit and copy, or between copy and apply, is refused.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from conclave.errors import ConclaveError, PathOutsideRoot

T = TypeVar("T")
Identity = tuple[int, int]
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# /proc/self/fd/N reopens the very directory a descriptor holds (Linux); elsewhere the name is used after
# the identity check, which narrows the window without closing it.
_BY_FD = os.path.isdir("/proc/self/fd")


def _moved(path: str, why: str) -> PathOutsideRoot:
    return PathOutsideRoot(
        "context_paths.path",
        path,
        f"{why} since the job was submitted, so it is no longer the folder that was "
        "checked; nothing was read or written there. Give the folder again in a new job",
    )


def open_folder(path: str) -> int:
    """A descriptor of the absolute folder `path`, each component opened without following a link."""
    fd = os.open("/", _DIR)
    try:
        for name in Path(os.path.abspath(path)).parts[1:]:
            try:
                step = os.open(name, _DIR, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _moved(path, f"'{name}' on its way is now a symlink or a file") from None
                if exc.errno == errno.ENOENT:
                    raise _moved(path, f"'{name}' on its way is gone") from None
                raise
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return fd


def identify(path: str) -> Identity:
    """The (st_dev, st_ino) of the folder `path`, reached without following a link."""
    fd = open_folder(path)
    try:
        info = os.fstat(fd)
        return info.st_dev, info.st_ino
    finally:
        os.close(fd)


@contextmanager
def pinned(path: str, identity: Identity | None) -> Iterator[Path]:
    """The folder `path` as it was identified at submit (None: a job from before identities were kept)."""
    fd = open_folder(path)
    try:
        info = os.fstat(fd)
        if identity is not None and (info.st_dev, info.st_ino) != tuple(identity):
            raise _moved(path, "it was replaced by another folder")
        yield Path(f"/proc/self/fd/{fd}") if _BY_FD else Path(path)
    finally:
        os.close(fd)


def run_pinned(path: str, identity: Identity | None, step: Callable[[Path], T]) -> T:
    """`step(root)` on the pinned folder; an error's message names `path`, never /proc/self/fd/N."""
    with pinned(path, identity) as root:
        try:
            return step(root)
        except ConclaveError as exc:
            if str(root) != path:
                exc.args = tuple(
                    arg.replace(str(root), path) if isinstance(arg, str) else arg for arg in exc.args
                )
                if getattr(exc, "target", None) == str(root):
                    exc.target = path  # type: ignore[attr-defined]
            raise
