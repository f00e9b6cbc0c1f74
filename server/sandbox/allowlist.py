"""Which hosts a coding-agent CLI member may reach through its egress proxy (sandbox/egress.py).

A member's allowlist is its CLI's own hosts (`CLI_HOSTS`: the model API and the login refresh, as
docs/subscriptions.md lists them, checked against the pinned packages' code), plus the host of
the member's `base_url` when it names one, plus what the user adds: the team file's `sandbox.allow_hosts`
and the server's `CONCLAVE_EGRESS_ALLOW`. Everything else is denied. docs/subscriptions.md lists them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

from conclave.config.hosts import HostRule, parse_host_rule, url_rule
from conclave.errors import ConfigError

CliName = Literal["claude-code", "codex", "gemini", "copilot"]
CLIS: tuple[CliName, ...] = get_args(CliName)

# All on 443. Comments say what each host is for.
CLI_HOSTS: dict[CliName, tuple[str, ...]] = {
    "claude-code": (
        "api.anthropic.com",  # the Messages API, with a key or a Claude plan
        "platform.claude.com",  # OAuth token refresh for a Claude plan login
    ),
    "codex": (
        "api.openai.com",  # the Responses API with an OpenAI key
        "chatgpt.com",  # the Responses API through a ChatGPT plan (chatgpt.com/backend-api/codex)
        "auth.openai.com",  # token refresh for a ChatGPT login
    ),
    "gemini": (
        "generativelanguage.googleapis.com",  # the Gemini API with a key
        "cloudcode-pa.googleapis.com",  # the Gemini API through a Google login (Code Assist)
        "oauth2.googleapis.com",  # token refresh for a Google login
    ),
    "copilot": (
        "api.githubcopilot.com",  # the Copilot model API
        "*.githubcopilot.com",  # its per-plan endpoints (api.individual., api.business., ...)
        "api.github.com",  # the user's Copilot plan (copilot_internal/user names its model host)
    ),
}


@dataclass(frozen=True)
class Allowlist:
    """The host:port pairs one member's proxy admits; nothing else."""

    rules: tuple[HostRule, ...]

    def admits(self, host: str, port: int) -> bool:
        return any(rule.admits(host, port) for rule in self.rules)

    def __str__(self) -> str:
        return ", ".join(str(rule) for rule in self.rules) or "(nothing)"


def allowlist_for(
    cli: CliName | None,
    *,
    base_url: str | None = None,
    extra: Iterable[str] = (),
) -> Allowlist:
    """`cli`'s own hosts (none for `None`), the `base_url`'s host and port, and each `extra` rule.

    `extra` holds rules as users write them (config/hosts.py); a bad one is a `ConfigError` naming it.
    """
    if cli is not None and cli not in CLI_HOSTS:
        raise ConfigError(f"no egress allowlist for CLI {cli!r}: it is one of {', '.join(CLIS)}")
    rules = [parse_host_rule(host) for host in CLI_HOSTS[cli]] if cli else []
    if base_url:
        try:
            rules.append(url_rule(base_url))
        except ValueError as exc:
            raise ConfigError(f"base_url: {exc}") from exc
    for text in extra:
        try:
            rules.append(parse_host_rule(text))
        except ValueError as exc:
            raise ConfigError(f"allow_hosts / CONCLAVE_EGRESS_ALLOW: {exc}") from exc
    return Allowlist(tuple(dict.fromkeys(rules)))
