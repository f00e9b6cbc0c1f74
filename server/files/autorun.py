"""Files that run code on their own or widen a coding agent's permissions: the one table of them.

Such a file acts without anyone running it: VS Code runs a task with `runOn: folderOpen` when the folder
opens, direnv runs `.envrc` on `cd`, Claude Code runs its hooks and starts the MCP servers `.mcp.json`
registers, npm runs `postinstall`, CI runs a workflow on push, and the caller's own agent takes wider
permissions from its settings. In a long patch a reviewer misses them, and the caller's agent acts on them
next, so apply holds them back unless the call names `allow_autorun` (review.py), and the result names
each with why (docs/apply-and-verify.md).

A rule is a folded posix pattern (folding.py: letter case and the spellings case-insensitive filesystems
fold onto it) matched at any depth, since a sub-folder can be opened, entered or installed on its own:
`*` matches within a name, a trailing `/**` matches everything under a folder. A rule with a `changed`
test holds a file back only when that test says the change can run something (a `package.json` whose
lifecycle scripts changed, a `pyproject.toml` whose build system changed); the test gets the file's
bytes before and after (None: absent) and, when it cannot read them, holds the file back.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from conclave.files.folding import folded_parts

AutorunKind = Literal[
    "editor",
    "direnv",
    "agent_settings",
    "agent_instructions",
    "mcp",
    "install_script",
    "interpreter_startup",
    "ci",
    "git_hooks",
]
# npm (and yarn, pnpm) run these on their own during `npm install` of the project or of a git dependency.
NPM_LIFECYCLE = frozenset(
    {
        "preinstall",
        "install",
        "postinstall",
        "prepublish",
        "preprepare",
        "prepare",
        "postprepare",
        "prepack",
        "postpack",
        "dependencies",
    }
)


class Autorun(BaseModel):
    """Why a changed file can run code or widen an agent's permissions on its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: AutorunKind
    why: str


Changed = Callable[[bytes | None, bytes | None], bool]


@dataclass(frozen=True)
class AutorunRule:
    pattern: str
    kind: AutorunKind
    why: str
    changed: Changed | None = None  # None: every change counts


def _json(data: bytes) -> Any:
    return json.loads(data.decode("utf-8-sig"))  # npm strips a BOM


def _npm_scripts(data: bytes | None) -> dict[str, object]:
    manifest = {} if data is None else _json(data)
    scripts = manifest.get("scripts") if isinstance(manifest, dict) else None
    return {k: v for k, v in scripts.items() if k in NPM_LIFECYCLE} if isinstance(scripts, dict) else {}


def npm_lifecycle_changed(old: bytes | None, new: bytes | None) -> bool:
    """A lifecycle script added or changed (removing one runs nothing new); unreadable JSON counts."""
    try:
        after = _npm_scripts(new)
    except ValueError:
        return True  # npm's parser may read what ours cannot: hold it back
    try:
        before = _npm_scripts(old)
    except ValueError:
        before = {}
    return any(before.get(name) != script for name, script in after.items())


def _build_system(data: bytes | None) -> object:
    return None if data is None else tomllib.loads(data.decode("utf-8")).get("build-system")


def build_system_changed(old: bytes | None, new: bytes | None) -> bool:
    """`[build-system]` added or changed (its backend runs on `pip install`); unreadable TOML counts."""
    if new is None:
        return False
    try:
        after = _build_system(new)
    except (ValueError, tomllib.TOMLDecodeError):
        return True
    try:
        before = _build_system(old)
    except (ValueError, tomllib.TOMLDecodeError):
        before = None
    return after is not None and after != before


_VSCODE = "VS Code"
_CLAUDE = (
    "Claude Code's project settings, hooks, commands, agents and skills: hooks run shell commands on their "
    "own, and permissions there (Bash(*), Write(*), ...) let your agent act without asking"
)
_INSTRUCTIONS = "instructions your coding agent loads on its own at the start of every session, and follows"
_MCP = "registers MCP servers: commands your coding agent starts on its own when it opens the folder"
_CI = "a CI pipeline: it runs on the CI service, with the repository's secrets, when pushed"
_HOOKS = "git hooks: they run on your next commit or push"
_MISE = "mise runs its enter hooks and env scripts when you enter the folder"
_JETBRAINS = "JetBrains run configurations: commands your IDE runs"

RULES: tuple[AutorunRule, ...] = (
    # editors
    AutorunRule(
        ".vscode/tasks.json",
        "editor",
        f"{_VSCODE} runs its tasks with runOn: folderOpen when the folder opens",
    ),
    AutorunRule(
        ".vscode/settings.json",
        "editor",
        f"{_VSCODE} settings name programs it runs for you (interpreters, linters, formatters, git, the "
        "terminal's environment)",
    ),
    AutorunRule(
        ".vscode/launch.json", "editor", f"{_VSCODE} runs these and their preLaunchTask when you debug"
    ),
    AutorunRule(".vscode/mcp.json", "mcp", f"{_VSCODE}: {_MCP}"),
    AutorunRule(
        "*.code-workspace", "editor", f"a {_VSCODE} workspace: its settings and tasks run like .vscode's"
    ),
    AutorunRule(
        ".devcontainer/**",
        "editor",
        "a dev container: VS Code and Codespaces run its initializeCommand (on your machine) and "
        "postCreateCommand when the folder opens in it",
    ),
    AutorunRule(".idea/runconfigurations/**", "editor", _JETBRAINS),
    AutorunRule(".idea/workspace.xml", "editor", "JetBrains workspace: run configurations and startup tasks"),
    AutorunRule(".run/**", "editor", _JETBRAINS),
    # direnv and environment files
    AutorunRule(".envrc", "direnv", "direnv runs it as shell code when you enter the folder"),
    AutorunRule(
        ".env",
        "direnv",
        "environment variables that direnv (load_dotenv), VS Code's Python extension and dotenv loaders set "
        "for you: NODE_OPTIONS, PYTHONSTARTUP or LD_PRELOAD there run code",
    ),
    AutorunRule("mise.toml", "direnv", _MISE),
    AutorunRule(".mise.toml", "direnv", _MISE),
    AutorunRule("mise.local.toml", "direnv", _MISE),
    # coding agents: settings, hooks, MCP registrations, standing instructions
    AutorunRule(".claude/**", "agent_settings", _CLAUDE),
    AutorunRule(".mcp.json", "mcp", f"Claude Code, Copilot CLI and others: {_MCP}"),
    AutorunRule(
        ".cursor/**", "agent_settings", f"Cursor's rules, settings and mcp.json: {_MCP}; its rules steer it"
    ),
    AutorunRule(
        ".codex/**", "agent_settings", "Codex's project config: MCP servers, approval and sandbox settings"
    ),
    AutorunRule(
        ".gemini/**", "agent_settings", "Gemini CLI's project settings: MCP servers, tools allowed unasked"
    ),
    AutorunRule(".roo/**", "agent_settings", f"Roo Code's rules and mcp.json: {_MCP}"),
    AutorunRule(".kiro/**", "agent_settings", f"Kiro's steering and settings/mcp.json: {_MCP}"),
    AutorunRule(".windsurf/**", "agent_settings", "Windsurf's rules and workflows for its agent"),
    AutorunRule(".amazonq/**", "agent_settings", f"Amazon Q's rules and mcp.json: {_MCP}"),
    AutorunRule(".continue/**", "agent_settings", f"Continue's config and MCP servers: {_MCP}"),
    AutorunRule(
        "opencode.json", "agent_settings", "opencode's config: MCP servers, commands and permissions"
    ),
    AutorunRule(
        ".aider.conf.yml", "agent_settings", "aider's config: its lint-cmd and test-cmd run after each edit"
    ),
    AutorunRule("claude.md", "agent_instructions", f"CLAUDE.md: {_INSTRUCTIONS}"),
    AutorunRule("claude.local.md", "agent_instructions", f"CLAUDE.local.md: {_INSTRUCTIONS}"),
    AutorunRule(
        "agents.md", "agent_instructions", f"AGENTS.md (Codex, Copilot, Cursor, ...): {_INSTRUCTIONS}"
    ),
    AutorunRule("gemini.md", "agent_instructions", f"GEMINI.md: {_INSTRUCTIONS}"),
    AutorunRule(".github/copilot-instructions.md", "agent_instructions", f"GitHub Copilot: {_INSTRUCTIONS}"),
    AutorunRule(".github/instructions/**", "agent_instructions", f"GitHub Copilot: {_INSTRUCTIONS}"),
    AutorunRule(".cursorrules", "agent_instructions", f"Cursor: {_INSTRUCTIONS}"),
    AutorunRule(".clinerules", "agent_instructions", f"Cline: {_INSTRUCTIONS}"),
    # package managers and build backends
    AutorunRule(
        "package.json",
        "install_script",
        "npm runs its lifecycle scripts (preinstall, install, postinstall, prepare, ...) on its own at "
        "`npm install`",
        npm_lifecycle_changed,
    ),
    AutorunRule(
        "binding.gyp", "install_script", "npm builds it with node-gyp at `npm install`: its actions run"
    ),
    AutorunRule(
        ".npmrc", "install_script", "npm settings: node-options, script-shell or a registry there run code"
    ),
    AutorunRule(
        ".yarnrc.yml", "install_script", "Yarn settings: yarnPath and plugins there run on every yarn command"
    ),
    AutorunRule(".yarnrc", "install_script", "Yarn settings: yarn-path there runs on every yarn command"),
    AutorunRule(
        ".yarn/releases/**", "install_script", "the Yarn release yarnPath runs on every yarn command"
    ),
    AutorunRule(".yarn/plugins/**", "install_script", "Yarn plugins: they run on every yarn command"),
    AutorunRule(".pnpmfile.cjs", "install_script", "pnpm runs its hooks on every `pnpm install`"),
    AutorunRule("setup.py", "install_script", "pip runs it on `pip install .` and `pip install -e .`"),
    AutorunRule(
        "pyproject.toml",
        "install_script",
        "its [build-system] names the backend pip runs on `pip install .` (backend-path: from the project)",
        build_system_changed,
    ),
    # Python's own start-up: a venv's site-packages is part of a project folder when it is not ignored
    AutorunRule(
        "site-packages/*.pth", "interpreter_startup", "Python runs its `import` lines at every start"
    ),
    AutorunRule(
        "sitecustomize.py", "interpreter_startup", "Python imports it at every start when on its path"
    ),
    AutorunRule(
        "usercustomize.py", "interpreter_startup", "Python imports it at every start when on its path"
    ),
    # CI
    AutorunRule(".github/workflows/**", "ci", _CI),
    AutorunRule(".github/actions/**", "ci", f"{_CI} (actions the workflows call)"),
    AutorunRule(".gitlab-ci.yml", "ci", _CI),
    AutorunRule(".gitlab/ci/**", "ci", _CI),
    AutorunRule(".circleci/**", "ci", _CI),
    AutorunRule(".travis.yml", "ci", _CI),
    AutorunRule("azure-pipelines.yml", "ci", _CI),
    AutorunRule("jenkinsfile", "ci", _CI),
    AutorunRule(".buildkite/**", "ci", _CI),
    AutorunRule("bitbucket-pipelines.yml", "ci", _CI),
    AutorunRule(".drone.yml", "ci", _CI),
    AutorunRule(".woodpecker.yml", "ci", _CI),
    AutorunRule(".woodpecker/**", "ci", _CI),
    AutorunRule("appveyor.yml", "ci", _CI),
    AutorunRule(".appveyor.yml", "ci", _CI),
    AutorunRule(".cirrus.yml", "ci", _CI),
    AutorunRule("cloudbuild.yaml", "ci", _CI),
    # git hooks
    AutorunRule(".pre-commit-config.yaml", "git_hooks", f"pre-commit's {_HOOKS}"),
    AutorunRule(".husky/**", "git_hooks", f"husky's {_HOOKS} (npm install sets them up)"),
    AutorunRule("lefthook.yml", "git_hooks", f"lefthook's {_HOOKS}"),
    AutorunRule(".lefthook.yml", "git_hooks", f"lefthook's {_HOOKS}"),
    AutorunRule("lefthook-local.yml", "git_hooks", f"lefthook's {_HOOKS}"),
    AutorunRule(".githooks/**", "git_hooks", f"{_HOOKS} (with core.hooksPath)"),
)


def _matches(parts: list[str], pattern: str) -> bool:
    """`pattern` matches `parts` at any depth: a whole tail, or a folder prefix with `/**`."""
    wanted = pattern.split("/")
    under = wanted[-1] == "**"
    if under:
        wanted = wanted[:-1]
    for start in range(len(parts) - len(wanted) + 1):
        window = parts[start : start + len(wanted)]
        rest = len(parts) - start - len(wanted)
        if (rest > 0 if under else rest == 0) and all(map(fnmatchcase, window, wanted)):
            return True
    return False


def classify(rel: str, old: bytes | None, new: bytes | None) -> Autorun | None:
    """Why changing `rel` from `old` to `new` (None: absent) can run code or widen an agent's
    permissions on its own, or None."""
    parts = folded_parts(rel)
    for rule in RULES:
        if _matches(parts, rule.pattern) and (rule.changed is None or rule.changed(old, new)):
            return Autorun(kind=rule.kind, why=rule.why)
    return None
