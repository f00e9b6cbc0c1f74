"""Each client's entry for `conclave install`, and where the client reads it: pure functions of the target,
the scope and the command. install.py says why each client gets what it gets (docs/clients.md too)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conclave.cli import TARGETS
from conclave.config.providers import PROVIDERS
from conclave.errors import ConfigError
from conclave.settings import setting_variables
from conclave.tools.catalog import TOOLS

# Codex asks before every tool that is not read-only (and ask_team reaches the providers: open world).
CODEX_APPROVED = tuple(tool.name for tool in TOOLS if tool.approvable)
# Codex starts MCP servers with a short list of variables; forward the ones the presets read.
# Every Conclave setting goes along too.
FORWARDED_ENV = (
    *PROVIDERS.forwarded_variables(),
    *setting_variables(),
    "XDG_STATE_HOME",
    "XDG_CONFIG_HOME",
)
# The variables Gemini CLI would strip (they look like secrets); listed in its `env`, it passes them on.
KEY_VARIABLES = tuple(name for name in FORWARDED_ENV if name.endswith("_API_KEY"))
# Tools return within 50 s (settings.MAX_WAIT_S), so Codex's 60 s default fits; say so explicitly.
# The stdio front answers the handshake at once; the rest loads behind it, a few seconds on a cold disk.
CODEX_TIMEOUTS = {"startup_timeout_sec": 30, "tool_timeout_sec": 60}


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


# `--http URL`: the client sends the server's token (app/tokens.py) from this variable, in its own syntax,
# so the token itself never lands in a file a repository may commit.
TOKEN_VARIABLE = "CONCLAVE_HTTP_TOKEN"
BEARER = {
    "claude-code": f"Bearer ${{{TOKEN_VARIABLE}}}",
    "gemini": f"Bearer ${{{TOKEN_VARIABLE}}}",
    "cursor": f"Bearer ${{env:{TOKEN_VARIABLE}}}",
    "vscode": f"Bearer ${{env:{TOKEN_VARIABLE}}}",
}


def http_entry(target: str, url: str, approvals: bool = True) -> tuple[str, dict[str, Any]]:
    """The top-level key and the entry of an HTTP registration, with the Authorization header."""
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--http {url!r} is not a URL: give the server's, e.g. http://127.0.0.1:8765/mcp")
    if target not in BEARER:
        raise ConfigError(
            f"install {target} --http is not supported: register the stdio server (leave out --http)"
        )
    headers = {"Authorization": BEARER[target]}
    if target == "gemini":
        entry = {"httpUrl": url, "headers": headers}
        return "mcpServers", {**entry, "trust": True} if approvals else entry
    if target == "cursor":
        return "mcpServers", {"url": url, "headers": headers}
    key = "servers" if target == "vscode" else "mcpServers"
    return key, {"type": "http", "url": url, "headers": headers}


def json_entry(
    target: str, command: list[str], approvals: bool = True, keys: tuple[str, ...] = ()
) -> tuple[str, dict[str, Any]]:
    """The top-level key and the server entry for the JSON clients (`keys`: Copilot CLI's env, the
    provider keys set now)."""
    entry: dict[str, Any] = {"command": command[0], "args": command[1:]}
    if target == "copilot":
        return "mcpServers", {
            "type": "local",
            **entry,
            "env": {name: f"${{{name}}}" for name in keys},
            "tools": ["*"],
        }
    if target == "gemini":
        entry["env"] = {name: f"${name}" for name in KEY_VARIABLES}
        return "mcpServers", {**entry, "trust": True} if approvals else entry
    if target == "vscode":
        return "servers", {"type": "stdio", **entry}
    if target == "claude-code":
        return "mcpServers", {"type": "stdio", **entry}
    return "mcpServers", entry


def codex_table(command: list[str], approvals: bool = True, url: str | None = None) -> dict[str, Any]:
    if url is not None:
        http_entry("claude-code", url)  # the same check of the URL
    table: dict[str, Any] = (
        {"url": url, "bearer_token_env_var": TOKEN_VARIABLE, **CODEX_TIMEOUTS}
        if url is not None
        else {"command": command[0], "args": command[1:], "env_vars": list(FORWARDED_ENV), **CODEX_TIMEOUTS}
    )
    if approvals:
        table["tools"] = {tool: {"approval_mode": "approve"} for tool in CODEX_APPROVED}
    return table
