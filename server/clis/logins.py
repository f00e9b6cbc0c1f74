"""A CLI member's login, taken from the user's machine when the job starts: its endpoint's key, the
user's key variable, or the CLI's login files (read no-follow, capped). A key stays on the host, with the
member's egress proxy; login files go only into the member's private HOME inside its container
(member.py); neither into a workspace or a log."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from conclave.clis.cli_adapter import Login
from conclave.config.clis import login_files, login_fix
from conclave.config.models import CliAgentSpec, Team
from conclave.errors import ConfigError

MAX_LOGIN_FILE = 256 * 1024  # a login file is a few KB of JSON


def resolve_login(spec: CliAgentSpec, environ: Mapping[str, str]) -> Login:
    """How this member logs in; ConfigError says how to log in when nothing is found.

    A custom `base_url` takes only the key of its own `api_key_env` (the user's login never goes to
    another endpoint: config/models.py)."""
    facts = spec.facts
    if spec.base_url:
        key = spec.api_key(environ)
        return Login(spec.api_key_env, None if key == "unused" else key, base_url=spec.base_url)
    if spec.api_key_env:
        return Login(spec.api_key_env, spec.api_key(environ))
    for variable in facts.key_variables:
        if environ.get(variable):
            return Login(variable, environ[variable])
    files = {f"{facts.config_dir}/{path.name}": _read(path) for path in login_files(facts, environ)}
    if files:
        return Login(files=files)
    raise ConfigError(f"{spec.model}: you are not logged in to {facts.name}: {login_fix(facts, environ)}")


def cli_ready(spec: CliAgentSpec, team: Team, environ: Mapping[str, str]) -> None:
    """Refuse at submit what would fail at the member's first turn: no sandbox, or no login."""
    if team.sandbox == "none":
        raise ConfigError(
            f"team {team.name!r}: {spec.model} is a coding-agent CLI, which runs only inside its sandbox "
            "container; remove `sandbox: none` from the team file (and give the job context_paths)"
        )
    resolve_login(spec, environ)


def _read(path: os.PathLike[str]) -> bytes:
    """A login file: a regular file, not a link, at most MAX_LOGIN_FILE bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError(f"cannot read the login file {path} ({exc.strerror})") from exc
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"the login file {path} is not a regular file")
        content = file.read(MAX_LOGIN_FILE + 1)
    if len(content) > MAX_LOGIN_FILE:
        raise ConfigError(f"the login file {path} is over {MAX_LOGIN_FILE >> 10} KB: it is not a login file")
    return content
