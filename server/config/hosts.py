"""One entry of an egress allowlist as a user writes it: `host`, `host:port`, `*.domain[:port]`, `[v6]:port`.

Pure parsing, shared by the team file's `sandbox.allow_hosts`, the `CONCLAVE_EGRESS_ALLOW` setting and the
egress proxy's allowlists (sandbox/allowlist.py). A rule names one port: 443 unless it says otherwise, since
the providers' APIs are HTTPS; a `base_url` gives its own (80 for http, 443 for https).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

HTTPS_PORT = 443
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_NAME = re.compile(rf"^(?:\*\.)?{_LABEL}(?:\.{_LABEL})*$")
_SHAPE = "write host, host:port, *.domain or [ipv6]:port, e.g. api.example.com or llm.internal:8443"


@dataclass(frozen=True)
class HostRule:
    """Admits `host:port` exactly; with `*.` in front, any name below the domain (not the domain itself)."""

    host: str  # lower case, no trailing dot; an IPv6 address without brackets
    port: int

    def admits(self, host: str, port: int) -> bool:
        if port != self.port:
            return False
        host = normal_host(host)
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and len(host) > len(self.host) - 1
        return host == self.host

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def normal_host(host: str) -> str:
    """How hosts are compared: lower case, brackets and one trailing dot dropped."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host.removesuffix(".")


def parse_host_rule(text: str, default_port: int = HTTPS_PORT) -> HostRule:
    """`api.example.com`, `llm.internal:8443`, `*.example.com`, `[::1]:8080`...; else a ValueError."""
    raw = text.strip()
    if raw.startswith("["):
        inside, _, rest = raw[1:].partition("]")
        host, port_text = inside, rest[1:] if rest.startswith(":") else ("" if not rest else None)
    else:
        host, _, port_text = raw.partition(":") if raw.count(":") <= 1 else (raw, "", "")
    if port_text is None or (port_text and not port_text.isdigit()):
        raise ValueError(f"{text!r} is not a host rule: {_SHAPE}")
    port = int(port_text) if port_text else default_port
    if not 0 < port < 65536:
        raise ValueError(f"{text!r} names port {port}, outside 1-65535")
    host = normal_host(host)
    if not _is_ip(host) and not _NAME.match(host):
        raise ValueError(f"{text!r} is not a host rule: {_SHAPE}")
    return HostRule(host, port)


def url_rule(url: str) -> HostRule:
    """The rule admitting a `base_url`'s host and port (80 for http, 443 for https when it names none)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s) URL with a host, e.g. https://llm.example.com/v1")
    default = 80 if parts.scheme == "http" else HTTPS_PORT
    try:
        port = parts.port or default
    except ValueError as exc:
        raise ValueError(f"{url!r} names a port outside 1-65535") from exc
    host = parts.hostname
    return parse_host_rule(f"[{host}]:{port}" if ":" in host else f"{host}:{port}", default)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
