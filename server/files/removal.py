"""Deleting a tree an agent's commands may have shaped: iterative, never following a link, any depth.

`shutil.rmtree` recurses once per level on Python 3.11 and dies with RecursionError on a tree a command
made 1,500 folders deep, even with `ignore_errors` (it ignores OSError only). Here each folder is opened
fd-relative with O_NOFOLLOW, its files unlinked, its folders removed from an explicit stack; at most
`MAX_OPEN` folders are open at once, and a deeper one is first moved up beside the tree (a rename in the
same filesystem) and removed as a tree of its own. Best effort like `rmtree(ignore_errors=True)`: an
entry that cannot be removed is left.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
MAX_OPEN = 64


def remove_tree(path: Path | str) -> None:
    """Delete `path` and all it holds (a file or a link at `path` is unlinked); quiet when it is gone."""
    path = Path(path)
    try:
        top = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        pending = [path.name]
        while pending:
            _remove(top, pending.pop(), pending)
    finally:
        os.close(top)


def empty_folder(path: Path | str) -> None:
    """Delete all `path` holds and keep the folder itself (a bind mount pins its inode: check_slots.py),
    reached with O_NOFOLLOW: its files unlinked from one open fd, its folders removed as trees."""
    try:
        fd = os.open(path, _DIR)
    except OSError:
        return
    try:
        pending = _clear_files(fd)
        while pending:
            _remove(fd, pending.pop(), pending)
    finally:
        os.close(fd)


def _remove(top: int, name: str, pending: list[str]) -> None:
    """Remove `name` in folder `top`; folders deeper than MAX_OPEN are moved into `top` and queued."""
    try:
        info = os.stat(name, dir_fd=top, follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode):
            os.unlink(name, dir_fd=top)
            return
        fd = os.open(name, _DIR, dir_fd=top)
    except OSError:
        return
    # each frame: the folder's parent fd, its name there, its own fd, its sub-folders still to remove
    stack: list[tuple[int, str, int, list[str]]] = [(top, name, fd, _clear_files(fd))]
    try:
        while stack:
            parent, own, fd, folders = stack[-1]
            if not folders:
                stack.pop()
                os.close(fd)
                _quietly(lambda own=own, parent=parent: os.rmdir(own, dir_fd=parent))
                continue
            sub = folders.pop()
            if len(stack) >= MAX_OPEN:
                moved = f".conclave-removing-{secrets.token_hex(6)}"
                if _quietly(
                    lambda sub=sub, moved=moved, fd=fd: os.rename(sub, moved, src_dir_fd=fd, dst_dir_fd=top)
                ):
                    pending.append(moved)
                continue
            try:
                child = os.open(sub, _DIR, dir_fd=fd)
            except OSError:
                continue
            stack.append((fd, sub, child, _clear_files(child)))
    finally:
        for _, _, fd, _ in stack:
            os.close(fd)


def _clear_files(fd: int) -> list[str]:
    """Unlink every entry of the open folder `fd` that is not a folder; return the folders' names."""
    folders = []
    try:
        with os.scandir(fd) as scan:
            for entry in scan:
                if entry.is_dir(follow_symlinks=False):
                    folders.append(entry.name)
                else:
                    _quietly(lambda name=entry.name: os.unlink(name, dir_fd=fd))
    except OSError:
        pass
    return folders


def _quietly(step) -> bool:  # type: ignore[no-untyped-def]
    try:
        step()
        return True
    except OSError:
        return False
