"""Which engine to talk to, chosen the way the `docker` command chooses it, then Podman's socket.

1. `DOCKER_HOST` (with `DOCKER_TLS_VERIFY`/`DOCKER_CERT_PATH`), as docker-py's `from_env` reads it;
2. else the active docker context: `DOCKER_CONTEXT`, else `currentContext` in ~/.docker/config.json
   (`DOCKER_CONFIG` moves that folder), its endpoint in contexts/meta/<sha256 of the name>/meta.json;
   docker-py (7.2 and later) reads both in `from_env`, so a context set by Docker Desktop, OrbStack,
   colima or Rancher Desktop is followed;
3. else the default socket, /var/run/docker.sock, where it exists;
4. else Podman's API socket: $XDG_RUNTIME_DIR/podman/podman.sock (rootless), then
   /run/podman/podman.sock (rootful), where one exists (`systemctl [--user] enable --now podman.socket`);
5. else the default socket, for docker-py's own error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SOCKET = Path("/var/run/docker.sock")
ROOTFUL_PODMAN = Path("/run/podman/podman.sock")


@dataclass(frozen=True)
class EngineAddress:
    """Where the engine is (`url` None: docker-py's `from_env` resolves it) and why it was chosen."""

    url: str | None
    chosen_by: str


def choose_endpoint(environ: Mapping[str, str]) -> EngineAddress:
    """The engine's address, in the order of the module docstring."""
    if environ.get("DOCKER_HOST"):
        return EngineAddress(None, f"DOCKER_HOST={environ['DOCKER_HOST']}")
    context = current_context(environ)
    if context != "default":
        return EngineAddress(None, f"docker context {context}")
    if DEFAULT_SOCKET.exists():
        return EngineAddress(None, f"the default socket {DEFAULT_SOCKET}")
    for socket in podman_sockets(environ):
        if socket.exists():
            return EngineAddress(f"unix://{socket}", f"Podman's socket {socket} (no Docker engine found)")
    return EngineAddress(None, f"the default socket {DEFAULT_SOCKET}")


def current_context(environ: Mapping[str, str]) -> str:
    """The active docker context's name: `DOCKER_CONTEXT`, else config.json's `currentContext`."""
    if environ.get("DOCKER_CONTEXT"):
        return environ["DOCKER_CONTEXT"]
    folder = Path(environ["DOCKER_CONFIG"]) if environ.get("DOCKER_CONFIG") else docker_folder(environ)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return "default"  # no config, or one the docker command would not read either
    name = config.get("currentContext") if isinstance(config, dict) else None
    return name if isinstance(name, str) and name else "default"


def docker_folder(environ: Mapping[str, str]) -> Path:
    home = environ.get("HOME") or os.path.expanduser("~")
    return Path(home) / ".docker"


def podman_sockets(environ: Mapping[str, str]) -> list[Path]:
    """Podman's API sockets, rootless first."""
    runtime = environ.get("XDG_RUNTIME_DIR")
    rootless = [Path(runtime) / "podman" / "podman.sock"] if runtime else []
    return [*rootless, ROOTFUL_PODMAN]
