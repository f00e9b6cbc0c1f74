"""Where a team file may send data: whose file it is, and what the user allowed for files not their own.

A team file's origin is decided once, from its real path (config/presets.py `TeamFile`):

    shipped   Conclave's own presets
    user      the user's team folder (~/.config/conclave/teams): the user wrote it
    project   any other path: a repository's `conclave.yaml`, a file named on the command line, a folder
              listed in CONCLAVE_TEAM_DIRS (listing lets callers name its files, not send keys from them)

A shipped or user file pairs a variable with a URL of its own as it likes. A project file may do so only
where the user's settings say that variable may go there (CONCLAVE_KEY_DESTINATIONS), and its
`sandbox.allow_hosts` may only repeat hosts the user opened for every team (CONCLAVE_EGRESS_ALLOW): a
repository cannot send the server's tokens, logins or database URL to a server of its choosing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from conclave.config.hosts import HostRule, parse_host_rule, url_rule
from conclave.config.models import Team
from conclave.errors import ConfigError, UntrustedDestination

_SHAPE = (
    "write VARIABLE=host, VARIABLE=host:port or VARIABLE=host:* (any port), "
    "e.g. MY_PROXY_KEY=llm.internal:8443"
)


class Origin(enum.Enum):
    """Who wrote a team file, by where it lies."""

    SHIPPED = "shipped"
    USER = "user"
    PROJECT = "project"


@dataclass(frozen=True)
class KeyDestination:
    """One entry of CONCLAVE_KEY_DESTINATIONS: `variable` may be sent to `host` (on `port`; None: any)."""

    variable: str
    host: str
    port: int | None

    def admits(self, variable: str, target: HostRule) -> bool:
        """Whether `variable` may go to `target` (a base_url's host and port)."""
        port = target.port if self.port is None else self.port
        return variable == self.variable and HostRule(self.host, port).admits(target.host, target.port)


def parse_key_destination(text: str) -> KeyDestination:
    """`MY_PROXY_KEY=llm.internal:8443`, `MY_PROXY_KEY=127.0.0.1:*`...; else a ValueError naming the shape."""
    variable, sep, target = text.strip().partition("=")
    variable = variable.strip()
    if not sep or not variable or not variable.replace("_", "").isalnum():
        raise ValueError(f"{text!r} is not a key destination: {_SHAPE}")
    target = target.strip()
    if target.endswith(":*"):
        return KeyDestination(variable, parse_host_rule(target[:-2]).host, None)
    rule = parse_host_rule(target)
    return KeyDestination(variable, rule.host, rule.port)


@dataclass(frozen=True)
class Allowed:
    """What the user's settings let a project's team file widen: variables to URLs, hosts for members."""

    keys: tuple[KeyDestination, ...] = ()
    hosts: tuple[HostRule, ...] = ()

    @classmethod
    def of(cls, key_destinations: tuple[str, ...], egress_allow: tuple[str, ...]) -> Allowed:
        """From the settings CONCLAVE_KEY_DESTINATIONS and CONCLAVE_EGRESS_ALLOW (validated there)."""
        return cls(
            tuple(parse_key_destination(entry) for entry in key_destinations),
            tuple(parse_host_rule(entry) for entry in egress_allow),
        )

    def sends(self, variable: str, target: HostRule) -> bool:
        return any(entry.admits(variable, target) for entry in self.keys)


NOTHING_ALLOWED = Allowed()  # no settings: a project's team file sends no variable and opens no host


def check_destinations(team: Team, origin: Origin, source: str, allowed: Allowed, own_folder: Path) -> None:
    """Refuse a project's team file that sends a variable to its own URL, or opens a host to its members,
    beyond what `allowed` says; the error names the field, the value and both ways to allow it."""
    if origin is not Origin.PROJECT:
        return
    for index, agent in enumerate(team.agents):
        variable, url = agent.api_key_env, agent.base_url
        if variable is None or url is None or not agent.custom_endpoint:
            continue
        try:
            rule = url_rule(url)
        except ValueError as exc:
            raise ConfigError(f"{source}: agents[{index}].base_url: {exc}") from exc
        if allowed.sends(variable, rule):
            continue
        host = f"[{rule.host}]" if ":" in rule.host else rule.host
        raise UntrustedDestination(
            f"{source}: agents[{index}].api_key_env {variable!r} with base_url {url!r}: this team file is "
            f"not in your team folder ({own_folder}), so it may not send a variable to a URL of its own (a "
            f"repository may have written it to collect your keys). To allow it, move the file into "
            f"{own_folder}, or set CONCLAVE_KEY_DESTINATIONS={variable}={host}:{rule.port} "
            "(entries separated by ',')"
        )
    if isinstance(team.sandbox, str):
        return
    for index, entry in enumerate(team.sandbox.allow_hosts):
        rule = parse_host_rule(entry)
        if rule in allowed.hosts:
            continue
        raise UntrustedDestination(
            f"{source}: sandbox.allow_hosts[{index}] {entry!r}: this team file is not in your team folder "
            f"({own_folder}), so it may not open a host of its own to its members. To allow it, move the "
            f"file into {own_folder}, or set CONCLAVE_EGRESS_ALLOW={rule} (every team's "
            "members may then reach it)"
        )
