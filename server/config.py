"""Team configuration: small pydantic models, YAML loading, `${ENV}` expansion and preset lookup."""

from __future__ import annotations

import difflib
import importlib
import os
import re
from collections.abc import Mapping
from importlib.resources import files
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from conclave.errors import ConfigError, MissingApiKey, TeamNotFound

PROVIDERS = ("openai", "anthropic", "gemini", "local")
KEY_VARIABLES: dict[str, tuple[str, ...]] = {
    "openai": ("OPENAI_API_KEY",),
    "anthropic": ("ANTHROPIC_API_KEY",),
    "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    "local": (),
}
# The order in which a default team is chosen when none is named (docs/ARCHITECTURE.md, "Teams").
DEFAULT_ORDER = ("frontier", "anthropic", "openai", "gemini")
FALLBACK_TEAM = "local"
MAX_AGENTS, MAX_ANSWERS = 16, 20
# Agents are lettered A to P (one per agent, at most MAX_AGENTS); an answer's label is its author's
# letter and revision, B2. The one pattern for both, everywhere a letter or label is read back.
LETTER = re.compile(r"[A-P]")
LABEL = re.compile(r"([A-P])([1-9][0-9]?)")


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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Price(_Strict):
    """US dollars per million tokens; used to report cost when known."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cached_input: float | None = Field(default=None, ge=0)


class AgentSpec(_Strict):
    """One team member: a `provider/model` string and how to call it."""

    model: Annotated[str, Field(description="provider/model, e.g. openai/gpt-5")]
    base_url: str | None = None
    api_key_env: str | None = None
    api_key_required: bool = True  # false for local servers (Ollama, vLLM) that take any key
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    seed: int | None = None
    system_prompt: str | None = None
    max_tokens: Annotated[int, Field(ge=16, le=200_000)] = 4096
    tool_mode: Literal["native", "json"] = "native"
    # single: one call per turn ends with a workflow decision (a tool call, or JSON in `json` mode).
    # split: the answer is plain text from a short prompt, the decision a separate short choice, or a
    # score by the model's own log-probabilities where the backend can (local); with files, single.
    turn: Literal["single", "split"] = "single"
    stream: bool = True
    timeout_s: Annotated[float, Field(gt=0, le=3600)] = 120.0
    max_attempts: Annotated[int, Field(ge=1, le=10)] = 4
    model_path: str | None = None
    price: Price | None = None

    @field_validator("model")
    @classmethod
    def _provider_model(cls, value: str) -> str:
        provider, _, name = value.partition("/")
        if provider not in PROVIDERS or not name:
            raise ValueError(
                f"model {value!r} must look like provider/model with provider one of "
                f"{', '.join(PROVIDERS)} (e.g. openai/gpt-5)"
            )
        return value

    @property
    def provider(self) -> str:
        return self.model.partition("/")[0]

    @property
    def model_name(self) -> str:
        return self.model.partition("/")[2]

    def key_variables(self) -> tuple[str, ...]:
        """The environment variables that may hold this agent's key, in order of preference."""
        return (self.api_key_env,) if self.api_key_env else KEY_VARIABLES[self.provider]

    def api_key(self, environ: Mapping[str, str]) -> str:
        """The key from the environment; raises MissingApiKey naming the variable to set."""
        variables = self.key_variables()
        if not variables:
            return "unused"
        for variable in variables:
            if environ.get(variable):
                return environ[variable]
        if not self.api_key_required:
            return "unused"
        raise MissingApiKey(variables[0], self.model)


class Coordination(_Strict):
    """How the team converges."""

    max_answers_per_agent: Annotated[int, Field(ge=1, le=MAX_ANSWERS)] = 3
    consensus: Literal["all_voted", "majority"] = "all_voted"
    final: Literal["present", "reuse"] = "present"
    timeout_s: Annotated[float, Field(gt=0, le=24 * 3600)] = 900.0
    max_tool_steps: Annotated[int, Field(ge=0, le=200)] = 8
    max_failed_turns: Annotated[int, Field(ge=1, le=20)] = 3


class Sandbox(_Strict):
    """The Docker confinement of agents' commands (sandbox/container.py)."""

    image: str = "conclave-sandbox"
    network: Literal["none", "bridge"] = "none"
    memory: str = "1g"
    cpus: Annotated[float, Field(gt=0, le=64)] = 1.0
    pids: Annotated[int, Field(ge=16, le=65536)] = 256


class Team(_Strict):
    """A named team of 1 to 16 agents."""

    name: str
    description: str = ""
    agents: Annotated[list[AgentSpec], Field(min_length=1, max_length=MAX_AGENTS)]
    coordination: Coordination = Coordination()
    sandbox: Sandbox | Literal["none"] = Sandbox()

    def missing_keys(self, environ: Mapping[str, str]) -> list[str]:
        """The variables to set before this team can run (empty when all keys are there)."""
        missing: list[str] = []
        for agent in self.agents:
            try:
                agent.api_key(environ)
            except MissingApiKey as exc:
                if exc.variable not in missing:
                    missing.append(exc.variable)
        return missing


_ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(value: Any, environ: Mapping[str, str], source: str) -> Any:
    """Replace `${VAR}` and `${VAR:-default}` in every string of a loaded YAML tree."""
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in environ:
                return environ[name]
            if default is not None:
                return default
            raise ConfigError(f"{source}: ${{{name}}} is not set; set {name} or write ${{{name}:-default}}")

        return _ENV_PATTERN.sub(substitute, value)
    if isinstance(value, list):
        return [expand_env(item, environ, source) for item in value]
    if isinstance(value, dict):
        return {key: expand_env(item, environ, source) for key, item in value.items()}
    return value


def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The pydantic model that owns the field at `loc` (for suggesting the nearest valid key)."""
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None or isinstance(part, int):
            continue
        field = current.model_fields.get(part)
        if field is None:
            return current
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return current


def _key_path(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """`loc` without pydantic's union-member tags (`sandbox.Sandbox.network` -> `sandbox.network`)."""
    path: list[int | str] = []
    current: type[BaseModel] | None = Team
    after_union = False
    for part in loc:
        if after_union:  # the tag naming the union member pydantic tried, e.g. `Sandbox`
            after_union = False
            continue
        path.append(part)
        if isinstance(part, int) or current is None:
            continue
        field = current.model_fields.get(part)
        if field is None:
            current = None
            continue
        annotation = field.annotation
        members = [arg for arg in getattr(annotation, "__args__", ()) if arg is not type(None)]
        after_union = get_origin(annotation) in (Union, UnionType) and len(members) > 1
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return tuple(path)


def _union_noise(error: Mapping[str, Any]) -> bool:
    """The `Literal` branch of a union (`sandbox: none`) rejecting a mapping meant for the other branch."""
    return error["type"] == "literal_error" and isinstance(error.get("input"), dict) and _key_path(
        tuple(error["loc"])
    ) != tuple(error["loc"])


def _describe(error: Mapping[str, Any], source: str) -> str:
    loc = _key_path(tuple(error["loc"]))
    where = ".".join(str(part) for part in loc) or "(top level)"
    if error["type"] == "extra_forbidden":
        key = str(loc[-1])
        owner = _model_at(Team, loc[:-1])
        valid = sorted(owner.model_fields) if owner else []
        near = difflib.get_close_matches(key, valid, n=1)
        hint = f"did you mean {near[0]!r}?" if near else f"valid keys: {', '.join(valid)}"
        return f"{source}: unknown key {where!r}; {hint}"
    return f"{source}: {where}: {error['msg']}"


def parse_team(data: Any, source: str, environ: Mapping[str, str] | None = None) -> Team:
    """Validate a loaded YAML tree as a Team; errors name the source, the key and the fix."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a team file must be a YAML mapping with at least `agents:`")
    data = expand_env(data, os.environ if environ is None else environ, source)
    data.setdefault("name", Path(source).stem)
    try:
        return Team.model_validate(data)
    except ValidationError as exc:
        errors = [error for error in exc.errors() if not _union_noise(error)] or exc.errors()
        raise ConfigError("\n".join(_describe(error, source) for error in errors)) from exc


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


def user_teams_dir(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME", "~")).expanduser() / ".config")
    return Path(base) / "conclave" / "teams"


def preset_paths(environ: Mapping[str, str]) -> dict[str, Path]:
    """Preset name -> file; a user's own teams shadow the shipped ones."""
    found: dict[str, Path] = {}
    for folder in (Path(str(configs_dir())), user_teams_dir(environ)):
        if folder.is_dir():
            for path in sorted(folder.glob("*.y*ml")):
                found[path.stem] = path
    return found


def resolve_team(name: str | None, environ: Mapping[str, str] | None = None) -> Team:
    """An explicit path, else a preset name; with no name, the first preset whose keys are all set."""
    env = os.environ if environ is None else environ
    presets = preset_paths(env)
    if name is None:
        for candidate in DEFAULT_ORDER:
            if candidate in presets:
                team = load_team_file(presets[candidate], env)
                if not team.missing_keys(env):
                    return team
        return load_team_file(presets[FALLBACK_TEAM], env) if FALLBACK_TEAM in presets else _no_team(presets)
    looks_like_path = name.endswith((".yaml", ".yml")) or os.sep in name
    if looks_like_path:
        path = Path(name).expanduser()
        if not path.is_file():
            raise TeamNotFound(f"team file {name!r} does not exist; give a YAML path or a preset name")
        return load_team_file(path, env)
    if name in presets:
        return load_team_file(presets[name], env)
    near = difflib.get_close_matches(name, list(presets), n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise TeamNotFound(
        f"team={name!r} is not a preset or a file; {hint}presets: {', '.join(sorted(presets)) or 'none'}"
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
