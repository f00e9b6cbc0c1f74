"""`conclave install TARGET`: register the server with a coding agent, in that client's format and place.

    plan(target, scope, ...) -> Plan      pure: the files to change, their text before and after
    describe(plan) -> str                 what would change, with the snippet in the client's format
    write(plan) -> list[str]              the one step that touches the disk: backup, then atomic write

Merging keeps everything already there: other servers, other keys, and (TOML) comments outside our
own table. A second run finds nothing to change and says so (tests/test_installers.py).

The registered command is the absolute path of the installed `conclave` script: `uvx --from
conclave-mcp conclave serve` would need the package on PyPI, and a bare `conclave` needs it on the
PATH the client was started with (GUI editors often have a shorter one).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conclave.config import package_dir
from conclave.errors import ConfigError

TARGETS = ("claude-code", "codex", "cursor", "vscode")
SCOPES = ("project", "user")
CLIENT_NAMES = {"claude-code": "Claude Code", "codex": "Codex", "cursor": "Cursor", "vscode": "VS Code"}
DEFAULT_SCOPE = {"claude-code": "project", "codex": "user", "cursor": "project", "vscode": "project"}
NAME = "conclave"
# Codex starts MCP servers with a short list of variables; forward the ones the presets read.
# tests/test_installers.py::test_codex_forwards_every_key_a_preset_needs keeps this in step.
FORWARDED_ENV = (
    "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY", "OPENROUTER_API_KEY",
    "OLLAMA_API_KEY", "OLLAMA_BASE_URL", "OLLAMA_MODEL", "VLLM_API_KEY", "VLLM_BASE_URL", "VLLM_MODEL",
    "CONCLAVE_HOME", "CONCLAVE_MAX_JOBS", "XDG_STATE_HOME", "XDG_CONFIG_HOME",
)
# Tools return within 50 s (tools/_deps.MAX_WAIT_S), so Codex's 60 s default fits; say so explicitly.
# Start-up imports the provider SDKs: a few seconds, more than Codex's 10 s default on a cold disk.
CODEX_TIMEOUTS = {"startup_timeout_sec": 30, "tool_timeout_sec": 60}


@dataclass(frozen=True)
class Change:
    """One file: its text now (None: absent) and the text it should have."""

    path: Path
    before: str | None
    after: str
    what: str  # "MCP registration" or "skill"

    @property
    def needed(self) -> bool:
        return self.before != self.after


@dataclass(frozen=True)
class Plan:
    target: str
    scope: str
    command: tuple[str, ...]
    changes: tuple[Change, ...]
    snippet: str  # the registration in the client's own format, to paste by hand
    hints: tuple[str, ...] = ()


def server_command(argv0: str | None = None, executable: str | None = None) -> list[str]:
    """The absolute command that starts this installation's server, without relying on PATH."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    executable = sys.executable if executable is None else executable
    if Path(argv0).stem == NAME and Path(argv0).is_file():
        return [os.path.abspath(argv0), "serve"]
    beside = Path(executable).parent / (NAME + (".exe" if os.name == "nt" else ""))
    if beside.is_file():  # the console script of the interpreter running us (not resolved: venvs)
        return [str(beside), "serve"]
    return [executable, "-m", NAME, "serve"]


def config_path(target: str, scope: str, cwd: Path, home: Path, environ: Mapping[str, str]) -> Path | None:
    """Where `target` reads its MCP servers for `scope` (None: Claude Code's user scope, via its CLI)."""
    project = scope == "project"
    match target:
        case "claude-code":
            return cwd / ".mcp.json" if project else None
        case "codex":
            codex_home = Path(environ["CODEX_HOME"]) if environ.get("CODEX_HOME") else home / ".codex"
            return (cwd / ".codex" if project else codex_home) / "config.toml"
        case "cursor":
            return (cwd if project else home) / ".cursor" / "mcp.json"
        case "vscode":
            return cwd / ".vscode" / "mcp.json" if project else _vscode_user_dir(home, environ) / "mcp.json"
    raise ConfigError(f"unknown install target {target!r}; choose one of {', '.join(TARGETS)}")


def _vscode_user_dir(home: Path, environ: Mapping[str, str]) -> Path:
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / "Code" / "User"
    if os.name == "nt":
        return Path(environ.get("APPDATA", home / "AppData" / "Roaming")) / "Code" / "User"
    return Path(environ.get("XDG_CONFIG_HOME") or home / ".config") / "Code" / "User"


def json_entry(target: str, command: list[str]) -> tuple[str, dict[str, Any]]:
    """The top-level key and the server entry for the JSON clients."""
    entry: dict[str, Any] = {"command": command[0], "args": command[1:]}
    if target == "vscode":
        return "servers", {"type": "stdio", **entry}
    if target == "claude-code":
        return "mcpServers", {"type": "stdio", **entry}
    return "mcpServers", entry


def codex_table(command: list[str]) -> dict[str, Any]:
    return {"command": command[0], "args": command[1:], "env_vars": list(FORWARDED_ENV), **CODEX_TIMEOUTS}


def _merged(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """Our keys over the user's, keeping the user's other keys and any variables they forward."""
    merged = {**existing, **desired}
    if isinstance(existing.get("env_vars"), list) and "env_vars" in desired:
        theirs = existing["env_vars"]
        merged["env_vars"] = theirs + [name for name in desired["env_vars"] if name not in theirs]
    return merged


def merge_json(text: str | None, path: Path, key: str, entry: dict[str, Any]) -> str:
    """`text` with `entry` as server `conclave` under `key`; `text` itself when nothing changes."""
    try:
        data = json.loads(text) if text and text.strip() else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path} is not plain JSON ({exc.msg} at line {exc.lineno}; comments?): nothing was written. "
            f"Add the entry shown by `conclave install` (without --write) by hand."
        ) from exc
    servers = data.get(key, {}) if isinstance(data, dict) else None
    if not isinstance(servers, dict) or not isinstance(servers.get(NAME, {}), dict):
        raise ConfigError(f"{path}: expected a JSON object with an object under {key!r}; fix the file")
    existing = servers.get(NAME)
    merged = _merged(existing or {}, entry)
    if existing == merged and text is not None:
        return text
    data[key] = {**servers, NAME: merged}
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


# TOML -------------------------------------------------------------------------------------------
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_OUR_KEY = r"""\s*mcp_servers\s*\.\s*(?:conclave|"conclave"|'conclave')\s*"""
_OUR_HEADER = re.compile(rf"^\s*\[{_OUR_KEY}\]")
_OUR_SUBTABLE = re.compile(rf"^\s*\[\[?{_OUR_KEY}\.")
_ANY_HEADER = re.compile(r"^\s*\[")


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON's escapes are valid in TOML basic strings
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise ConfigError(f"cannot write the TOML value {value!r}; edit the file by hand")


def toml_table(name: str, table: Mapping[str, Any]) -> str:
    """`[name]` with its plain keys, then its sub-tables as `[name.key]`."""
    lines = [f"[{name}]"]
    for key, value in table.items():
        if isinstance(value, dict):
            continue
        shown = _toml_value(value)
        if isinstance(value, list) and len(shown) > 80:  # one item a line, as people write them
            shown = "[\n" + "".join(f"  {_toml_value(item)},\n" for item in value) + "]"
        lines.append(f"{_toml_key(key)} = {shown}")
    text = "\n".join(lines) + "\n"
    for key, value in table.items():
        if isinstance(value, dict):
            text += "\n" + toml_table(f"{name}.{_toml_key(key)}", value)
    return text


def _our_spans(lines: list[str]) -> list[tuple[int, int]]:
    """Line ranges of `[mcp_servers.conclave]` and its sub-tables, without trailing blanks/comments
    (those belong to whatever follows)."""
    spans: list[tuple[int, int]] = []
    for start, line in enumerate(lines):
        if not (_OUR_HEADER.match(line) or _OUR_SUBTABLE.match(line)):
            continue
        end = start + 1
        while end < len(lines) and not _ANY_HEADER.match(lines[end]):
            end += 1
        while end > start + 1 and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")):
            end -= 1
        spans.append((start, end))
    return spans


def merge_codex_toml(text: str | None, path: Path, table: dict[str, Any]) -> str:
    """`text` with `[mcp_servers.conclave]` set to `table` merged over what is there; comments kept."""
    text = text or ""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML ({exc}): nothing was written; fix it first") from exc
    existing = data.get("mcp_servers", {}).get(NAME)
    merged = _merged(existing or {}, table)
    if existing == merged:
        return text
    block = toml_table(f"mcp_servers.{NAME}", merged)
    lines = text.splitlines(keepends=True)
    spans = _our_spans(lines)
    if existing is None:
        result = text.rstrip("\n") + ("\n\n" if text.strip() else "") + block
    elif spans:
        first = spans[0][0]  # the block goes where the table was; lines before it are untouched
        kept = [line for i, line in enumerate(lines) if not any(s <= i < e for s, e in spans)]
        result = "".join(kept[:first]) + block + "".join(kept[first:])
    else:
        result = ""  # defined inline or with dotted keys: not ours to rewrite, see below
    try:
        after = tomllib.loads(result)
    except tomllib.TOMLDecodeError:
        after = {}
    # The safety net: our table is what we meant, and everything else in the file is as it was.
    if after.get("mcp_servers", {}).get(NAME) != merged or _without_ours(after) != _without_ours(data):
        raise ConfigError(
            f"{path}: could not update mcp_servers.{NAME} in place (is it written inline?); nothing was "
            f"written. Replace it by hand with:\n{block}"
        )
    return result


def _without_ours(data: Mapping[str, Any]) -> dict[str, Any]:
    servers = {key: value for key, value in data.get("mcp_servers", {}).items() if key != NAME}
    return {**data, "mcp_servers": servers}


# Plans ------------------------------------------------------------------------------------------
def _read(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None


def plan(
    target: str, scope: str | None, *, cwd: Path, home: Path, environ: Mapping[str, str], command: list[str]
) -> Plan:
    """What `conclave install target` would change; reads files, writes nothing."""
    if target not in TARGETS:
        raise ConfigError(f"unknown install target {target!r}; choose one of {', '.join(TARGETS)}")
    scope = scope or DEFAULT_SCOPE[target]
    path = config_path(target, scope, cwd, home, environ)
    changes: list[Change] = []
    hints: list[str] = []
    if target == "codex":
        table = codex_table(command)
        snippet = toml_table(f"mcp_servers.{NAME}", table)
        assert path is not None
        after = merge_codex_toml(_read(path), path, table)
        changes.append(Change(path, _read(path), after, "MCP registration"))
    else:
        key, entry = json_entry(target, command)
        snippet = json.dumps({key: {NAME: entry}}, indent=2) + "\n"
        if path is not None:
            after = merge_json(_read(path), path, key, entry)
            changes.append(Change(path, _read(path), after, "MCP registration"))
    if target == "claude-code":
        claude = ["claude", "mcp", "add", "--scope", scope, NAME, "--", *command]
        hints.append(("or register it with Claude Code's own CLI: " if path else "register it with: ")
                     + shlex.join(claude))
        skill = (cwd if scope == "project" else home) / ".claude" / "skills" / NAME / "SKILL.md"
        source = (package_dir("conclave.skills") / NAME / "SKILL.md").read_text(encoding="utf-8")
        changes.append(Change(skill, _read(skill), source, "skill"))
    return Plan(target, scope, tuple(command), tuple(changes), snippet, tuple(hints))


def describe(plan: Plan) -> str:
    """What `install` would do, for the printing (no --write) mode."""
    out = [f"conclave install {plan.target} ({plan.scope} scope); server command: {shlex.join(plan.command)}"]
    for change in plan.changes:
        state = "already up to date" if not change.needed else (
            "would be created" if change.before is None else "would be updated")
        out.append(f"\n{change.path}: {change.what}, {state}")
        if change.what == "MCP registration":
            out.append(plan.snippet.rstrip("\n"))
    out += ["", *plan.hints] if plan.hints else []
    if any(change.needed for change in plan.changes):
        out.append("\nRun again with --write to write this (a backup of every changed file is kept).")
    return "\n".join(out)


def _backup_path(path: Path, stamp: str) -> Path:
    candidate, n = path.with_name(f"{path.name}.{stamp}.bak"), 1
    while candidate.exists():
        candidate, n = path.with_name(f"{path.name}.{stamp}-{n}.bak"), n + 1
    return candidate


def write(plan: Plan, stamp: str | None = None) -> list[str]:
    """Apply the plan: each changed file is backed up, then replaced atomically. Returns what happened."""
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    said: list[str] = []
    for change in plan.changes:
        if not change.needed:
            said.append(f"{change.path}: already up to date, nothing changed")
            continue
        change.path.parent.mkdir(parents=True, exist_ok=True)
        backup = None
        if change.path.exists():
            backup = _backup_path(change.path, stamp)
            backup.write_bytes(change.path.read_bytes())
        temporary = change.path.with_name(f".{change.path.name}.conclave-tmp")
        temporary.write_text(change.after, encoding="utf-8")
        if change.path.exists():
            os.chmod(temporary, change.path.stat().st_mode & 0o7777)
        os.replace(temporary, change.path)
        said.append(f"wrote {change.path} ({change.what})" + (f"; backup at {backup}" if backup else ""))
    return said


def install(
    target: str,
    scope: str | None,
    *,
    write_files: bool,
    cwd: Path | None = None,
    home: Path | None = None,
    environ: Mapping[str, str] | None = None,
    out: Callable[[str], None] = print,
) -> int:
    """The `conclave install` command: print the plan, or write it. Returns the exit code."""
    made = plan(
        target, scope, cwd=cwd or Path.cwd(), home=home or Path.home(),
        environ=os.environ if environ is None else environ, command=server_command(),
    )
    if not write_files:
        out(describe(made))
        return 0
    for line in write(made):
        out(line)
    if not any(change.what == "MCP registration" for change in made.changes):
        for hint in made.hints:  # the registration is the client's own command's to make
            out(hint)
    client = CLIENT_NAMES[made.target]
    if not any(change.needed for change in made.changes):
        out(f"Nothing changed: {client} already has {NAME} set up here.")
    else:
        out(f"Done. Restart {client} (or reload its MCP servers) to pick up {NAME}.")
    return 0
