"""The one way into a tree that someone else may be changing: fd-relative, never following a symlink.

An agent's workspace is bind-mounted into its container, where the agent's processes can rename, swap and
replace anything at any moment (a folder swapped for a symlink to a host path, a file for a FIFO). So
host-side code never opens a path inside a tree by name. Every access here starts from the tree's root
and opens one component at a time relative to the previous one, each directory with
`O_DIRECTORY|O_NOFOLLOW`; a symlink anywhere on the way is refused, never followed. A file is first
opened with `O_PATH|O_NOFOLLOW` (which reads nothing), checked with `fstat` to be a regular file within
the size cap, and only then reopened for reading through `/proc/self/fd`: the very inode that was
checked, so FIFOs, sockets and devices are never opened for reading. A new file is made with `O_EXCL` in
the same directory fd and renamed over the name through that fd (which replaces a link or a FIFO there,
never writes through it); an existing regular file is rewritten in place through its reopened O_PATH fd.
"""

from __future__ import annotations

import errno
import os
import posixpath
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from conclave.errors import FileTooLarge, NotAFile, PathOutsideRoot

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_O_PATH = getattr(os, "O_PATH", 0)
# Reopening the checked inode needs O_PATH and /proc (Linux). Elsewhere a file is opened O_NONBLOCK
# (a FIFO then does not block) and checked after the open instead.
_REOPEN = bool(_O_PATH) and os.path.isdir("/proc/self/fd")
UNSAFE_MODE_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_IWOTH
UidGid = tuple[int, int]


def split(rel: str, field: str = "path") -> list[str]:
    """The components of a relative path, `.` and inner `..` resolved lexically; refused if it leaves."""
    if not isinstance(rel, str):
        raise PathOutsideRoot(field, str(rel), "a path must be a string")
    if "\x00" in rel:
        raise PathOutsideRoot(field, rel, "it contains a NUL byte")
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        raise PathOutsideRoot(
            field, rel.encode("utf-8", "replace").decode(), "it is not valid UTF-8"
        ) from None
    # Never stripped or rewritten: a name with leading or trailing spaces is a different file. A
    # backslash is an ordinary character in a POSIX name.
    if rel.startswith("/"):
        raise PathOutsideRoot(field, rel, "absolute paths are not allowed")
    normal = posixpath.normpath(rel) if rel else "."
    if normal == ".." or normal.startswith("../"):
        raise PathOutsideRoot(field, rel, "'..' leads outside the root")
    return [] if normal == "." else normal.split("/")


def _refuse_link(field: str, rel: str) -> PathOutsideRoot:
    return PathOutsideRoot(
        field, rel, "it goes through a symlink, and links are never followed (not allowed)"
    )


def _open_dir_at(parent: int, name: str, rel: str, field: str) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                raise _refuse_link(field, rel) from None
            raise NotADirectoryError(errno.ENOTDIR, f"{rel!r} is not a folder", rel) from None
        raise


@contextmanager
def directory(
    root: Path,
    parts: list[str] | str,
    *,
    create: bool = False,
    owner: UidGid | None = None,
    field: str = "path",
) -> Iterator[int]:
    """A file descriptor of the folder `root/parts`, walked without following links; closed on exit.

    With `create`, missing folders are made (mode 0755, handed to `owner` when running as root).
    """
    names = split(parts, field) if isinstance(parts, str) else parts
    shown = "/".join(names) or "."
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in names:
            try:
                step = _open_dir_at(fd, name, shown, field)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(name, 0o755, dir_fd=fd)
                _chown_at(fd, name, owner)
                step = _open_dir_at(fd, name, shown, field)
            os.close(fd)
            fd = step
        yield fd
    finally:
        os.close(fd)


def _chown_at(dir_fd: int, name: str, owner: UidGid | None) -> None:
    if owner is not None and os.geteuid() == 0:
        os.chown(name, *owner, dir_fd=dir_fd, follow_symlinks=False)


def open_regular(dir_fd: int, name: str, rel: str, max_bytes: int | None = None, field: str = "path") -> int:
    """An fd for reading the regular file `name` in `dir_fd`; links, FIFOs, devices and sockets refused.

    The size is checked with fstat before anything is read: over `max_bytes`, `FileTooLarge`.
    """
    if _REOPEN:
        handle = os.open(name, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            _check(os.fstat(handle), rel, max_bytes, field)
            return os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
        finally:
            os.close(handle)
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY, dir_fd=dir_fd
        )
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse_link(field, rel) from None
        raise
    try:
        _check(os.fstat(fd), rel, max_bytes, field)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check(info: os.stat_result, rel: str, max_bytes: int | None, field: str) -> None:
    if stat.S_ISLNK(info.st_mode):
        raise _refuse_link(field, rel)
    if stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, f"{rel!r} is a folder", rel)
    if not stat.S_ISREG(info.st_mode):
        raise NotAFile(field, rel, kind(info.st_mode))
    if max_bytes is not None and info.st_size > max_bytes:
        raise FileTooLarge(field, rel, info.st_size, max_bytes)


def kind(mode: int) -> str:
    """What a non-regular entry is, in words."""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISLNK(mode):
        return "a symlink"
    return "not a regular file"


def read_at(dir_fd: int, name: str, rel: str, max_bytes: int | None, field: str = "path") -> bytes:
    """The bytes of a regular file, at most `max_bytes` even if it grows while it is read."""
    fd = open_regular(dir_fd, name, rel, max_bytes, field)
    # unbuffered: no terminal probe and no second buffer (every copy, diff and check reads this way)
    with os.fdopen(fd, "rb", buffering=0) as handle:
        if max_bytes is None:
            return handle.readall()
        chunks, left = [], max_bytes
        while left > 0 and (chunk := handle.read(left)):  # a raw read may return less than asked
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)


def read_bytes(root: Path, rel: str, max_bytes: int | None = None, field: str = "path") -> bytes:
    """The bytes of the regular file `root/rel` (see the module docstring for how it is reached)."""
    parts = split(rel, field)
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "the root is a folder", rel)
    with directory(root, parts[:-1], field=field) as fd:
        return read_at(fd, parts[-1], rel, max_bytes, field)


def lstat(root: Path, rel: str, field: str = "path") -> os.stat_result | None:
    """What `root/rel` is (not followed), or None when it does not exist."""
    parts = split(rel, field)
    if not parts:
        return os.stat(root)
    try:
        with directory(root, parts[:-1], field=field) as fd:
            return os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None


@dataclass(frozen=True, slots=True)
class Written:
    """What a write replaced: the old file's size (0 when it is new) and the new size."""

    old_size: int
    new_size: int


def write_bytes(
    root: Path,
    rel: str,
    data: bytes,
    *,
    owner: UidGid | None = None,
    mode: int | None = None,
    field: str = "path",
) -> Written:
    """Create or replace `root/rel` atomically: a new `O_EXCL` file in the same folder fd, renamed over it.

    Missing folders are created. A symlink, FIFO or device at the name is replaced, never written
    through; a folder there is refused. The file keeps the old file's mode (unsafe bits cleared) unless
    `mode` is given, and belongs to `owner` when running as root.
    """
    parts = split(rel, field)
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "the root is a folder", rel)
    with directory(root, parts[:-1], create=True, owner=owner, field=field) as fd:
        return write_at(fd, parts[-1], rel, data, owner=owner, mode=mode)


def write_at(
    dir_fd: int,
    name: str,
    rel: str,
    data: bytes,
    *,
    owner: UidGid | None = None,
    mode: int | None = None,
) -> Written:
    """`write_bytes` inside an open folder fd."""
    try:
        old = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        old = None
    if old is not None and stat.S_ISDIR(old.st_mode):
        raise IsADirectoryError(errno.EISDIR, f"{rel!r} is a folder", rel)
    regular = old is not None and stat.S_ISREG(old.st_mode)
    if regular and old is not None and mode is None and _REOPEN:
        rewritten = _rewrite(dir_fd, name, old, data, owner)
        if rewritten is not None:
            return rewritten
    if mode is None:
        mode = stat.S_IMODE(old.st_mode) & ~UNSAFE_MODE_BITS if regular and old else 0o644
    temp = temp_name(name)
    out = os.open(
        temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd
    )
    try:
        with os.fdopen(out, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode & 0o7777)
            if owner is not None and os.geteuid() == 0:
                os.fchown(handle.fileno(), *owner)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _unlink_quietly(dir_fd, temp)
        raise
    return Written(old.st_size if regular and old else 0, len(data))


def _rewrite(
    dir_fd: int, name: str, old: os.stat_result, data: bytes, owner: UidGid | None
) -> Written | None:
    """Overwrite an existing regular file in place (cheaper than a new file and a rename), through an
    O_PATH fd of exactly the inode that was looked at; None when it changed meanwhile (then replace it)."""
    try:
        handle = os.open(name, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) != (old.st_dev, old.st_ino):
            return None
        fd = os.open(f"/proc/self/fd/{handle}", os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC | os.O_NOCTTY)
    finally:
        os.close(handle)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        if info.st_mode & UNSAFE_MODE_BITS:
            os.fchmod(out.fileno(), stat.S_IMODE(info.st_mode) & ~UNSAFE_MODE_BITS)
        if owner is not None and os.geteuid() == 0 and (info.st_uid, info.st_gid) != owner:
            os.fchown(out.fileno(), *owner)
    return Written(old.st_size, len(data))


def temp_name(name: str) -> str:
    return f".{name[:100]}.conclave-tmp-{secrets.token_hex(4)}"


def _unlink_quietly(dir_fd: int, name: str) -> None:
    with suppress(OSError):
        os.unlink(name, dir_fd=dir_fd)
