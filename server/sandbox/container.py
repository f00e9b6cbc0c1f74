"""Docker-confined command execution: one warm container per agent per job (the `docker` SDK).

    sandbox = Sandbox(client, owner)
    try:
        peers = {peer: ws.peer_mount(peer) for peer in letters if peer != letter}
        await sandbox.start(ws.agent(letter), peers, job_id, letter, team.sandbox)
        result = await sandbox.exec("pytest -q", timeout_s=120)
    finally:
        with anyio.CancelScope(shield=True):
            await sandbox.stop()

Confinement (tests/test_sandbox.py checks each): workspace bind-mounted rw at /workspace, peers' latest
snapshots ro at /peers/<letter>, network `none` unless the team says `bridge`, read-only root, tmpfs /tmp,
`cap_drop=ALL`, `no-new-privileges`, pids/memory (swap equal: none)/CPU limits, a non-root user, `init=True`
(else zombies eat the pids limit), an environment built here from constants, nothing of the host's (no keys).

Choices:
- Peers: bind mounts are fixed when the container starts, but peers' latest answers are not. So each peer
  is a fixed host folder, `Workspaces.peer_mount(B)` = `<job>/peers/B`, mounted ro at /peers/B, that the
  workspace layer refreshes IN PLACE when B posts an answer (`Workspaces.publish`). Never replace that folder
  by a rename: the mount pins its inode. A missing folder is created empty here, so a peer that has not
  answered yet is an empty /peers/<letter>.
- The user: uid/gid 1000 (the image's `sandbox` user) when the server runs as root, and then every file in the
  workspace is handed to 1000 before each command (host-side tools may have written root-owned files);
  otherwise the server's own uid/gid, so files agents write stay the server user's to read, diff and delete.
- /tmp is a tmpfs that allows exec (Docker's default is noexec): /workspace is executable anyway, so noexec
  buys nothing and breaks compilers and test runners that run what they build in /tmp.
- Timeouts: the command runs as `timeout -s KILL N sh -c CMD`; coreutils `timeout` leads its own process group
  and kills the whole group, so background children die too (a child that escapes with `setsid` survives
  until the container is stopped; it is still held by the pids and memory limits). `exec_run` has no
  timeout of its own, so if an exec overruns timeout + grace the container is killed and restarted.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from conclave.config import Sandbox as SandboxSpec
from conclave.errors import SandboxError, SandboxUnavailable
from conclave.sandbox.engine import (
    FIX,
    PROCESS_OWNER,
    EngineStatus,
    Owner,
    connect,
    engine_status,
    missing_image,
    remove_container,
    sweep,
)
from conclave.sandbox.image import IMAGE_REPO, default_tag

__all__ = [
    "CommandResult", "EngineStatus", "Owner", "Sandbox", "connect", "container_user", "engine_status",
    "image_tag", "sweep",
]

OUTPUT_CAP = 20_000  # bytes kept per stream (head and tail halves); the middle is cut with a note
GRACE_S = 10.0  # how long past its timeout an exec may take before the container is killed
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The whole environment of every command: constants only, never copied from the host.
ENVIRONMENT = {
    "HOME": "/workspace",
    "USER": "sandbox",
    "LOGNAME": "sandbox",
    "PATH": PATH,
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",  # no __pycache__ in the diff
    "XDG_CACHE_HOME": "/tmp/.cache",  # pip and friends cache outside the workspace
}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class CommandResult:
    """What a command did; stdout and stderr are kept apart and capped."""

    exit_code: int | None  # None: the exec itself overran and the sandbox was restarted
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float
    notes: tuple[str, ...] = ()  # what was cut, what was killed

    def as_text(self) -> str:
        """A compact rendering for a model: exit code, notes, then both streams."""
        status = "timed out" if self.timed_out else f"exit code {self.exit_code}"
        parts = [f"[{status} after {self.duration_s:.1f} s]", *(f"[{note}]" for note in self.notes)]
        if self.stdout:
            parts += ["--- stdout ---", self.stdout.rstrip("\n")]
        if self.stderr:
            parts += ["--- stderr ---", self.stderr.rstrip("\n")]
        return "\n".join(parts)


def container_user() -> tuple[int, int]:
    """Who commands run as: the image's `sandbox` user (1000) under a root server, else the server's user.

    Pass it as the workspace's and the agent tools' file owner, so host-written files are the agent's too.
    """
    return (1000, 1000) if os.getuid() == 0 else (os.getuid(), os.getgid())


def image_tag(spec: SandboxSpec) -> str:
    """The team's image with this version's tag when it names none (`conclave-sandbox` -> `...:0.1.0`)."""
    if spec.image == IMAGE_REPO:
        return default_tag()
    return spec.image if ":" in spec.image.rsplit("/", 1)[-1] else f"{spec.image}:latest"


class Sandbox:
    """One agent's container for one job: `start`, then `exec` any number of times, then `stop`."""

    grace_s = GRACE_S
    output_cap = OUTPUT_CAP

    def __init__(self, client: Any | None = None, owner: Owner = PROCESS_OWNER) -> None:
        self._client, self.owner = client, owner
        self.container: Any | None = None
        self._limiter: anyio.CapacityLimiter | None = None  # one command at a time, off the shared pool
        self.uid, self.gid = container_user()
        self._workspace: Path | None = None
        self._dir_mtimes: dict[str, int] = {}  # see _hand_over

    async def start(
        self,
        workspace: Path,
        peers: Mapping[str, Path],
        job_id: str,
        letter: str,
        limits: SandboxSpec,
    ) -> Any:
        """Launch the container (see the module docstring for what confines it) and return it.

        `peers` maps each peer's letter to its fixed host folder (refreshed in place as it posts answers).
        """
        for name in (job_id, letter, *peers):
            if not _NAME.match(name):
                raise SandboxError(f"{name!r} cannot name a container or a mount point")
        self._limiter = anyio.CapacityLimiter(1)
        self._workspace = workspace.resolve()
        if self._client is None:
            self._client = await anyio.to_thread.run_sync(connect)
        self.container = await anyio.to_thread.run_sync(self._create, job_id, letter, dict(peers), limits)
        return self.container

    def _create(self, job_id: str, letter: str, peers: dict[str, Path], limits: SandboxSpec) -> Any:
        import docker
        from docker.types import Mount

        assert self._workspace is not None
        image = image_tag(limits)
        try:
            self._client.images.get(image)
        except docker.errors.ImageNotFound as exc:
            raise SandboxUnavailable(missing_image(image)) from exc
        except docker.errors.DockerException as exc:
            raise SandboxUnavailable(f"the Docker engine failed ({exc}): {FIX}") from exc
        self._hand_over()
        mounts = [Mount("/workspace", str(self._workspace), type="bind", read_only=False)]
        for peer, folder in sorted(peers.items()):
            folder.mkdir(parents=True, exist_ok=True)
            mounts.append(Mount(f"/peers/{peer}", str(folder.resolve()), type="bind", read_only=True))
        labels = {
            "conclave.job": job_id,
            "conclave.owner": self.owner.id,
            "conclave.owner_pid": str(self.owner.pid),
            "conclave.agent": letter,
        }
        try:
            return self._client.containers.run(
                image,
                ["sleep", "infinity"],
                name=f"conclave-{job_id}-{letter}-{secrets.token_hex(3)}",
                detach=True,
                init=True,
                user=f"{self.uid}:{self.gid}",
                working_dir="/workspace",
                environment=dict(ENVIRONMENT),
                labels=labels,
                mounts=mounts,
                network_mode=limits.network,
                read_only=True,
                tmpfs={"/tmp": "rw,exec,nosuid,nodev,size=512m,mode=1777"},
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                pids_limit=limits.pids,
                mem_limit=limits.memory,
                memswap_limit=limits.memory,  # equal to the memory limit: no swap
                nano_cpus=int(limits.cpus * 1e9),
            )
        except docker.errors.DockerException as exc:
            failed = f"the sandbox container of agent {letter} in {job_id} did not start: {exc}"
            raise SandboxError(failed) from exc

    async def exec(self, command: str, timeout_s: float) -> CommandResult:
        """Run `command` with `sh -c` in /workspace; kill it and its process group after `timeout_s`."""
        if self.container is None or self._limiter is None:
            raise SandboxError("the sandbox is not started")
        started = time.monotonic()
        with anyio.move_on_after(timeout_s + self.grace_s) as overrun:
            raw = await anyio.to_thread.run_sync(
                self._run, self._argv(command, timeout_s), abandon_on_cancel=True, limiter=self._limiter
            )
        duration = time.monotonic() - started
        if overrun.cancelled_caught:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._restart)
            note = (
                f"the command outlived its {timeout_s:g} s timeout and the sandbox was restarted "
                "(/workspace kept, /tmp emptied, background processes gone)"
            )
            return CommandResult(None, "", "", True, duration, (note,))
        exit_code, out, err = raw
        timed_out = exit_code == 137 and duration >= timeout_s * 0.95
        notes = [note for note in (out.note("stdout"), err.note("stderr")) if note]
        if timed_out:
            notes.insert(0, f"killed after {timeout_s:g} s (the timeout), with every process it started")
        elif exit_code == 137:
            notes.insert(0, "killed by SIGKILL: most likely out of memory (the sandbox's memory limit)")
        return CommandResult(exit_code, out.text(), err.text(), timed_out, duration, tuple(notes))

    def _argv(self, command: str, timeout_s: float) -> list[str]:
        return ["timeout", "-s", "KILL", f"{timeout_s:g}", "sh", "-c", command]

    def _run(self, argv: list[str]) -> tuple[int | None, _Capped, _Capped]:
        import docker

        self._hand_over()
        api = self._client.api
        out, err = _Capped(self.output_cap), _Capped(self.output_cap)
        try:
            user = f"{self.uid}:{self.gid}"
            try:
                exec_id = api.exec_create(self.container.id, argv, user=user, workdir="/workspace")
            except docker.errors.APIError as exc:
                if "is not running" not in str(exc):
                    raise
                self._restart()  # e.g. its keeper was killed: come back once, workspace intact
                exec_id = api.exec_create(self.container.id, argv, user=user, workdir="/workspace")
            for chunk_out, chunk_err in api.exec_start(exec_id["Id"], stream=True, demux=True):
                out.add(chunk_out)
                err.add(chunk_err)
            return api.exec_inspect(exec_id["Id"]).get("ExitCode"), out, err
        except docker.errors.DockerException as exc:
            raise SandboxError(f"the command could not run in the sandbox: {exc}") from exc

    def _hand_over(self) -> None:
        """As root, give the workspace to the container's user (host-side tools write root-owned files).

        Files are only looked at in directories whose mtime moved since the last pass (a new or renamed
        file moves it; an overwrite keeps the owner), so a 5,000-file tree costs a stat per directory.
        """
        if os.getuid() != 0 or self._workspace is None:
            return
        settled_before = time.time_ns() - 2_000_000_000  # mtimes are coarse: trust only settled ones
        seen: dict[str, int] = {}
        for root, dirs, files in os.walk(self._workspace):
            mtime = self._own(root)
            if mtime < settled_before:
                seen[root] = mtime
            if self._dir_mtimes.get(root) != mtime:
                for name in (*dirs, *files):
                    self._own(os.path.join(root, name))
        self._dir_mtimes = seen

    def _own(self, path: str) -> int:
        try:
            stat = os.lstat(path)
        except FileNotFoundError:
            return 0  # removed while we walked
        if stat.st_uid != self.uid or stat.st_gid != self.gid:
            os.lchown(path, self.uid, self.gid)
        return stat.st_mtime_ns

    def _restart(self) -> None:
        import docker

        try:
            self.container.kill()
        except docker.errors.APIError:
            pass  # already stopped
        self.container.start()

    async def stop(self) -> None:
        """Remove the container (force); safe to call twice or before `start`."""
        container, self.container = self.container, None
        if container is None:
            return
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(remove_container, container)


class _Capped:
    """One output stream: the first and last halves of `cap` bytes kept, the middle counted and cut."""

    def __init__(self, cap: int) -> None:
        self.cap, self.total = cap, 0
        self.head, self.tail = bytearray(), bytearray()

    def add(self, chunk: bytes | None) -> None:
        if not chunk:
            return
        self.total += len(chunk)
        room = self.cap // 2 - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        del self.tail[: max(0, len(self.tail) - self.cap // 2)]

    @property
    def cut(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def text(self) -> str:
        head, tail = self.head.decode(errors="replace"), self.tail.decode(errors="replace")
        if not self.cut:
            return head + tail
        return f"{head}\n[... {self.cut:,} bytes cut ...]\n{tail}"

    def note(self, stream: str) -> str | None:
        if not self.cut:
            return None
        kept = self.cap // 2
        return f"{stream}: {self.total:,} bytes, the middle {self.cut:,} cut (first and last {kept:,} kept)"
