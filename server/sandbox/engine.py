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
from conclave.sandbox.endpoint import choose_endpoint

FIX = (
    "start the Docker engine (dockerd, Docker Desktop, or Podman's API socket), or point DOCKER_HOST or "
    "`docker context use` at one, or set `sandbox: none` in the team file to run the team without "
    "commands; `conclave doctor` checks the setup"
)

# What an engine needs to start our containers, for the errors of a container that did not start.
ENGINE_NEEDS = (
    "check that it runs containers at all (`docker run --rm hello-world` with the same DOCKER_HOST); "
    "Podman also needs catatonit (its container init) and, on a host without CAP_SYS_RESOURCE, "
    "default_ulimits in containers.conf (docs/platforms.md)"
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


_ARCH_NAMES = {"amd64": "x86_64", "arm64": "aarch64"}


@dataclass(frozen=True)
class EngineFacts:
    """What the engine says of itself (its version and info endpoints), for `conclave doctor` and for the
    few places engines differ (sandbox/member.py's HOME on Podman)."""

    name: str  # Docker, Docker Desktop, OrbStack, colima, Rancher Desktop, Podman
    version: str
    os: str  # the engine's own OS: on a Mac or Windows that is the VM's Linux, not the host's
    arch: str  # the architecture containers run as (x86_64, aarch64)

    @property
    def podman(self) -> bool:
        return self.name == "Podman"


def engine_facts(client: Any) -> EngineFacts:
    """Read the engine's name, version, OS and architecture (two API calls; blocking)."""
    import docker

    try:
        version, info = client.version(), client.info()
    except docker.errors.DockerException as exc:
        raise SandboxUnavailable(f"the Docker engine did not say what it is ({exc}): {FIX}") from exc
    components = {str(c.get("Name", "")) for c in version.get("Components") or []}
    system = str(info.get("OperatingSystem") or version.get("Os") or "unknown")
    host = str(info.get("Name") or "")
    if "Podman Engine" in components:
        name = "Podman"
    elif "Docker Desktop" in system:
        name = "Docker Desktop"
    elif "OrbStack" in system or host == "orbstack":
        name = "OrbStack"
    elif "rancher-desktop" in host or "Rancher Desktop" in system:
        name = "Rancher Desktop"
    elif host.startswith("colima"):
        name = "colima"
    else:
        name = "Docker"
    arch = str(info.get("Architecture") or version.get("Arch") or "unknown")
    arch = _ARCH_NAMES.get(arch, arch)  # Podman says Go's names (amd64), Docker the kernel's (x86_64)
    return EngineFacts(name, str(version.get("Version", "unknown")), system, arch)


@dataclass(frozen=True)
class Ping:
    """What an engine's ping says in its headers: one cheap call every engine answers at once.

    Not from `engine_facts`: Podman 4.3 answers /version in about 0.7 s and /info in 0.5 s (it asks its
    runtimes for their versions each time), which every CLI member's start would pay."""

    podman: bool  # a `Libpod-Api-Version` header
    version: str | None  # from `Server: Docker/20.10.24 (linux)` or `Libpod/4.3.1 (linux)`


def ping(client: Any) -> Ping:
    """The engine's ping (blocking), or `SandboxUnavailable` saying how to fix it."""
    import docker

    try:
        reply = client.api.get(f"{client.api.base_url}/_ping", timeout=30)
        reply.raise_for_status()
    except (docker.errors.DockerException, OSError) as exc:  # requests' errors are OSErrors
        raise SandboxUnavailable(f"the Docker engine did not answer its ping ({exc}): {FIX}") from exc
    name, _, rest = str(reply.headers.get("Server", "")).partition("/")
    version = rest.split(" ")[0] if name in ("Docker", "Libpod") else ""
    return Ping("Libpod-Api-Version" in reply.headers, version or None)


def is_podman(client: Any) -> bool:
    """Whether the engine is Podman, from its ping (blocking)."""
    return ping(client).podman


def server_version(client: Any) -> str | None:
    """The engine's version from its ping, else from /version (blocking)."""
    if (version := ping(client).version) is not None:
        return version
    reported = client.version().get("Version")
    return None if reported is None else str(reported)


def connect() -> Any:
    """A client of the engine sandbox/endpoint.py chooses (API version negotiated), or
    `SandboxUnavailable` saying how to fix it."""
    import docker

    endpoint = choose_endpoint(os.environ)
    try:
        if endpoint.url is not None:
            return docker.DockerClient(base_url=endpoint.url, version="auto")
        return docker.from_env()
    except docker.errors.DockerException as exc:
        raise SandboxUnavailable(
            f"no Docker engine is reachable through {endpoint.chosen_by} ({exc}): {FIX}"
        ) from exc


def engine_status(image: str | None = None) -> EngineStatus:
    """For `conclave doctor` and job admission: engine reachable? version? image present?"""
    import docker

    try:
        client = connect()
    except (SandboxUnavailable, docker.errors.DockerException, OSError) as exc:  # OSError: requests'
        return EngineStatus(False, error=str(exc))
    try:  # closed after: a server asks at every job's admission, and each client holds a connection
        try:
            version = server_version(client)
        except (docker.errors.DockerException, OSError) as exc:
            return EngineStatus(False, error=str(exc))
        if image is None:
            return EngineStatus(True, version)
        try:
            client.images.get(image)
            return EngineStatus(True, version, image=image, image_present=True)
        except docker.errors.ImageNotFound:
            return EngineStatus(True, version, error=missing_image(image), image=image, image_present=False)
    finally:
        client.close()


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
    job: str | None = None,
) -> list[str]:
    """Remove containers labelled by an owner that is gone; return their names. Never a live server's.

    `is_owner_dead(owner_id, pid)` is the caller's judgement (the job service: no process has that pid,
    as this engine's servers share the host's pid namespace). With `job`, only that job's containers
    (a job this process took over: every other owner's are its dead one's), and no volumes.
    """
    dead = is_owner_dead
    docker_client: Any = client or await anyio.to_thread.run_sync(connect)

    def listed() -> list[Any]:
        """The labelled containers, each inspected; one removed meanwhile (another server's sweep) is
        skipped."""
        labels = ["conclave.owner", *([f"conclave.job={job}"] if job is not None else [])]
        return list(docker_client.containers.list(all=True, filters={"label": labels}, ignore_removed=True))

    def gone(labels: dict[str, str]) -> bool:
        owner, pid = labels.get("conclave.owner", ""), labels.get("conclave.owner_pid", "")
        return owner != PROCESS_OWNER.id and pid.isdigit() and dead(owner, int(pid))

    def run() -> list[str]:
        removed = []
        for container in listed():
            if gone(container.labels):
                remove_container(container)
                removed.append(container.name)
        if job is not None:
            return removed  # volumes name no job: they go with their owner's sweep
        # a CLI member's HOME volume on Podman (sandbox/member.py), once its container is gone
        for volume in docker_client.volumes.list(filters={"label": "conclave.owner"}):
            if gone(volume.attrs.get("Labels") or {}):
                remove_volume(docker_client, volume.name)
                removed.append(volume.name)
        return removed

    try:
        return await anyio.to_thread.run_sync(run)
    finally:
        if client is None:  # ours: its connection would outlive the sweep
            await anyio.to_thread.run_sync(docker_client.close)


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


def remove_volume(client: Any, name: str) -> None:
    """Remove a volume (a CLI member's HOME on Podman); gone already is fine."""
    import docker

    try:
        client.volumes.get(name).remove(force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        raise SandboxError(f"could not remove the sandbox volume {name}: {exc}") from exc
