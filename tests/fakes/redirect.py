"""A CLI member's provider hosts sent to fake servers on this machine: the tests' `EgressRoute`.

A CLI that uses the user's own login (its credentials file) talks to its provider's real hosts over
HTTPS (api.anthropic.com, chatgpt.com, ...), never to a base_url. To run that route end to end without
the internet, a test gives the job service a `ProviderRedirect` as its route
(`JobService.serve(replace(JobEnvironment.of(...), route=...))`, server/sandbox/route.py):
- the member's egress proxy still checks every request against the member's allowlist, then connects
  an admitted host to its fake's port on 127.0.0.1 instead of resolving the name (server/sandbox/egress.py);
- the member's container gets the test CA that signed the fake's certificate as its extra CA, read-only,
  with the variables that make its CLI trust it besides the system's roots (server/sandbox/member.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from conclave.config.hosts import HTTPS_PORT, normal_host

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ProviderRedirect:
    """`ports`: provider host -> the port on 127.0.0.1 of its TLS fake; `extra_ca`: the test CA (PEM)."""

    ports: Mapping[str, int]
    extra_ca: Path

    def target(self, host: str, port: int) -> tuple[str, int]:
        """Where the proxy connects for an admitted `host:port`: its fake for a redirected host on 443."""
        fake = self.ports.get(normal_host(host)) if port == HTTPS_PORT else None
        return (LOOPBACK, fake) if fake is not None else (host, port)
