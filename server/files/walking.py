"""Listing and walking a tree through safe.py's fd-relative opens: a folder's entries with their lstat,
and a depth-first walk that checks its caps while it walks (never a recursion, never a whole listing
before the cap), for trees someone else may be changing.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

from conclave.errors import TreeTooLarge
from conclave.files.safe import DIR_FLAGS, directory, split


@dataclass(frozen=True, slots=True)
class Found:
    """One entry of a folder, as `lstat` saw it."""

    name: str
    rel: str
    info: os.stat_result


def entries(dir_fd: int, dir_rel: str, limit: int | None = None) -> list[Found]:
    """The entries of an open folder, sorted by name, each with its lstat (links not followed).

    With `limit`, scanning stops once more than `limit` entries were seen and `TreeTooLarge` is raised:
    a folder of millions of entries is never loaded whole before the cap is checked.
    """
    found: list[Found] = []
    with os.scandir(dir_fd) as scan:
        for item in scan:
            if limit is not None and len(found) >= limit:
                raise TreeTooLarge(dir_rel or ".", f"more than {limit:,} entries", f"{limit:,} entries")
            try:
                info = item.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while we looked
            found.append(Found(item.name, f"{dir_rel}/{item.name}" if dir_rel else item.name, info))
    found.sort(key=lambda entry: entry.name)
    return found


MAX_DEPTH = 256  # folders nested deeper than this stop a walk (a recursion would die near 1,000)
MAX_ENTRIES = 1_000_000  # entries one walk looks at, in all


def walk(
    root: Path,
    start: str = "",
    *,
    skip: frozenset[str] = frozenset(),
    max_entries: int = MAX_ENTRIES,
) -> Generator[tuple[str, int, list[Found]]]:
    """Every folder under `root/start`, depth first.

    Each as (its path, an open fd valid until the next step, its entries).

    The caller may remove names from the entries list to keep the walk out of those folders. Folders
    that vanish or turn into something else meanwhile are left out; `skip` names are never entered.
    Iterative, with its caps checked while walking: a folder deeper than `MAX_DEPTH` below `start`, or
    more than `max_entries` entries in all, raise `TreeTooLarge` at that point.
    """
    with directory(root, start) as top:
        yield from _walk(top, "/".join(split(start)), skip, max_entries)


def _walk(
    top: int, rel: str, skip: frozenset[str], max_entries: int
) -> Iterator[tuple[str, int, list[Found]]]:
    seen = 0

    def listed_in(fd: int, at: str) -> list[Found]:
        nonlocal seen
        try:
            found = entries(fd, at, max_entries - seen)
        except TreeTooLarge:
            raise TreeTooLarge(
                at or ".", f"more than {max_entries:,} entries in all", f"{max_entries:,}"
            ) from None
        seen += len(found)
        return found

    listed = listed_in(top, rel)
    yield rel, top, listed
    # each frame: an open folder (closed when popped; the top one is the caller's), its path, what is
    # left of its entries to enter, and its depth below the start
    stack: list[tuple[int, str, Iterator[Found], int]] = [(top, rel, iter(listed), 0)]
    try:
        while stack:
            fd, _, pending, depth = stack[-1]
            entry = next((e for e in pending if stat.S_ISDIR(e.info.st_mode) and e.name not in skip), None)
            if entry is None:
                stack.pop()
                if fd != top:
                    os.close(fd)
                continue
            try:
                child = os.open(entry.name, DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue  # gone, or swapped for a link or a file since it was listed
            info = os.fstat(child)
            if (info.st_dev, info.st_ino) != (entry.info.st_dev, entry.info.st_ino):
                os.close(child)
                continue
            if depth + 1 > MAX_DEPTH:
                os.close(child)
                raise TreeTooLarge(
                    entry.rel, f"folders nested more than {MAX_DEPTH} deep", f"{MAX_DEPTH} levels"
                )
            stack.append((child, entry.rel, iter(()), depth + 1))
            listed = listed_in(child, entry.rel)
            yield entry.rel, child, listed
            stack[-1] = (child, entry.rel, iter(listed), depth + 1)  # what the caller left of it
    finally:
        for fd, *_ in stack:
            if fd != top:
                os.close(fd)
