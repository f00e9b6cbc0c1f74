"""The coding-agent CLIs a team may name as members (`cli/claude-code[:MODEL]`), and how to tell that the
user is logged in to one: its login file under the user's home, or its key variable.

These are facts about the CLIs, not about a job (the members package runs them): the subscriptions
preset keeps only the members whose login is found (`logged_in`), and `conclave doctor` and
`list_teams` say which are installed and logged in. The file locations are the CLIs' own
(docs/subscriptions.md lists them).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CliFacts:
    """One CLI: its name in a team file, its npm package, its login files and key variables."""

    name: str
    package: str
    # Login files relative to the CLI's config folder; `config_env` moves that folder, `config_dir` is its
    # default under the user's home.
    config_env: str
    config_dir: str
    login_files: tuple[str, ...]
    key_variables: tuple[str, ...]
    hosts: tuple[str, ...]  # the provider's hosts its login and model calls reach (docs/subscriptions.md)
    binary: str = ""  # its command, when not its name
    # A key a login file must hold to be a login: Copilot CLI writes its config.json on any first run, and
    # keeps the token there (`authTokens`) only when its sign-in may not use a keychain.
    login_key: str = ""
    # Where its login file keeps its tokens, by the file's format: each a path of JSON keys, every string
    # under it a secret. Nothing else in the file is one: a member may rewrite the file inside its
    # container, and what it writes must not decide what is withheld from its peers (clis/cli_adapter.py).
    secret_fields: tuple[tuple[str, ...], ...] = ()

    @property
    def program(self) -> str:
        return self.binary or self.name


CLIS: dict[str, CliFacts] = {
    "claude-code": CliFacts(
        "claude-code",
        "@anthropic-ai/claude-code",
        "CLAUDE_CONFIG_DIR",
        ".claude",
        (".credentials.json",),
        ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"),
        ("api.anthropic.com", "platform.claude.com"),
        "claude",
        secret_fields=(("claudeAiOauth", "accessToken"), ("claudeAiOauth", "refreshToken")),
    ),
    "codex": CliFacts(
        "codex",
        "@openai/codex",
        "CODEX_HOME",
        ".codex",
        ("auth.json",),
        ("CODEX_API_KEY", "OPENAI_API_KEY"),
        ("api.openai.com", "chatgpt.com", "auth.openai.com"),
        secret_fields=(
            ("OPENAI_API_KEY",),
            ("tokens", "id_token"),
            ("tokens", "access_token"),
            ("tokens", "refresh_token"),
        ),
    ),
    "gemini": CliFacts(
        "gemini",
        "@google/gemini-cli",
        "GEMINI_CLI_HOME",
        ".gemini",
        ("oauth_creds.json",),
        ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
        ("generativelanguage.googleapis.com", "cloudcode-pa.googleapis.com", "oauth2.googleapis.com"),
        secret_fields=(("access_token",), ("refresh_token",), ("id_token",)),
    ),
    "copilot": CliFacts(
        "copilot",
        "@github/copilot",
        "COPILOT_HOME",
        ".copilot",
        ("config.json",),
        ("COPILOT_GITHUB_TOKEN", "GH_TOKEN", "GITHUB_TOKEN"),
        ("api.githubcopilot.com", "api.github.com"),
        login_key="authTokens",
        secret_fields=(("authTokens",),),
    ),
}
MAX_CONFIG_FILE = 256 * 1024  # a login file is a few KB


def split_cli_model(name: str) -> tuple[str, str | None]:
    """`claude-code:opus` -> ("claude-code", "opus"); no model -> the CLI's own default (None)."""
    cli, _, model = name.partition(":")
    return cli, model or None


def config_folder(facts: CliFacts, environ: Mapping[str, str]) -> Path:
    """The CLI's config folder on this machine (its variable, else under the user's home)."""
    moved = environ.get(facts.config_env)
    if moved:
        return Path(moved).expanduser()
    return Path(environ.get("HOME") or Path.home()).expanduser() / facts.config_dir


def login_files(facts: CliFacts, environ: Mapping[str, str]) -> list[Path]:
    """The CLI's login files that exist here (regular files only: never a link someone planted) and,
    for a CLI with a `login_key`, hold it."""
    folder = config_folder(facts, environ)
    return [
        folder / name
        for name in facts.login_files
        if (folder / name).is_file()
        and not (folder / name).is_symlink()
        and (not facts.login_key or _settings(folder / name).get(facts.login_key))
    ]


def keychain_user(facts: CliFacts, environ: Mapping[str, str]) -> str | None:
    """The account a CLI says it is signed in to while its login file holds no token: Copilot CLI's
    config.json names its user (`lastLoggedInUser`) and keeps the token in the system keychain."""
    if not facts.login_key:
        return None
    for name in facts.login_files:
        settings = _settings(config_folder(facts, environ) / name)
        user = settings.get("lastLoggedInUser")
        if not settings.get(facts.login_key) and isinstance(user, dict) and user.get("login"):
            return str(user["login"])
    return None


def _settings(path: Path) -> dict[str, object]:
    """A CLI's JSON settings file; {} when it is missing, a link, too big or not JSON."""
    try:
        if path.is_symlink() or path.stat().st_size > MAX_CONFIG_FILE:
            return {}
        return parse_settings(path.read_bytes())
    except OSError:
        return {}


def parse_settings(content: bytes) -> dict[str, object]:
    """A CLI's JSON settings or login file, its `//` comment lines skipped (Copilot CLI heads its
    config.json with two); {} when it is not a JSON object."""
    try:
        lines = content.decode("utf-8").splitlines()
        found = json.loads("\n".join(line for line in lines if not line.lstrip().startswith("//")))
    except (UnicodeDecodeError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def secret_fields(path: str) -> tuple[tuple[str, ...], ...]:
    """Where login file `path` (relative to HOME: `.claude/.credentials.json`) keeps its tokens."""
    for facts in CLIS.values():
        if path in {f"{facts.config_dir}/{name}" for name in facts.login_files}:
            return facts.secret_fields
    return ()


def login_source(facts: CliFacts, environ: Mapping[str, str]) -> str | None:
    """How the user is logged in to this CLI (`ANTHROPIC_API_KEY`, `~/.claude/.credentials.json`), or None."""
    for variable in facts.key_variables:
        if environ.get(variable):
            return variable
    files = login_files(facts, environ)
    return str(files[0]) if files else None


def login_fix(facts: CliFacts, environ: Mapping[str, str] | None = None) -> str:
    """How to log in so that Conclave finds the login. Logins kept in a system keychain are not read
    (docs/subscriptions.md says why): Claude Code on macOS keeps its plan login in the Keychain, so
    there the way in is a long-lived plan token from `claude setup-token` in CLAUDE_CODE_OAUTH_TOKEN;
    Copilot CLI keeps its sign-in in the keychain where it has one, so a token variable is the way in
    (with `environ`, the message names the account signed in there)."""
    if facts.name == "claude-code" and sys.platform == "darwin":
        return (
            "on macOS Claude Code keeps its login in the Keychain, which Conclave does not read: run "
            "`claude setup-token` and set CLAUDE_CODE_OAUTH_TOKEN to the token it prints (your Claude plan), "
            "or set ANTHROPIC_API_KEY"
        )
    if facts.name == "copilot":
        user = keychain_user(facts, environ) if environ is not None else None
        where = f"you are signed in to Copilot CLI as {user}, but it" if user else "Copilot CLI"
        return (
            f"{where} keeps its sign-in in the system keychain, which cannot go into a container: set "
            "COPILOT_GITHUB_TOKEN to a fine-grained token with only the Copilot Requests permission, or "
            'export COPILOT_GITHUB_TOKEN="$(gh auth token)" (GitHub CLI\'s token, with all its scopes); '
            "or `copilot login` with storeTokenPlaintext set, so that it keeps the token in "
            f"~/{facts.config_dir}/{facts.login_files[0]}"
        )
    return (
        f"run {facts.program} once and sign in "
        f"(it keeps its login in ~/{facts.config_dir}/{facts.login_files[0]}), "
        f"or set {' or '.join(facts.key_variables)}"
    )
