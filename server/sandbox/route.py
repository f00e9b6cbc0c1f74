"""How a CLI member's egress reaches a host its allowlist admitted, and which extra CA it trusts there.

The egress proxy (sandbox/egress.py) decides *whether* a member may reach a host (its allowlist); its
route decides *how*: where the connection goes and which roots, besides the system's, the proxy and the
member's container trust on the way. The route acts only after the allowlist admitted a request, so it
never widens what a member may reach.

`DirectRoute()` resolves the host name and trusts the system's roots alone. A route with
`extra_ca` has that PEM file trusted too: the proxy loads it for the providers it calls itself (a key
login, sandbox/provider_key.py), and the member's container gets it read-only at `CA_PATH` with the
variables that make each CLI add it to its roots (sandbox/member.py), e.g. the CA of a TLS-inspecting
corporate proxy (CONCLAVE_EGRESS_CA). The route is decided once, with what every job shares
(jobs/environment.py `JobEnvironment`), and handed down to each member's proxy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = ["CA_PATH", "DirectRoute", "EgressRoute", "ca_environment"]

CA_PATH = "/run/conclave/extra-ca.pem"  # inside the member's container


class EgressRoute(Protocol):
    """Where an admitted `host:port` is connected, and the extra CA (PEM) trusted there, if any."""

    @property
    def extra_ca(self) -> Path | None: ...

    def target(self, host: str, port: int) -> tuple[str, int]: ...


@dataclass(frozen=True)
class DirectRoute:
    """The host itself, by its name (resolved on the host), with the system's roots and `extra_ca`'s."""

    extra_ca: Path | None = None

    def target(self, host: str, port: int) -> tuple[str, int]:
        return host, port


def ca_environment() -> dict[str, str]:
    """The container's variables that add the CA at `CA_PATH` to each CLI's roots: Node's (Claude Code,
    Gemini CLI, Copilot CLI) and Codex's own (it builds a rustls client from that file)."""
    return {"NODE_EXTRA_CA_CERTS": CA_PATH, "CODEX_CA_CERTIFICATE": CA_PATH}
