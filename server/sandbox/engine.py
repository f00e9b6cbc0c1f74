"""The Docker engine seam: a client, the engine's status for `conclave doctor`, the sweep of leftovers.

Containers are labelled `conclave.owner` (a random id per server process) and `conclave.owner_pid`; `sweep`
removes only those whose owner is gone, never a live server's .
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread

from conclave.errors import SandboxError, SandboxUnavailable

FIX = (
    "start the Docker engine (dockerd), or set `sandbox: none` in the team file to run the team without "
    "commands; `conclave doctor` checks the setup"
)


@dataclass(frozen=True)
class Owner:
    """The server process that owns containers; `sweep` removes only containers of dead owners."""

    id: str
    pid: int = field(default_factory=os.getpid)


PROCESS_OWNER = Owner(secrets.token_hex(8))


@dataclass(frozen=True)
class EngineStatus:
    """Whether commands can run here, and if not, how to fix it."""

    available: bool
    version: str | None = None
    error: str | None = None
    image: str | None = None
    image_present: bool | None = None


def connect() -> Any:
    """A Docker client (API version negotiated), or `SandboxUnavailable` saying how to fix it."""
    import docker

    try:
        return docker.from_env()
    except docker.errors.DockerException as exc:
        raise SandboxUnavailable(f"no Docker engine is reachable ({exc}): {FIX}") from exc


def engine_status(image: str | None = None) -> EngineStatus:
    """For `conclave doctor` and job admission: engine reachable? version? image present?"""
    import docker

    try:
        client = connect()
        version = client.version().get("Version")
    except (SandboxUnavailable, docker.errors.DockerException) as exc:
        return EngineStatus(False, error=str(exc))
    if image is None:
        return EngineStatus(True, version)
    try:
        client.images.get(image)
        return EngineStatus(True, version, image=image, image_present=True)
    except docker.errors.ImageNotFound:
        return EngineStatus(True, version, error=missing_image(image), image=image, image_present=False)


def missing_image(image: str) -> str:
    """The fix for a missing sandbox image."""
    return (
        f"the sandbox image {image} is missing: run `conclave sandbox build` (about a minute, no registry "
        "needed), or set `sandbox: none` in the team file"
    )


async def sweep(
    is_owner_dead: Callable[[str, int], bool],
    client: Any | None = None,
    *,
    spare: Owner = PROCESS_OWNER,
) -> list[str]:
    """Remove containers labelled by an owner that is gone; return their names. Never a live server's.

    `is_owner_dead(owner_id, pid)` is the caller's judgement (the job service: no process has that pid,
    as this engine's servers share the host's pid namespace).
    """
    dead = is_owner_dead
    docker_client: Any = client or await anyio.to_thread.run_sync(connect)

    def listed() -> list[Any]:
        """The labelled containers, each inspected.

        One removed meanwhile (another server's sweep) is skipped.
        """
        import docker

        found = []
        for container in docker_client.containers.list(
            all=True, sparse=True, filters={"label": "conclave.owner"}
        ):
            try:
                container.reload()
            except docker.errors.NotFound:
                continue
            found.append(container)
        return found

    def run() -> list[str]:
        removed = []
        for container in listed():
            labels = container.labels
            owner, pid = labels.get("conclave.owner", ""), labels.get("conclave.owner_pid", "")
            if owner == spare.id or not pid.isdigit() or not dead(owner, int(pid)):
                continue
            remove_container(container)
            removed.append(container.name)
        return removed

    return await anyio.to_thread.run_sync(run)


def remove_container(container: Any) -> None:
    """Force-remove a container; gone already is fine."""
    import docker

    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if "already in progress" not in str(exc):
            raise SandboxError(f"could not remove sandbox container {container.name}: {exc}") from exc
