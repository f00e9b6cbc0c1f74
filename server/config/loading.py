"""Reading a team file: YAML, `${ENV}` expansion, and errors that name the file, the key and the fix.

A team file may come from a caller, so `${VAR}` expands only in an agent's EXPANDABLE keys (never in a name
or prompt a caller or a model sees), and never a variable that holds
a key: `model: openai/${ANTHROPIC_API_KEY}` would put the key in a request body.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Collection, Mapping
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, Discriminator, Tag, ValidationError

from conclave.config.models import EXPANDABLE, Team
from conclave.config.providers import PROVIDERS
from conclave.errors import ConfigError

_ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
# Names that hold a secret by convention (OPENROUTER_API_KEY, GH_TOKEN, DB_PASSWORD, ...).
_SECRET_NAME = re.compile(r"(API_?KEY|(^|_)(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?))$", re.IGNORECASE)
MIN_SECRET = 8  # shorter values are not keys, and matching them would refuse ordinary words
# A URL carrying a password (CONCLAVE_DATABASE_URL, a Redis URL): a secret whatever its variable is named.
_URL_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@\s]*:[^/@\s]+@")


def secret_variables(environ: Mapping[str, str], named: Collection[str] = ()) -> set[str]:
    """The variables of `environ` that hold a key: every provider's own, those a team names with api_key_env,
    any whose name says it holds a secret, and any holding a URL with a password in it."""
    return {
        name
        for name, value in environ.items()
        if PROVIDERS.key_owner(name) is not None
        or name in named
        or _SECRET_NAME.search(name)
        or _URL_PASSWORD.match(value.strip())
    }


def _refuse_secret(name: str, source: str) -> ConfigError:
    return ConfigError(
        f"{source}: ${{{name}}} holds a key, and a team file never expands a key "
        f"(it would travel as text, e.g. in a model name sent to a server); to give an agent a key, "
        f"write api_key_env: {name} "
        "(a provider's own key goes only to that provider's official endpoint)"
    )


def expand_env(value: Any, environ: Mapping[str, str], source: str, secrets: set[str] | None = None) -> Any:
    """Replace `${VAR}` and `${VAR:-default}` in every string of a loaded YAML tree.

    A variable in `secrets` (default: `secret_variables(environ)`), or whose value is one of theirs,
    is refused.
    """
    secrets = secret_variables(environ) if secrets is None else secrets
    if isinstance(value, str):
        held = {environ[name] for name in secrets if len(environ.get(name, "")) >= MIN_SECRET}

        def substitute(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in secrets or (name in environ and environ[name] in held):
                raise _refuse_secret(name, source)
            if name in environ:
                return environ[name]
            if default is not None:
                return default
            raise ConfigError(f"{source}: ${{{name}}} is not set; set {name} or write ${{{name}:-default}}")

        return _ENV_PATTERN.sub(substitute, value)
    if isinstance(value, list):
        return [expand_env(item, environ, source, secrets) for item in value]
    if isinstance(value, dict):
        return {key: expand_env(item, environ, source, secrets) for key, item in value.items()}
    return value


def _expand_agents(data: dict[str, Any], environ: Mapping[str, str], source: str) -> dict[str, Any]:
    """`${VAR}` expanded in each agent's EXPANDABLE keys only; every other string is kept as written.

    api_key_env is expanded first, so that the variables the team names as keys are never expanded elsewhere.
    """
    agents = data.get("agents")
    if not isinstance(agents, list):
        return dict(data)
    secrets = secret_variables(environ)
    agents = [
        {**agent, "api_key_env": expand_env(agent["api_key_env"], environ, source, secrets)}
        if isinstance(agent, dict) and "api_key_env" in agent
        else agent
        for agent in agents
    ]
    named = {str(agent.get("api_key_env")) for agent in agents if isinstance(agent, dict)}
    secrets = secret_variables(environ, named)
    expanded = [
        {
            key: expand_env(value, environ, source, secrets)
            if key in EXPANDABLE and key != "api_key_env"
            else value
            for key, value in agent.items()
        }
        if isinstance(agent, dict)
        else agent
        for agent in agents
    ]
    return {**data, "agents": expanded}


def _members(annotation: Any) -> tuple[dict[str | None, type[BaseModel]], bool]:
    """The pydantic models a field's value may be, by the tag pydantic puts in an error's `loc` before a
    union member's keys, and whether such a tag follows: a union (`sandbox`: a `SandboxSpec` or `none`) is
    tagged by each member's name, a discriminated one (`agents`' items: api, cli) by its own tags; a
    field of one model has it under None."""
    if get_origin(annotation) is list:
        annotation = get_args(annotation)[0]
    if any(isinstance(item, Discriminator) for item in getattr(annotation, "__metadata__", ())):
        members: dict[str | None, type[BaseModel]] = {}
        for choice in get_args(get_args(annotation)[0]):
            model, *tags = get_args(choice)
            members.update({tag.tag: model for tag in tags if isinstance(tag, Tag)})
        return members, True
    choices = [arg for arg in get_args(annotation) if arg is not type(None)]
    models = [c for c in [annotation, *choices] if isinstance(c, type) and issubclass(c, BaseModel)]
    if get_origin(annotation) in (Union, UnionType) and len(choices) > 1:
        return {model.__name__: model for model in models}, True
    return ({None: models[0]} if models else {}), False


def _key_path(loc: tuple[int | str, ...]) -> tuple[tuple[int | str, ...], type[BaseModel] | None]:
    """`loc` without pydantic's union-member tags (`sandbox.SandboxSpec.network` -> `sandbox.network`,
    `agents.0.cli.model` -> `agents.0.model`), and the model whose key its last part is (None: unknown)."""
    path: list[int | str] = []
    current: type[BaseModel] | None = Team
    owner: type[BaseModel] | None = None
    members: dict[str | None, type[BaseModel]] = {}
    tag_next = False
    for part in loc:
        if isinstance(part, int):
            path.append(part)
            continue
        if tag_next:  # the union member pydantic tried
            current, tag_next = members.get(part), False
            continue
        path.append(part)
        owner = current
        field = current.model_fields.get(part) if current is not None else None
        members, tag_next = _members(field.annotation) if field is not None else ({}, False)
        current = members.get(None)
    return tuple(path), owner


def _union_noise(error: Mapping[str, Any]) -> bool:
    """The `Literal` branch of a union (`sandbox: none`) rejecting a mapping meant for the other branch."""
    return (
        error["type"] == "literal_error"
        and isinstance(error.get("input"), dict)
        and str(error["loc"][-1]).startswith("literal[")  # the member's tag: `sandbox.literal['none']`
    )


def _describe(error: Mapping[str, Any], source: str) -> str:
    loc, owner = _key_path(tuple(error["loc"]))
    where = ".".join(str(part) for part in loc) or "(top level)"
    if error["type"] == "extra_forbidden":
        key = str(loc[-1])
        valid = sorted(owner.model_fields) if owner else []
        near = difflib.get_close_matches(key, valid, n=1)
        hint = f"did you mean {near[0]!r}?" if near else f"valid keys: {', '.join(valid)}"
        return f"{source}: unknown key {where!r}; {hint}"
    return f"{source}: {where}: {error['msg']}"


def parse_team(data: Any, source: str, environ: Mapping[str, str] | None = None) -> Team:
    """Validate a loaded YAML tree as a Team; errors name the source, the key and the fix."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a team file must be a YAML mapping with at least `agents:`")
    env = os.environ if environ is None else environ
    data = _expand_agents(data, env, source)
    data.setdefault("name", Path(source).stem)
    try:
        return _logged_in_only(Team.model_validate(data), env, source)
    except ValidationError as exc:
        errors = [error for error in exc.errors() if not _union_noise(error)] or exc.errors()
        raise ConfigError("\n".join(_describe(error, source) for error in errors)) from exc


def _logged_in_only(team: Team, environ: Mapping[str, str], source: str) -> Team:
    """The team without its `if_logged_in` CLI members whose login is not found here (the subscriptions
    preset is resolved when it is loaded, from the login files and keys that exist)."""
    if not any(agent.if_logged_in for agent in team.agents):
        return team
    gone = {id(cli) for cli in team.clis if cli.if_logged_in and not cli.logged_in(environ)}
    kept = [agent for agent in team.agents if id(agent) not in gone]
    # logged in to none: the team stays whole, and its missing keys name the logins (Team.missing_keys)
    return team.model_copy(update={"agents": kept}) if kept else team


def load_team_file(path: Path, environ: Mapping[str, str] | None = None) -> Team:
    """Read and validate one team YAML file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the team file ({exc.strerror})") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: malformed YAML{where}: {getattr(exc, 'problem', exc)}") from exc
    return parse_team(data, str(path), environ)
