"""`conclave install TARGET`: register the server with a coding agent, and let its headless mode call it.

    plan(target, scope, ...) -> Plan      pure: the files to change, their text before and after
    describe(plan) -> str                 what would change, with each snippet in the client's format
    write(plan) -> list[str]              the one step that touches the disk: backup, then atomic write

What each client gets, and why (docs/clients.md says the same to users):
- Codex: `[mcp_servers.conclave]` in config.toml, and `approval_mode = "approve"` for `ask_team` and
  `cancel_job` (Codex asks before a tool that is not read-only unless it is non-destructive and
  closed-world, and `codex exec` never approves, so without it a headless run cannot delegate).
- Claude Code: `.mcp.json` (project) or `claude mcp add` (user), the skill, and in its settings
  (`.claude/settings.local.json`, or `~/.claude/settings.json` for user scope) `permissions.allow`
  for the five tools (`claude -p` refuses a tool nobody allowed) and, for project scope,
  `enabledMcpjsonServers` (so the project's server starts without the interactive trust prompt).
- Gemini CLI: `mcpServers.conclave` in its settings.json with `"trust": true`, its per-server switch
  for calling tools without a confirmation (`gemini -p` cannot confirm anything), and `env` naming the
  provider keys (`"OPENAI_API_KEY": "$OPENAI_API_KEY"`): Gemini CLI drops variables that look like
  secrets from a server's environment unless they are listed, and expands an unset one to "", which
  Conclave reads as missing.
- Copilot CLI: `mcpServers.conclave` in ~/.copilot/mcp-config.json (`"type": "local"`, `"tools": ["*"]`)
  with `env` listing the provider keys set when `install` runs: Copilot CLI strips variables that look
  like secrets from a server's environment, and passes an `env` entry of an unset variable on as set,
  which would make Conclave pick a team whose key is missing. Project scope: the `.mcp.json` Claude
  Code reads too, without `env` (Claude Code refuses an unset variable there). Its headless approvals
  (`--allow-tool=conclave`, `--trust-folder`) are command-line flags only, so they are printed.
- Cursor and VS Code: the registration only. Cursor's tool allowlist lives in the global
  ~/.cursor/permissions.json, which replaces the allowlist set in Cursor's UI wholesale, so writing
  it could drop the user's own entries; VS Code has no non-interactive mode and asks once per tool.
`--no-approvals` writes registrations only.

Merging keeps everything already there: other servers, other keys, comments (TOML through tomlkit;
JSON with comments through conclave.cli.jsonc). A second run finds nothing to change and says so
(tests/test_installers.py).

The registered command is the absolute path of the installed `conclave` script: `uvx --from
conclave-mcp conclave serve` would need the package on PyPI, and a bare `conclave` needs it on the
PATH the client was started with (GUI editors often have a shorter one).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conclave.cli import EXIT_OK, TARGETS
from conclave.cli.client_files import codex_snippet, merge_codex_toml, merge_json, merge_settings
from conclave.errors import ConfigError
from conclave.settings import setting_variables

CLIENT_NAMES = {"claude-code": "Claude Code", "codex": "Codex", "cursor": "Cursor", "vscode": "VS Code",
                "gemini": "Gemini CLI", "copilot": "Copilot CLI"}
# Gemini CLI reads a project's settings only in a folder the user trusted, so user scope by default;
# Copilot CLI's own file (with the keys' `env`) is user-wide.
DEFAULT_SCOPE = {"claude-code": "project", "codex": "user", "cursor": "project", "vscode": "project",
                 "gemini": "user", "copilot": "user"}
NAME = "conclave"
TOOLS = ("ask_team", "get_status", "read_workspace", "cancel_job", "list_teams")
# Codex asks before these (not read-only, and ask_team reaches the providers: open world).
CODEX_APPROVED = ("ask_team", "cancel_job")
# Codex starts MCP servers with a short list of variables; forward the ones the presets read.
# tests/test_installers.py::test_codex_forwards_every_key_a_preset_needs keeps this in step.
# Every Conclave setting goes along too (tests/test_installers.py::test_codex_forwards_every_setting).
FORWARDED_ENV = (
    "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY", "OPENROUTER_API_KEY",
    "OLLAMA_API_KEY", "OLLAMA_BASE_URL", "OLLAMA_MODEL", "VLLM_API_KEY", "VLLM_BASE_URL", "VLLM_MODEL",
    *setting_variables(), "XDG_STATE_HOME", "XDG_CONFIG_HOME",
)
# The variables Gemini CLI would strip (they look like secrets); listed in its `env`, it passes them on.
KEY_VARIABLES = tuple(name for name in FORWARDED_ENV if name.endswith("_API_KEY"))
# Tools return within 50 s (settings.MAX_WAIT_S), so Codex's 60 s default fits; say so explicitly.
# The stdio front answers the handshake at once; the rest loads behind it, a few seconds on a cold disk.
CODEX_TIMEOUTS = {"startup_timeout_sec": 30, "tool_timeout_sec": 60}


@dataclass(frozen=True)
class Change:
    """One file: its text now (None: absent) and the text it should have."""

    path: Path
    before: str | None
    after: str
    what: str  # "MCP registration", "MCP registration and tool approvals", "tool approvals", "skill"
    snippet: str = ""  # what we put there, in the file's format, to paste by hand

    @property
    def needed(self) -> bool:
        return self.before != self.after


@dataclass(frozen=True)
class Plan:
    target: str
    scope: str
    command: tuple[str, ...]
    changes: tuple[Change, ...]
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
        case "gemini":
            return (cwd if project else home) / ".gemini" / "settings.json"
        case "copilot":
            return cwd / ".mcp.json" if project else home / ".copilot" / "mcp-config.json"
    raise ConfigError(f"unknown install target {target!r}; choose one of {', '.join(TARGETS)}")


def _vscode_user_dir(home: Path, environ: Mapping[str, str]) -> Path:
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / "Code" / "User"
    if os.name == "nt":
        return Path(environ.get("APPDATA", home / "AppData" / "Roaming")) / "Code" / "User"
    return Path(environ.get("XDG_CONFIG_HOME") or home / ".config") / "Code" / "User"


def json_entry(
    target: str, command: list[str], approvals: bool = True, keys: tuple[str, ...] = ()
) -> tuple[str, dict[str, Any]]:
    """The top-level key and the server entry for the JSON clients (`keys`: Copilot CLI's env, the
    provider keys set now)."""
    entry: dict[str, Any] = {"command": command[0], "args": command[1:]}
    if target == "copilot":
        return "mcpServers", {"type": "local", **entry, "env": {name: f"${{{name}}}" for name in keys},
                              "tools": ["*"]}
    if target == "gemini":
        entry["env"] = {name: f"${name}" for name in KEY_VARIABLES}
        return "mcpServers", {**entry, "trust": True} if approvals else entry
    if target == "vscode":
        return "servers", {"type": "stdio", **entry}
    if target == "claude-code":
        return "mcpServers", {"type": "stdio", **entry}
    return "mcpServers", entry


def codex_table(command: list[str], approvals: bool = True) -> dict[str, Any]:
    table: dict[str, Any] = {"command": command[0], "args": command[1:], "env_vars": list(FORWARDED_ENV),
                             **CODEX_TIMEOUTS}
    if approvals:
        table["tools"] = {tool: {"approval_mode": "approve"} for tool in CODEX_APPROVED}
    return table


def claude_settings(scope: str) -> dict[tuple[str, ...], list[str]]:
    """The lists Claude Code's settings need to hold so that `claude -p` may call the tools."""
    settings = {("permissions", "allow"): [f"mcp__{NAME}__{tool}" for tool in TOOLS]}
    if scope == "project":
        settings[("enabledMcpjsonServers",)] = [NAME]
    return settings


def _nested(lists: Mapping[tuple[str, ...], list[str]]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for path, items in lists.items():
        holder = nested
        for part in path[:-1]:
            holder = holder.setdefault(part, {})
        holder[path[-1]] = list(items)
    return nested


# Plans ------------------------------------------------------------------------------------------
def _read(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None


def plan(
    target: str, scope: str | None, *, cwd: Path, home: Path, environ: Mapping[str, str], command: list[str],
    approvals: bool = True,
) -> Plan:
    """What `conclave install target` would change; reads files, writes nothing."""
    if target not in TARGETS:
        raise ConfigError(f"unknown install target {target!r}; choose one of {', '.join(TARGETS)}")
    scope = scope or DEFAULT_SCOPE[target]
    path = config_path(target, scope, cwd, home, environ)
    changes: list[Change] = []
    hints: list[str] = []
    keys = tuple(name for name in KEY_VARIABLES if environ.get(name))
    if target == "codex":
        assert path is not None
        table = codex_table(command, approvals)
        what = "MCP registration and tool approvals" if approvals else "MCP registration"
        after = merge_codex_toml(_read(path), path, table)
        changes.append(Change(path, _read(path), after, what, codex_snippet(table)))
    else:
        shared = target == "copilot" and scope == "project"  # Claude Code's .mcp.json: its entry, no env
        key, entry = json_entry("claude-code" if shared else target, command, approvals, keys)
        if path is not None:
            after = merge_json(_read(path), path, key, entry)
            snippet = json.dumps({key: {NAME: entry}}, indent=2) + "\n"
            what = "MCP registration and tool approvals" if entry.get("trust") else "MCP registration"
            changes.append(Change(path, _read(path), after, what, snippet))
    if target == "claude-code":
        claude = ["claude", "mcp", "add", "--scope", scope, NAME, "--", *command]
        hints.append(("or register it with Claude Code's own CLI: " if path else "register it with: ")
                     + shlex.join(claude))
        if approvals:
            settings = (cwd / ".claude" / "settings.local.json" if scope == "project"
                        else home / ".claude" / "settings.json")
            wanted = claude_settings(scope)
            after = merge_settings(_read(settings), settings, wanted)
            changes.append(Change(settings, _read(settings), after, "tool approvals",
                                  json.dumps(_nested(wanted), indent=2) + "\n"))
        changes.append(_skill_change(cwd if scope == "project" else home))
    if target == "copilot":
        hints += copilot_hints(scope, keys)
    return Plan(target, scope, tuple(command), tuple(changes), tuple(hints))


def copilot_hints(scope: str, keys: tuple[str, ...]) -> list[str]:
    """What Copilot CLI needs that no file can hold: its headless approvals, and keys set later."""
    trust = " --trust-folder" if scope == "project" else ""
    hints = [f'Copilot CLI approves tools only on its command line: copilot -p "..." --allow-tool=conclave{trust}']
    if scope == "project":
        hints.append("Copilot CLI strips provider keys from a project server's environment: use --scope user "
                     "(~/.copilot/mcp-config.json lists the keys set when you install) for a team with keys")
    elif keys:
        hints.append(f"env passes on {', '.join(keys)}; run install again after setting another provider key")
    else:
        hints.append("no provider key is set, so Conclave could run only the `local` demo team: set a key "
                     "(e.g. ANTHROPIC_API_KEY), then run install again")
    return hints


def _skill_change(root: Path) -> Change:
    from conclave.config import package_dir

    skill = root / ".claude" / "skills" / NAME / "SKILL.md"
    source = (package_dir("conclave.skills") / NAME / "SKILL.md").read_text(encoding="utf-8")
    return Change(skill, _read(skill), source, "skill")


def describe(plan: Plan) -> str:
    """What `install` would do, for the printing (no --write) mode."""
    out = [f"conclave install {plan.target} ({plan.scope} scope); server command: {shlex.join(plan.command)}"]
    for change in plan.changes:
        state = "already up to date" if not change.needed else (
            "would be created" if change.before is None else "would be updated")
        out.append(f"\n{change.path}: {change.what}, {state}")
        if change.snippet:
            out.append(change.snippet.rstrip("\n"))
    out += ["", *plan.hints] if plan.hints else []
    if any("approvals" in change.what for change in plan.changes):
        out.append(f"\nThe tool approvals let {CLIENT_NAMES[plan.target]}'s non-interactive mode call {NAME}; "
                   f"--no-approvals leaves them out.")
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
    approvals: bool = True,
    cwd: Path | None = None,
    home: Path | None = None,
    environ: Mapping[str, str] | None = None,
    out: Callable[[str], None] = print,
) -> int:
    """The `conclave install` command: print the plan, or write it. Returns the exit code."""
    made = plan(
        target, scope, cwd=cwd or Path.cwd(), home=home or Path.home(),
        environ=os.environ if environ is None else environ, command=server_command(), approvals=approvals,
    )
    if not write_files:
        out(describe(made))
        return EXIT_OK
    for line in write(made):
        out(line)
    # Claude Code's hint is an alternative registration (needed only when no file holds it); Copilot
    # CLI's say what no file can hold.
    if made.target == "copilot" or not any(change.what.startswith("MCP registration") for change in made.changes):
        for hint in made.hints:
            out(hint)
    client = CLIENT_NAMES[made.target]
    if not any(change.needed for change in made.changes):
        out(f"Nothing changed: {client} already has {NAME} set up here.")
    else:
        out(f"Done. Restart {client} (or reload its MCP servers) to pick up {NAME}.")
        if any("approvals" in change.what for change in made.changes):
            out("Its non-interactive mode may call the tools: approvals written (--no-approvals: none).")
    return EXIT_OK


def install_command(args: argparse.Namespace) -> int:
    return install(args.target, args.scope, write_files=args.write, approvals=not args.no_approvals)
