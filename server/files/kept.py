"""What the server keeps, and the rule that no caller's folder touches it.

A server keeps its home (CONCLAVE_HOME: the SQLite database, http-tokens.json, its own files), the jobs
folder (every caller's jobs), and its team folders (the files that say where keys go). A context path
that is one of these, holds one, or lies inside one would copy the server's state into a job (every
caller's token and job) or, with apply, write into it (a token of the caller's choosing). So every
context path is refused when

    it is or lies inside a kept folder      a kept folder's (st_dev, st_ino) is among the path's own and
                                            its parents' (a bind mount of a kept folder is the same
                                            folder: the same pair, at another path)
    it holds a kept folder                  the path's pair is among a kept folder's parents', or a mount
                                            inside the path shows one of them (a bind mount of /srv under
                                            the path holds /srv/state)

compared by real path and by identity, so symlinks and bind mounts change nothing. Every process checks
with its own settings: a front when it admits a job, a worker when it copies the folder and when it
applies (it may keep its state elsewhere, or mount the front's folders where a caller's folder is).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from conclave.config.presets import user_teams_dir
from conclave.errors import ServerState
from conclave.files.roots import Identity
from conclave.settings import Settings

_ESCAPED = re.compile(r"\\([0-7]{3})")  # mountinfo writes a space as \040, a backslash as \134


@dataclass(frozen=True)
class KeptFolder:
    """One folder the server keeps, and what it is in words (with the setting that places it)."""

    path: Path
    what: str


@dataclass(frozen=True)
class Kept:
    """Everything one process keeps; `refuse` raises ServerState for a folder that touches any of it."""

    folders: tuple[KeptFolder, ...]
    mountinfo: Path = Path("/proc/self/mountinfo")

    @classmethod
    def of(cls, settings: Settings, environ: Mapping[str, str]) -> Kept:
        """The home (with the SQLite database and the tokens file in it), the jobs folder and the team
        folders of `settings` (the user's, from `environ`, and CONCLAVE_TEAM_DIRS)."""
        folders = [
            KeptFolder(settings.home, "the server's home (CONCLAVE_HOME: its database and callers' tokens)"),
            KeptFolder(settings.jobs_root, "the server's jobs folder (every caller's jobs)"),
            KeptFolder(user_teams_dir(environ), "the server's team folder"),
            *(
                KeptFolder(folder, "a team folder of the server (CONCLAVE_TEAM_DIRS)")
                for folder in settings.team_dirs or ()
            ),
        ]
        return cls(tuple(folders))

    def refuse(self, field: str, shown: str, path: Path | str | None = None) -> None:
        """Raise ServerState when the folder `path` (named `shown` to the caller; `path` may be a pinned
        /proc/self/fd/N) is, holds or lies inside a kept folder."""
        real = Path(os.path.realpath(path if path is not None else shown))
        me, around = _identity(real), _chain(real)  # its pair, and its own and its parents' that exist
        table = _mount_table(self.mountinfo)
        seen_as = _source(real, table)  # its filesystem and its path there: a bind mount's source
        inside = [mount for mount in table if mount.point != real and mount.point.is_relative_to(real)]
        for kept in self.folders:
            place = Path(os.path.realpath(kept.path.expanduser()))
            here, above = _identity(place), _chain(place)
            source = _source(place, table)
            # both on one filesystem: (its path, the kept folder's path) there, whatever mounts show them
            fs = (seen_as[1], source[1]) if seen_as and source and seen_as[0] == source[0] else None
            if real == place or (here is not None and here == me) or (fs and fs[0] == fs[1]):
                raise _refused(field, shown, "is", kept, place)
            if (
                (here is not None and here in around)
                or real.is_relative_to(place)
                or (fs and fs[0].is_relative_to(fs[1]))
            ):
                raise _refused(field, shown, "lies inside", kept, place)
            if (
                (me is not None and me in above)
                or place.is_relative_to(real)
                or (fs and fs[1].is_relative_to(fs[0]))
            ):
                raise _refused(field, shown, "holds", kept, place)
            for mount in inside:  # another view of a kept folder, or of a folder around or inside it
                shows = (
                    source is not None
                    and mount.device == source[0]
                    and (mount.root.is_relative_to(source[1]) or source[1].is_relative_to(mount.root))
                )
                if shows or _identity(mount.point) in above:
                    raise _refused(field, shown, f"holds (through the mount at {mount.point})", kept, place)


def _refused(field: str, shown: str, how: str, kept: KeptFolder, place: Path) -> ServerState:
    return ServerState(
        field,
        shown,
        f"it {how} {kept.what}, {place}, and nothing the server keeps is ever a caller's folder; give a "
        "project folder that neither holds nor lies inside it (the server's operator keeps the state "
        "folders outside CONCLAVE_ALLOWED_ROOTS)",
    )


def _identity(path: Path) -> Identity | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _chain(real: Path) -> list[Identity]:
    """The (st_dev, st_ino) of `real` and of each folder above it that exists, nearest first."""
    found = (_identity(folder) for folder in (real, *real.parents))
    return [identity for identity in found if identity is not None]


@dataclass(frozen=True)
class _Mount:
    """One line of the mount table: where it is mounted, its filesystem, and which of its folders."""

    point: Path
    device: str  # major:minor of the filesystem
    root: Path  # the folder of that filesystem shown at `point` (a bind mount's source)


def _mount_table(mountinfo: Path) -> list[_Mount]:
    """The mounts this process sees (none where the table cannot be read)."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return []
    table = []
    for line in lines:
        fields = line.split(" ", 5)
        if len(fields) >= 5:
            root, point = (Path(_ESCAPED.sub(lambda m: chr(int(m[1], 8)), f)) for f in fields[3:5])
            table.append(_Mount(point, fields[2], root))
    return table


def _source(place: Path, table: list[_Mount]) -> tuple[str, Path] | None:
    """The filesystem `place` is on and its path within it, from the mount that holds it."""
    holders = [mount for mount in table if place == mount.point or place.is_relative_to(mount.point)]
    if not holders:
        return None
    mount = max(reversed(holders), key=lambda m: len(m.point.parts))  # the last mounted there shows
    return mount.device, mount.root / place.relative_to(mount.point)
