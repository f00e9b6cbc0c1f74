"""Tests only: a CLI member's provider hosts sent to fake servers on this machine.

A CLI that uses the user's own login (its credentials file) talks to its provider's real hosts over
HTTPS (api.anthropic.com, chatgpt.com, ...), never to a base_url. To run that route end to end without
the internet, a test gives the job service a `ProviderRedirect`:
- the member's egress proxy still checks every request against the member's allowlist, then connects
  an admitted host to its fake's port on 127.0.0.1 instead of resolving the name (sandbox/egress.py);
- the member's container gets the test CA that signed the fake's certificate, read-only at `CA_PATH`,
  and the variables that make its CLI trust it besides the system's roots (sandbox/member.py).

No setting, variable, team file or tool argument builds one: only `JobService.open(..., redirect=...)`
takes it, and only tests pass it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from conclave.config.hosts import HTTPS_PORT, normal_host

CA_PATH = "/run/conclave/test-ca.pem"  # inside the member's container
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ProviderRedirect:
    """`ports`: provider host -> the port on 127.0.0.1 of its TLS fake; `ca_file`: the test CA (PEM)."""

    ports: Mapping[str, int]
    ca_file: Path

    def target(self, host: str, port: int) -> tuple[str, int]:
        """Where the proxy connects for an admitted `host:port`: its fake for a redirected host on 443."""
        fake = self.ports.get(normal_host(host)) if port == HTTPS_PORT else None
        return (LOOPBACK, fake) if fake is not None else (host, port)

    def environment(self) -> dict[str, str]:
        """The container's variables that add the test CA to each CLI's roots: Node's (Claude Code,
        Gemini CLI, Copilot CLI) and Codex's own (it builds a rustls client from that file)."""
        return {"NODE_EXTRA_CA_CERTS": CA_PATH, "CODEX_CA_CERTIFICATE": CA_PATH}
