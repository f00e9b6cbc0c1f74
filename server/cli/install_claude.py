"""Claude Code's tool approvals in `conclave install`: put them where this Claude Code reads them headless.

`claude -p` refuses a tool nobody allowed, so install writes `permissions.allow` for Conclave's tools. In
project scope they go in `.claude/settings.local.json` (personal, git-ignored), with `enabledMcpjsonServers`
so the project's `.mcp.json` server starts. Claude Code 2.1.197, what `npm install` resolves on Node 20,
ignores that file's `permissions.allow` until the workspace has been trusted in the interactive dialog
(in a folder that is not a git repository, or when the file is tracked or a link), and `-p` never shows
the dialog: it refused ask_team. 2.1.330 honours the file.

So when `claude --version` reports a version older than 2.1.330, or no `claude` answers, the allow list
goes to the user's settings instead (~/.claude/settings.json), which no workspace trust gates; the
project's file keeps `enabledMcpjsonServers`, which it honours. It allows
Conclave's tools by name in every project and starts nothing: a server still has to be registered and
enabled where it runs. The other route Claude Code names, `projects[DIR].hasTrustDialogAccepted` in
~/.claude.json, would trust everything in the folder (its hooks and settings too), and that file is
Claude Code's own state, rewritten while it runs; install leaves it alone (docs/clients.md).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conclave.cli.client_files import merge_settings
from conclave.tools.catalog import tool_names

NAME = "conclave"
# The oldest version seen honouring a project's own permissions in `-p` mode in an untrusted folder.
HONOURS_PROJECT_PERMISSIONS = (2, 1, 330)
Version = tuple[int, int, int]
Lists = dict[tuple[str, ...], list[str]]  # a settings list, by its path of keys, and the items it must hold
_VERSION = re.compile(r"\s*(\d+)\.(\d+)\.(\d+)")


def installed_version(environ: Mapping[str, str]) -> Version | None:
    """The version `claude --version` reports on `environ`'s PATH (None: no claude, or no answer)."""
    # Absolute folders only: an empty or relative PATH entry would find a `claude` the project planted.
    folders = [folder for folder in environ.get("PATH", "").split(os.pathsep) if os.path.isabs(folder)]
    found = shutil.which("claude", path=os.pathsep.join(folders))
    if found is None:
        return None
    try:
        done = subprocess.run(
            [found, "--version"],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
            env=dict(environ),
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    match = _VERSION.match(done.stdout)
    return (int(match[1]), int(match[2]), int(match[3])) if match and done.returncode == 0 else None


def gates_project_permissions(version: Version | None) -> bool:
    """Whether this Claude Code may ignore the project's allow list headless (unknown: assume it may)."""
    return version is None or version < HONOURS_PROJECT_PERMISSIONS


def version_text(version: Version) -> str:
    return "Claude Code " + ".".join(map(str, version))


def claude_settings(scope: str) -> Lists:
    """The lists Claude Code's settings need to hold so that `claude -p` may call the tools."""
    settings: Lists = {("permissions", "allow"): [f"mcp__{NAME}__{tool}" for tool in tool_names()]}
    if scope == "project":
        settings[("enabledMcpjsonServers",)] = [NAME]
    return settings


def nested(lists: Mapping[tuple[str, ...], list[str]]) -> dict[str, Any]:
    """The settings object holding `lists`, for the snippet to paste by hand."""
    out: dict[str, Any] = {}
    for path, items in lists.items():
        holder = out
        for part in path[:-1]:
            holder = holder.setdefault(part, {})
        holder[path[-1]] = list(items)
    return out


@dataclass(frozen=True)
class ApprovalFile:
    path: Path
    root: Path | None  # the project folder (no link followed below it); None: the user's own file
    what: str
    lists: Lists


def approval_files(scope: str, cwd: Path, home: Path, version: Version | None) -> list[ApprovalFile]:
    """Each settings file that should hold the approvals, for this scope and this Claude Code."""
    user = home / ".claude" / "settings.json"
    if scope != "project":
        return [ApprovalFile(user, None, "tool approvals", claude_settings("user"))]
    local = cwd / ".claude" / "settings.local.json"
    if not gates_project_permissions(version):
        return [ApprovalFile(local, cwd, "tool approvals", claude_settings("project"))]
    why = (
        "no `claude` on PATH said its version, and versions before 2.1.330 ignore"
        if version is None
        else f"{version_text(version)} ignores"
    )
    what = f"tool approvals at user scope: {why} the project's until the folder is trusted interactively"
    # The project keeps what starts its server; an allow list there would only be dropped, with a warning
    # on every run.
    server: Lists = {("enabledMcpjsonServers",): [NAME]}
    return [
        ApprovalFile(local, cwd, "project MCP server enabled", server),
        ApprovalFile(user, None, what, claude_settings("user")),
    ]


def merged(path: Path, before: str | None, lists: Mapping[tuple[str, ...], list[str]]) -> tuple[str, str]:
    """The file's text with `lists` merged in, and the snippet to paste by hand."""
    return merge_settings(before, path, lists), json.dumps(nested(lists), indent=2) + "\n"
