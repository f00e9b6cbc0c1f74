"""Where teams come from: the presets shipped in conclave.configs, the user's team folder, and the default.

Every team file is read through `read_team_file`, which decides once whose file it is (`TeamFile`) and
holds a file not of the user's own to what their settings allow (config/destinations.py).
"""

from __future__ import annotations

import difflib
import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from conclave.config.destinations import NOTHING_ALLOWED, Allowed, Origin, check_destinations
from conclave.config.loading import load_team_file
from conclave.config.models import Team
from conclave.config.providers import PROVIDERS
from conclave.errors import ConfigError, TeamNotFound

# The order in which a default team is chosen when none is named: the mixed team, then each provider's own.
DEFAULT_ORDER = ("frontier", *PROVIDERS.default_teams())
FALLBACK_TEAM = "local"


def package_dir(package: str) -> Path:
    """The folder of a data package shipped inside Conclave (`conclave.configs`, `conclave.skills`).

    configs/ and skills/ hold an `__init__.py` so that importlib.resources resolves them the same way
    in an installed wheel and in an editable install (through setuptools' editable finder).
    """
    found = files(package)
    if isinstance(found, Path):
        return found
    # Not a plain folder (e.g. a namespace package's MultiplexedPath): the package's own file exists.
    module = importlib.import_module(package)
    if module.__file__ is None:
        raise RuntimeError(f"cannot locate the folder of package {package!r}")
    return Path(module.__file__).parent


def configs_dir() -> Path:
    """The folder of the team presets shipped with Conclave (`*.yaml`)."""
    return package_dir("conclave.configs")


def user_teams_dir(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME", "~")).expanduser() / ".config")
    return Path(base) / "conclave" / "teams"


@dataclass(frozen=True)
class TeamFile:
    """A team file and who wrote it, decided by its real path (links resolved): under the shipped presets,
    under the user's team folder, or anywhere else (a project's)."""

    path: Path
    origin: Origin

    @classmethod
    def at(cls, path: Path, environ: Mapping[str, str]) -> TeamFile:
        real = Path(os.path.realpath(path.expanduser()))
        for folder, origin in ((configs_dir(), Origin.SHIPPED), (user_teams_dir(environ), Origin.USER)):
            if real.is_relative_to(os.path.realpath(Path(str(folder)).expanduser())):
                return cls(path, origin)
        return cls(path, Origin.PROJECT)


def read_team_file(path: Path, environ: Mapping[str, str], allowed: Allowed = NOTHING_ALLOWED) -> Team:
    """Read one team file; a project's may send data only where `allowed` (the user's settings) says."""
    found = TeamFile.at(path, environ)
    team = load_team_file(found.path, environ)
    check_destinations(team, found.origin, str(path), allowed, user_teams_dir(environ))
    return team


def preset_paths(environ: Mapping[str, str]) -> dict[str, Path]:
    """Preset name -> file; a user's own teams shadow the shipped ones."""
    found: dict[str, Path] = {}
    for folder in (Path(str(configs_dir())), user_teams_dir(environ)):
        if folder.is_dir():
            for path in sorted(folder.glob("*.y*ml")):
                found[path.stem] = path
    return found


def resolve_team(
    name: str | None, environ: Mapping[str, str] | None = None, allowed: Allowed = NOTHING_ALLOWED
) -> Team:
    """An explicit path, else a preset name; with no name, the first preset whose keys are all set.

    `allowed`: where the user's settings let a team file not of their own send data."""
    env = os.environ if environ is None else environ
    presets = preset_paths(env)
    if name is None:
        for candidate in DEFAULT_ORDER:
            if candidate in presets:
                team = read_team_file(presets[candidate], env, allowed)
                if not team.missing_keys(env):
                    return team
        if FALLBACK_TEAM in presets:
            return read_team_file(presets[FALLBACK_TEAM], env, allowed)
        return _no_team(presets)
    looks_like_path = name.endswith((".yaml", ".yml")) or os.sep in name
    if looks_like_path:
        path = Path(name).expanduser()
        if not path.is_file():
            raise TeamNotFound(f"team file {name!r} does not exist; give a YAML path or a preset name")
        return read_team_file(path, env, allowed)
    if name in presets:
        return read_team_file(presets[name], env, allowed)
    # a cutoff above difflib's 0.6: 'nope' is 0.6 from 'openai', and suggesting it helps nobody
    near = difflib.get_close_matches(name, list(presets), n=1, cutoff=0.75)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise TeamNotFound(
        f"no team named {name!r}: it is not a preset or a YAML file; {hint}"
        f"presets: {', '.join(sorted(presets)) or 'none'}"
    )


def _no_team(presets: Mapping[str, Path]) -> Team:
    raise TeamNotFound(
        "no team given and no preset has its keys set; set ANTHROPIC_API_KEY, OPENAI_API_KEY or "
        f"GEMINI_API_KEY, or name a team (presets: {', '.join(sorted(presets)) or 'none'})"
    )


def list_presets(environ: Mapping[str, str] | None = None) -> list[tuple[str, Team | ConfigError]]:
    """Every preset with its team, or the error that stops it loading."""
    env = os.environ if environ is None else environ
    result: list[tuple[str, Team | ConfigError]] = []
    for name, path in preset_paths(env).items():
        try:
            result.append((name, load_team_file(path, env)))
        except ConfigError as exc:
            result.append((name, exc))
    return result
