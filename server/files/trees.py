"""File trees on disk: .gitignore-aware listing, hashing and copying, all through `safe.py`'s walk.

The leaf under `workspaces.py`, `diff.py` and `apply.py`: synchronous, no models, no async.
Invariants every function here keeps:
- symlinks are never followed: every folder and file is reached fd-relative with O_NOFOLLOW (safe.py);
- a copy reads at most the size the listing saw, so a file that grows (or a pseudo file that reports
  size 0) cannot make it read on;
- only regular files and directories are listed and copied; symlinks, FIFOs, sockets and devices are
  reported as skipped;
- an entry named `.git` (directory or worktree file) is skipped at any depth;
- copies never share an inode with their source unless the caller passes a `reuse` reference: only
  immutable trees (snapshots, final) are built by hard link.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from pathspec import GitIgnoreSpec

from conclave.errors import InputError, TreeTooLarge
from conclave.files import safe, walking

GIT_DIR = ".git"
CHUNK = 1 << 20
MAX_IGNORE_FILE = 1 << 20  # a .gitignore larger than this is not read
# A file whose mtime is this close to the moment a reference tree was captured may have been rewritten
# within one filesystem clock tick, so its (size, mtime) proves nothing: copy it (git's "racy clean").
RACY_MARGIN_NS = 2_000_000_000


class IgnoreRules:
    """The .gitignore files of one tree (root and nested) plus `.git/info/exclude`, read lazily.

    Git's precedence: the deepest .gitignore with a matching pattern decides (a later `!negation` in the
    same file wins), then its parents, then info/exclude. A file under an ignored directory stays ignored.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._specs: dict[str, GitIgnoreSpec | None] = {}
        self._dirs: dict[str, bool] = {}
        self._exclude = _read_spec(root, f"{GIT_DIR}/info/exclude")

    def _spec(self, dir_rel: str) -> GitIgnoreSpec | None:
        if dir_rel not in self._specs:
            self._specs[dir_rel] = _read_spec(self.root, f"{dir_rel}/.gitignore" if dir_rel else ".gitignore")
        return self._specs[dir_rel]

    def matches(self, rel: str, is_dir: bool) -> bool:
        """Whether the patterns ignore `rel` itself (its parents are not looked at)."""
        parts = rel.split("/")
        suffix = "/" if is_dir else ""
        for depth in range(len(parts) - 1, -1, -1):
            spec = self._spec("/".join(parts[:depth]))
            if spec is not None:
                decided = spec.check_file("/".join(parts[depth:]) + suffix).include
                if decided is not None:
                    return decided
        return bool(self._exclude and self._exclude.check_file(rel + suffix).include)

    def ignored(self, rel: str, is_dir: bool = False) -> bool:
        """Whether `rel` is ignored, itself or through an ignored parent directory."""
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent not in self._dirs:
                self._dirs[parent] = self.matches(parent, True)
            if self._dirs[parent]:
                return True
        return self.matches(rel, is_dir)


def _read_spec(root: Path, rel: str) -> GitIgnoreSpec | None:
    try:
        data = safe.read_bytes(root, rel, MAX_IGNORE_FILE)
    except (OSError, InputError):  # unreadable, a link, a FIFO, too large: no rules from it
        return None
    lines = data.decode("utf-8", "replace").splitlines()
    return GitIgnoreSpec.from_lines(lines) if any(line.strip() for line in lines) else None


@dataclass(frozen=True, slots=True)
class Entry:
    """One regular file of a listing."""

    size: int
    mode: int
    mtime_ns: int
    dev: int = 0
    ino: int = 0


@dataclass(slots=True)
class Listing:
    """A tree's regular files (by posix path relative to its root), its directories and what was skipped."""

    files: dict[str, Entry] = field(default_factory=dict)
    dirs: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    truncated: bool = False
    limit: str | None = None  # with `truncated`: the cap that stopped the walk, in words

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.files.values())


def list_tree(
    root: Path,
    start: str = "",
    *,
    rules: IgnoreRules | None = None,
    tracked: Iterable[str] = (),
    max_files: int | None = None,
) -> Listing:
    """List `root/start` (paths relative to it) without following links.

    `.git` and what `rules` ignore are skipped.

    Paths in `tracked` are kept even when ignored (git keeps tracked files); listing stops, marked
    `truncated`, once it holds more than `max_files` files, or at the walk's depth or entry cap (then
    `limit` says which; without `max_files` those raise TreeTooLarge). `start` itself is walked like
    any path (`safe.split`): a link on the way is refused with PathOutsideRoot. A name that is not
    valid UTF-8 is skipped, named in `skipped`: it could not round-trip through the manifest and patch.
    """
    tracked = set(tracked)
    tracked_dirs = {str(parent) for rel in tracked for parent in PurePosixPath(rel).parents}
    listing = Listing()
    entries = walking.MAX_ENTRIES if max_files is None else max(10 * max_files, 10_000)
    walker = walking.walk(root, start, skip=frozenset({GIT_DIR}), max_entries=entries)
    try:
        for _, _, found in walker:
            for entry in list(found):
                rel, info = entry.rel, entry.info
                if entry.name == GIT_DIR:
                    continue
                if not _utf8(entry.name):
                    found.remove(entry)  # a folder is not entered either
                    listing.skipped[shown_name(rel)] = "its name is not valid UTF-8: not copied (rename it)"
                    continue
                if stat.S_ISDIR(info.st_mode):
                    if rules is None or rel in tracked_dirs or not rules.ignored(rel, True):
                        listing.dirs.append(rel)
                    else:
                        found.remove(entry)  # not entered
                elif rules is not None and rel not in tracked and rules.ignored(rel, False):
                    continue
                elif stat.S_ISREG(info.st_mode):
                    listing.files[rel] = Entry(
                        info.st_size, stat.S_IMODE(info.st_mode), info.st_mtime_ns, info.st_dev, info.st_ino
                    )
                    if max_files is not None and len(listing.files) > max_files:
                        listing.truncated = True
                        return listing
                elif stat.S_ISLNK(info.st_mode):
                    listing.skipped[rel] = "symlink: not copied (links are never followed)"
                else:
                    listing.skipped[rel] = f"{safe.kind(info.st_mode)}, not a regular file: not copied"
    except TreeTooLarge as exc:
        if max_files is None:
            raise
        listing.truncated, listing.limit = True, f"{exc.found} (at {shown_name(exc.where)})"
    finally:
        walker.close()
    return listing


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
        return True
    except UnicodeEncodeError:  # os.scandir gives undecodable bytes as lone surrogates
        return False


def shown_name(rel: str) -> str:
    """A path as printable text: bytes that are not UTF-8 as \\xNN escapes.

    So it can be named in a message.
    """
    return rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def read_bytes(root: Path, rel: str, max_bytes: int | None = None) -> bytes:
    """The bytes of the regular file `root/rel`, following no symlink (safe.read_bytes)."""
    return safe.read_bytes(root, rel, max_bytes)


def sha256_file(root: Path, rel: str) -> str:
    """The sha256 of the regular file `root/rel`, following no symlink."""
    digest = hashlib.sha256()
    parts = safe.split(rel)
    with (
        safe.directory(root, parts[:-1]) as fd,
        os.fdopen(safe.open_regular(fd, parts[-1], rel), "rb") as handle,
    ):
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def tree_digest(root: Path, known: Mapping[str, str] | None = None, listing: Listing | None = None) -> str:
    """One sha256 of a tree as copy_tree copies it: its folders, and each file's path, mode and content;
    a file's content sha256 is taken from `known` where given (recorded as it was copied), else read.
    `listing`: the tree's, when the caller has it (else it is listed)."""
    listing, digest, known = listing or list_tree(root), hashlib.sha256(), known or {}
    for rel in sorted(listing.dirs):
        digest.update(f"d {rel}\n".encode("utf-8", "surrogateescape"))
    for rel, entry in sorted(listing.files.items()):
        line = f"f {rel} {entry.mode:o} {known.get(rel) or sha256_file(root, rel)}\n"
        digest.update(line.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def copy_file(src_root: Path, rel: str, dst: Path, *, max_bytes: int | None = None) -> str:
    """Copy `src_root/rel` to a new file `dst` (mode without setuid bits; mtime kept); return its sha256.

    At most `max_bytes` are copied (give the size the listing saw): never on to an end of file that
    keeps moving.
    """
    digest = hashlib.sha256()
    parts = safe.split(rel)
    with (
        safe.directory(src_root, parts[:-1]) as fd,
        # unbuffered both ways: no terminal probe, no second buffer (a check copies every file of base/)
        os.fdopen(safe.open_regular(fd, parts[-1], rel), "rb", buffering=0) as source,
    ):
        info = os.fstat(source.fileno())
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(out, "wb", buffering=0) as target:
            left = max_bytes
            while left is None or left > 0:
                chunk = source.read(CHUNK if left is None else min(CHUNK, left))
                if not chunk:
                    break
                if left is not None:
                    left -= len(chunk)
                digest.update(chunk)
                view = memoryview(chunk)
                while view:  # a raw write may take less than it is given
                    written = target.write(view)
                    if not written:
                        raise OSError(errno.EIO, "a write into the copy made no progress", str(dst))
                    view = view[written:]
            os.fchmod(target.fileno(), stat.S_IMODE(info.st_mode) & 0o777 & ~stat.S_IWOTH)
            os.utime(target.fileno(), ns=(info.st_atime_ns, info.st_mtime_ns))
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class Reference:
    """An immutable tree whose unchanged files a new immutable copy may hard-link instead of copying."""

    root: Path
    files: dict[str, Entry]
    captured_ns: int

    def reusable(self, rel: str, entry: Entry) -> Path | None:
        old = self.files.get(rel)
        if old is None or (old.size, old.mode, old.mtime_ns) != (entry.size, entry.mode, entry.mtime_ns):
            return None
        return self.root / rel if entry.mtime_ns < self.captured_ns - RACY_MARGIN_NS else None


def copy_tree(
    src: Path,
    dst: Path,
    listing: Listing,
    *,
    reuse: Reference | None = None,
    on_error: Callable[[str, OSError | InputError], None] | None = None,
) -> dict[str, str | None]:
    """Copy the listed files of `src` into the new directory `dst`; return {path: sha256, or None if linked}.

    With `reuse`, unchanged files are hard-linked from the reference (only for immutable results).
    A file that cannot be read is reported to `on_error` and left out; without `on_error` it raises.
    """
    dst.mkdir(parents=True)
    for rel in listing.dirs:
        (dst / rel).mkdir(parents=True, exist_ok=True)
    copied: dict[str, str | None] = {}
    for rel, entry in listing.files.items():  # every parent is in listing.dirs, made above
        linked = reuse.reusable(rel, entry) if reuse else None
        try:
            if linked is not None:
                try:
                    os.link(linked, dst / rel, follow_symlinks=False)
                    copied[rel] = None
                    continue
                except OSError:
                    pass
            copied[rel] = copy_file(src, rel, dst / rel, max_bytes=entry.size)
        except (OSError, InputError) as exc:  # vanished, or swapped for a link or a FIFO since listed
            if on_error is None:
                raise
            on_error(rel, exc)
    return copied
