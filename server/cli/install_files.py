"""The one step of `conclave install` that touches the disk: back up a client's file, then replace it.

A project's folder may be a stranger's (a cloned repository), and it may have planted links: a
`..mcp.json.conclave-tmp -> .git/hooks/post-checkout` made the old write put an executable git hook in
place. So nothing here is reached by name through a link:

- the target's folder is walked from the project root one component at a time with O_NOFOLLOW (user
  scope: opened as it is; a user's own dotfiles may well be linked), missing folders made on the way;
- the target must be absent or a regular file (a symlink is refused with the fix), and must still hold
  what the plan read;
- the backup and the temporary copy get fresh random names, created with O_EXCL|O_NOFOLLOW through the
  folder's descriptor (a planted name fails, never redirects), with the original's mode (0600 stays 0600);
- the copy is renamed over the target through the same descriptor.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from conclave.errors import ConfigError

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
NEW_FILE_MODE = 0o644


def write_file(path: Path, before: str | None, after: str, stamp: str, root: Path | None) -> Path | None:
    """Replace `path` with `after` (backed up first when it exists); return the backup's path."""
    folder = _open_folder(path.parent, root)
    try:
        info = _lstat(folder, path.name)
        if info is not None and stat.S_ISLNK(info.st_mode):
            raise ConfigError(
                f"{path} is a symlink; conclave install never writes through a link: replace it "
                "with a regular file, or add the entry by hand (run without --write to see it)"
            )
        if info is not None and not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{path} is not a regular file; nothing was written")
        current = _read_at(folder, path.name) if info is not None else None
        if current != before:
            raise ConfigError(f"{path} changed since it was read; nothing was written: run the command again")
        mode = stat.S_IMODE(info.st_mode) if info is not None else NEW_FILE_MODE
        backup = None
        if current is not None:
            backup = _create(folder, f"{path.name}.{stamp}-{secrets.token_hex(3)}.bak", current, mode)
        temporary = _create(folder, f".{path.name}.conclave-{secrets.token_hex(8)}.tmp", after, mode)
        try:
            os.rename(temporary, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            os.unlink(temporary, dir_fd=folder)
            raise
        return path.parent / backup if backup else None
    finally:
        os.close(folder)


def _open_folder(folder: Path, root: Path | None) -> int:
    """A descriptor of `folder`, made if missing; below `root` no component may be a link."""
    if root is None or not folder.is_relative_to(root):
        folder.mkdir(parents=True, exist_ok=True)
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in folder.relative_to(root).parts:
            try:
                step = os.open(name, _DIR, dir_fd=fd)
            except FileNotFoundError:
                os.mkdir(name, 0o755, dir_fd=fd)
                step = os.open(name, _DIR, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise ConfigError(
                        f"{folder}: '{name}' on the way is a symlink or a file; conclave install "
                        "never writes through a link in a project: nothing was written"
                    ) from exc
                raise
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lstat(folder: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _read_at(folder: int, name: str) -> str:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=folder)
    with os.fdopen(fd, "rb") as handle:
        return handle.read().decode("utf-8")


def _create(folder: int, name: str, text: str, mode: int) -> str:
    """A new file `name` in `folder` holding `text` with `mode`; O_EXCL|O_NOFOLLOW, so nothing planted is
    used."""
    fd = os.open(name, _CREATE, 0o600, dir_fd=folder)
    try:
        with os.fdopen(fd, "wb", closefd=False) as handle:
            handle.write(text.encode("utf-8"))
            handle.flush()
            os.fchmod(fd, mode & 0o777)
            os.fsync(fd)
    finally:
        os.close(fd)
    return name
