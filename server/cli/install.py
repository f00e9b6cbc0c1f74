"""`conclave install TARGET`: register the server with a coding agent, and let its headless mode call it.

    plan(target, scope, ...) -> Plan      pure: the files to change, their text before and after
    describe(plan) -> str                 what would change, with each snippet in the client's format
    write(plan) -> list[str]              the one step that touches the disk: backup, then atomic write

What each client gets, and why (docs/clients.md says the same to users):
- Codex: `[mcp_servers.conclave]` in config.toml, and `approval_mode = "approve"` for `ask_team`,
  `cancel_job` and `steer_job` (Codex asks before a tool that is not read-only unless it is non-destructive
  and
  closed-world, and `codex exec` never approves, so without it a headless run cannot delegate).
- Claude Code: `.mcp.json` (project) or `claude mcp add` (user), the skill, and in its settings
  (`.claude/settings.local.json`, or `~/.claude/settings.json` for user scope) `permissions.allow`
  for the six tools (`claude -p` refuses a tool nobody allowed) and, for project scope,
  `enabledMcpjsonServers` (so the project's server starts without the interactive trust prompt). A
  Claude Code older than 2.1.330 (or none found) gets the allow list at user scope too
  (install_claude.py: it ignores the project's until the folder is trusted).
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

Merging keeps everything already there but our own entry: other servers, other keys, comments (TOML
through tomlkit; JSON with comments through conclave.cli.jsonc). Our `conclave` entry is replaced
wholesale, and what that removes is named, in the dry run too. A second run finds nothing to change and
says so.

A project's files may be a stranger's (a cloned repository), so the write never follows a link: the target
file must not be a symlink, no folder between the project and it may be one, and every file we make (the
temporary copy, the backup) is created with O_EXCL|O_NOFOLLOW in the target's folder, through that
folder's descriptor; a backup keeps the original's mode.

The registered command is the absolute path of the installed `conclave` script: `uvx --from
conclave-mcp conclave serve` would need the package on PyPI, and a bare `conclave` needs it on the
PATH the client was started with (GUI editors often have a shorter one). Run by `uvx`, whose
environment lives in uv's cache and goes with `uv cache clean`, it is uv's absolute path with
`tool run --from` what the environment was made from (the wheel, folder, commit or release).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from conclave.cli import EXIT_OK, TARGETS
from conclave.cli.client_files import (
    codex_snippet,
    dropped,
    existing_codex_table,
    existing_entry,
    merge_codex_toml,
    merge_json,
)
from conclave.cli.copilot_hints import copilot_hints
from conclave.cli.install_claude import Version, approval_files, installed_version, merged
from conclave.cli.install_entries import (
    BEARER,
    KEY_VARIABLES,
    TOKEN_VARIABLE,
    codex_table,
    config_path,
    http_entry,
    json_entry,
)
from conclave.errors import ConfigError

CLIENT_NAMES = {
    "claude-code": "Claude Code",
    "codex": "Codex",
    "cursor": "Cursor",
    "vscode": "VS Code",
    "gemini": "Gemini CLI",
    "copilot": "Copilot CLI",
}
# Gemini CLI reads a project's settings only in a folder the user trusted, so user scope by default;
# Copilot CLI's own file (with the keys' `env`) is user-wide.
DEFAULT_SCOPE = {
    "claude-code": "project",
    "codex": "user",
    "cursor": "project",
    "vscode": "project",
    "gemini": "user",
    "copilot": "user",
}
NAME = "conclave"
DISTRIBUTION = "conclave-mcp"


@dataclass(frozen=True)
class Change:
    """One file: its text now (None: absent) and the text it should have."""

    path: Path
    before: str | None
    after: str
    what: str  # "MCP registration", "MCP registration and tool approvals", "tool approvals", "skill"
    snippet: str = ""  # what we put there, in the file's format, to paste by hand
    removed: tuple[str, ...] = ()  # what replacing our entry drops from the one there (dotted keys)
    root: Path | None = None  # the project folder: no link may be followed below it (None: user scope)

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


def server_command() -> list[str]:
    """The absolute command that starts this installation's server, without relying on PATH: read from
    this process (its argv[0], its interpreter, uv's `UV` variable)."""
    argv0, executable = sys.argv[0], sys.executable
    uvx = _uvx_command(executable, os.environ)
    if uvx is not None:
        return uvx
    if Path(argv0).stem == NAME and Path(argv0).is_file():
        return [os.path.abspath(argv0), "serve"]
    beside = Path(executable).parent / (NAME + (".exe" if os.name == "nt" else ""))
    if beside.is_file():  # the console script of the interpreter running us (not resolved: venvs)
        return [str(beside), "serve"]
    return [executable, "-m", NAME, "serve"]


def _uvx_command(executable: str, environ: Mapping[str, str]) -> list[str] | None:
    """Under `uvx` (an environment in uv's cache, which `uv cache clean` deletes), the command that makes
    it again: `uv tool run --from <what it came from> conclave serve`; None elsewhere. uv names itself
    to the processes it starts in `UV`."""
    uv = environ.get("UV", "")
    if not uv or not Path(uv).is_file():
        return None
    try:
        asked = subprocess.run([uv, "cache", "dir"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    cache = asked.stdout.strip()
    if not cache or not Path(executable).parent.resolve().is_relative_to(Path(cache).resolve()):
        return None  # `uv run` or `uv tool install`: an environment that stays
    return [uv, "tool", "run", "--from", _installed_from(), NAME, "serve"]


def _installed_from() -> str:
    """What this distribution was installed from: its wheel, folder or commit (PEP 610's direct_url.json),
    else its release on the index."""
    dist = importlib.metadata.distribution(DISTRIBUTION)
    recorded = dist.read_text("direct_url.json")
    if not recorded:
        return f"{DISTRIBUTION}=={dist.version}"
    direct = json.loads(recorded)
    url = str(direct.get("url", ""))
    vcs = direct.get("vcs_info")
    if isinstance(vcs, dict):
        return f"{vcs.get('vcs', 'git')}+{url}@{vcs.get('commit_id', '')}"
    if url.startswith("file:"):
        return url2pathname(urlparse(url).path)
    return url


# Plans ------------------------------------------------------------------------------------------
def _read(path: Path) -> str | None:
    """The file's text (None: absent); a symlink is refused, never read or written through."""
    if path.is_symlink():
        raise ConfigError(
            f"{path} is a symlink (to {os.readlink(path)}); conclave install never reads or writes through a "
            "link, which a cloned repository could aim anywhere. Replace it with a regular file, or add the "
            "entry by hand (run without --write to see it)"
        )
    return path.read_bytes().decode("utf-8") if path.is_file() else None  # as written: \r\n kept


def plan(
    target: str,
    scope: str | None,
    *,
    cwd: Path,
    home: Path,
    environ: Mapping[str, str],
    command: list[str],
    approvals: bool = True,
    http: str | None = None,
    claude_version: Version | None = None,
) -> Plan:
    """What `conclave install target` would change; reads files, writes nothing. With `http` (the URL of a
    running `conclave serve --http`), an HTTP registration sending the token from CONCLAVE_HTTP_TOKEN.
    `claude_version`: what `claude --version` said (None: unknown; install_claude.py says what differs)."""
    if target not in TARGETS:
        raise ConfigError(f"unknown install target {target!r}; choose one of {', '.join(TARGETS)}")
    scope = scope or DEFAULT_SCOPE[target]
    path = config_path(target, scope, cwd, home, environ)
    root = cwd if scope == "project" else None
    changes: list[Change] = []
    hints: list[str] = []
    keys = tuple(name for name in KEY_VARIABLES if environ.get(name))
    if target == "codex":
        assert path is not None
        table = codex_table(command, approvals, http)
        what = "MCP registration and tool approvals" if approvals else "MCP registration"
        before = _read(path)
        after = merge_codex_toml(before, path, table)
        removed = dropped(existing_codex_table(before), table, f"mcp_servers.{NAME}")
        changes.append(Change(path, before, after, what, codex_snippet(table), tuple(removed), root))
    else:
        shared = target == "copilot" and scope == "project"  # Claude Code's .mcp.json: its entry, no env
        key, entry = (
            http_entry(target, http, approvals)
            if http
            else json_entry("claude-code" if shared else target, command, approvals, keys)
        )
        if path is not None:
            before = _read(path)
            after = merge_json(before, path, key, entry)
            removed = dropped(existing_entry(before, path, key), entry, f"{key}.{NAME}")
            snippet = json.dumps({key: {NAME: entry}}, indent=2) + "\n"
            what = "MCP registration and tool approvals" if entry.get("trust") else "MCP registration"
            changes.append(Change(path, before, after, what, snippet, tuple(removed), root))
    if target == "claude-code":
        claude = (
            [
                "claude",
                "mcp",
                "add",
                "--transport",
                "http",
                "--scope",
                scope,
                NAME,
                http,
                "--header",
                f"Authorization: {BEARER[target]}",
            ]
            if http
            else ["claude", "mcp", "add", "--scope", scope, NAME, "--", *command]
        )
        hints.append(
            ("or register it with Claude Code's own CLI: " if path else "register it with: ")
            + shlex.join(claude)
        )
        for file in approval_files(scope, cwd, home, claude_version) if approvals else []:
            before = _read(file.path)
            after, snippet = merged(file.path, before, file.lists)
            changes.append(Change(file.path, before, after, file.what, snippet, root=file.root))
        changes.append(_skill_change(cwd if scope == "project" else home, root))
    if http:
        hints.append(
            f"{CLIENT_NAMES[target]} sends the token from {TOKEN_VARIABLE}: set it where it runs, e.g. "
            f'export {TOKEN_VARIABLE}=$(cat "${{CONCLAVE_HOME:-$HOME/.local/state/conclave}}/http-token") '
            "(the token `conclave serve --http` printed)"
        )
    if target == "copilot":
        hints += copilot_hints(scope, keys)
    return Plan(target, scope, (http,) if http else tuple(command), tuple(changes), tuple(hints))


def _skill_change(folder: Path, root: Path | None) -> Change:
    from conclave.config.presets import package_dir

    skill = folder / ".claude" / "skills" / NAME / "SKILL.md"
    source = (package_dir("conclave.skills") / NAME / "SKILL.md").read_text(encoding="utf-8")
    return Change(skill, _read(skill), source, "skill", root=root)


def describe(plan: Plan) -> str:
    """What `install` would do, for the printing (no --write) mode."""
    server = (
        f"server: {plan.command[0]}"
        if plan.command[0].startswith("http")
        else f"server command: {shlex.join(plan.command)}"
    )
    out = [f"conclave install {plan.target} ({plan.scope} scope); {server}"]
    for change in plan.changes:
        state = (
            "already up to date"
            if not change.needed
            else ("would be created" if change.before is None else "would be updated")
        )
        out.append(f"\n{change.path}: {change.what}, {state}")
        if change.snippet:
            out.append(change.snippet.rstrip("\n"))
        if change.removed:
            out.append(_removed_text(change, "would replace"))
    out += ["", *plan.hints] if plan.hints else []
    if any("approvals" in change.what for change in plan.changes):
        out.append(
            f"\nThe tool approvals let {CLIENT_NAMES[plan.target]}'s non-interactive mode call {NAME}; "
            f"--no-approvals leaves them out."
        )
    if any(change.needed for change in plan.changes):
        out.append("\nRun again with --write to write this (a backup of every changed file is kept).")
    return "\n".join(out)


def _removed_text(change: Change, verb: str) -> str:
    return (
        f"({verb} the {NAME} entry there wholesale; removed from it: {'; '.join(change.removed)}. "
        "Add back by hand what you need)"
    )


def write(plan: Plan, stamp: str | None = None) -> list[str]:
    """Apply the plan: each changed file is backed up, then replaced atomically. Returns what happened."""
    from conclave.cli.install_files import write_file

    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    said: list[str] = []
    for change in plan.changes:
        if not change.needed:
            said.append(f"{change.path}: already up to date, nothing changed")
            continue
        backup = write_file(change.path, change.before, change.after, stamp, change.root)
        said.append(f"wrote {change.path} ({change.what})" + (f"; backup at {backup}" if backup else ""))
        if change.removed:
            said.append(_removed_text(change, "replaced"))
    return said


def install(
    target: str,
    scope: str | None,
    *,
    write_files: bool,
    approvals: bool = True,
    http: str | None = None,
) -> int:
    """The `conclave install` command: print the plan, or write it. Returns the exit code."""
    version = installed_version(os.environ) if target == "claude-code" and approvals else None
    made = plan(
        target,
        scope,
        cwd=Path.cwd(),
        home=Path.home(),
        environ=os.environ,
        command=server_command(),
        approvals=approvals,
        http=http,
        claude_version=version,
    )
    if not write_files:
        print(describe(made))
        return EXIT_OK
    for line in write(made):
        print(line)
    # Claude Code's hint is an alternative registration (needed only when no file holds it); Copilot
    # CLI's say what no file can hold.
    if made.target == "copilot" or not any(
        change.what.startswith("MCP registration") for change in made.changes
    ):
        for hint in made.hints:
            print(hint)
    elif http:
        print(made.hints[-1])  # where the client gets the token
    client = CLIENT_NAMES[made.target]
    if not any(change.needed for change in made.changes):
        print(f"Nothing changed: {client} already has {NAME} set up here.")
    else:
        print(f"Done. Restart {client} (or reload its MCP servers) to pick up {NAME}.")
        if any("approvals" in change.what for change in made.changes):
            print("Its non-interactive mode may call the tools: approvals written (--no-approvals: none).")
    return EXIT_OK


def install_command(args: argparse.Namespace) -> int:
    return install(
        args.target, args.scope, write_files=args.write, approvals=not args.no_approvals, http=args.http
    )
