"""A warm check container's workspace: one fixed folder per container, refilled in place for each check.

A bind mount pins the inode of the folder it mounts (sandbox/container.py), so a container that runs
many checks keeps one folder, `checks/slot-<n>/`, mounted at /workspace, and each check gets a fresh
copy there: the slot is emptied, then the entries of the check's own copy (files/workspaces.py
`check_copy`, protected files already put back) are moved in, renames within one filesystem (a copy
when a pooled slot, coordination/check_pool.py, lies on another). Nothing
runs in the container meanwhile (its command's processes are reaped after every command), and every
removal goes through removal.py's no-follow walk (coordination/verification.py uses it).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from conclave.files.removal import empty_folder, remove_tree
from conclave.files.safe import UidGid

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def make_slot(checks: Path, number: int, owner: UidGid | None = None) -> Path:
    """Create the empty folder `checks/slot-<number>` (handed to `owner` when we run as root)."""
    slot = checks / f"slot-{number}"
    checks.mkdir(parents=True, exist_ok=True)
    slot.mkdir()
    if owner is not None and os.geteuid() == 0:
        os.chown(slot, *owner)
    return slot


def refill(slot: Path, copy: Path, root: Path) -> None:
    """Empty `slot`, move every entry of `root` (the part of the check copy `copy` that is the
    workspace) into it, then remove what is left of `copy` (blocking)."""
    empty_folder(slot)  # its inode is mounted: the folder stays
    source, target = os.open(root, _DIR), os.open(slot, _DIR)
    try:
        for name in os.listdir(source):
            try:
                os.rename(name, name, src_dir_fd=source, dst_dir_fd=target)
            except OSError as exc:  # a pooled slot (coordination/check_pool.py) on another filesystem
                if exc.errno != errno.EXDEV:
                    raise
                shutil.move(root / name, slot / name)
    finally:
        os.close(source)
        os.close(target)
    remove_tree(copy)
