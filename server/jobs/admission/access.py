"""Who may name what: the folders and team files a caller of one transport may give to ask_team.

    stdio   the local user's coding agent: any folder (or CONCLAVE_ALLOWED_ROOTS); team files from the
            presets, the user's team folder and the folders in CONCLAVE_TEAM_DIRS
    http    a caller holding a token: folders only under CONCLAVE_ALLOWED_ROOTS, which the operator sets
            (unset: no folder at all; the working directory is no root); team files as over stdio
    local   the `conclave ask` command: the user at the terminal, any team file

The project folder is not trusted for team files: a cloned repository may ship a `conclave.yaml` that
points a provider's key at its own server.

A folder is compared after resolving every link, so a link inside an allowed root that points out of it
is refused too. On every transport, whatever the roots, no folder may be, hold or lie inside what the
server keeps (its home, jobs folder and team folders: files/kept.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from conclave.config.presets import configs_dir, user_teams_dir
from conclave.errors import NotPermitted, term
from conclave.files.kept import Kept
from conclave.settings import Settings

Transport = Literal["local", "stdio", "http"]


@dataclass(frozen=True)
class Access:
    """The folders (None: any; empty: none) and team-file folders (None: any file) callers may name, and
    what the server keeps, which no caller may name."""

    transport: Transport
    folders: tuple[Path, ...] | None
    team_dirs: tuple[Path, ...] | None
    kept: Kept
    # a caller's own roots, within `folders` (None: `folders` alone): over HTTP, its entry in
    # http-tokens.json (app/tokens.py)
    caller_roots: Callable[[str], tuple[Path, ...] | None] | None = None

    @classmethod
    def local(cls, settings: Settings, environ: Mapping[str, str] | None = None) -> Access:
        kept = Kept.of(settings, os.environ if environ is None else environ)
        return cls("local", _resolved(settings.allowed_roots), None, kept)

    @classmethod
    def stdio(cls, settings: Settings, environ: Mapping[str, str], cwd: Path) -> Access:
        kept = Kept.of(settings, environ)
        return cls("stdio", _resolved(settings.allowed_roots), _team_dirs(settings, environ), kept)

    @classmethod
    def http(
        cls,
        settings: Settings,
        environ: Mapping[str, str],
        cwd: Path,
        caller_roots: Callable[[str], tuple[Path, ...] | None] | None = None,
    ) -> Access:
        """A shared server's callers name folders only under roots its operator chose (and, per caller,
        under its own roots from `caller_roots`): the working directory is no root (a state folder
        under it would be every caller's to read and rewrite)."""
        roots = _resolved(settings.allowed_roots) or ()
        return cls("http", roots, _team_dirs(settings, environ), Kept.of(settings, environ), caller_roots)

    def check_folder(self, field: str, path: str, caller: str | None = None) -> None:
        """Refuse a context path the server keeps, or outside the allowed roots (naming the setting that
        widens them) or `caller`'s own."""
        self.kept.refuse(field, path)
        if self.folders is None:
            return
        if not self.folders:
            raise NotPermitted(
                field,
                path,
                f"over {self.transport} a caller may name folders only under roots the server's operator "
                "chose, and this server has none: its operator can set CONCLAVE_ALLOWED_ROOTS to the "
                "folders callers may name (separated by ':'), outside its CONCLAVE_HOME; or ask without "
                f"{term('context_paths')}",
            )
        real = Path(os.path.realpath(path))
        if not any(real == root or real.is_relative_to(root) for root in self.folders):
            roots = os.pathsep.join(str(root) for root in self.folders)
            raise NotPermitted(
                field,
                path,
                f"over {self.transport} a caller may name folders only under {roots}; the server's "
                "user can allow more with CONCLAVE_ALLOWED_ROOTS (folders separated by ':')",
            )
        own = self.caller_roots(caller) if caller is not None and self.caller_roots is not None else None
        if own is not None and not any(
            real == root or real.is_relative_to(root) for root in _resolved(own) or ()
        ):
            raise NotPermitted(
                field,
                path,
                f"caller {caller!r} may name folders only under {os.pathsep.join(map(str, own)) or 'none'} "
                '(the "roots" of its entry in the server\'s http-tokens.json); name a folder there, or ask '
                "the server's operator to add it",
            )

    def check_team(self, name: str | None) -> None:
        """Refuse a team file outside the presets and the team folders this transport allows."""
        if name is None or self.team_dirs is None or not (name.endswith((".yaml", ".yml")) or os.sep in name):
            return
        real = Path(os.path.realpath(Path(name).expanduser()))
        if not any(real.is_relative_to(folder) for folder in self.team_dirs):
            where = ", ".join(str(folder) for folder in self.team_dirs)
            raise NotPermitted(
                "team",
                name,
                f"over {self.transport} a team file is read only from {where} (a project's own "
                "files are not trusted: a cloned repository may have written them); name a preset "
                f"({term('list_teams')}), put the file in the user's team folder and name it without its "
                "path, or "
                f"let the server's user allow its folder with CONCLAVE_TEAM_DIRS={real.parent} (folders "
                "separated "
                "by ':')",
            )


def _team_dirs(settings: Settings, environ: Mapping[str, str]) -> tuple[Path, ...] | None:
    return _resolved((Path(str(configs_dir())), user_teams_dir(environ), *(settings.team_dirs or ())))


def _resolved(paths: tuple[Path, ...] | None) -> tuple[Path, ...] | None:
    return None if paths is None else tuple(Path(os.path.realpath(path.expanduser())) for path in paths)
