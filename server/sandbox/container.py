"""Docker-confined command execution: one warm container per agent per job (the `docker` SDK).

    sandbox = Sandbox(client, owner)
    try:
        peers = {peer: ws.peer_mount(peer) for peer in letters if peer != letter}
        await sandbox.start(ws.agent(letter), peers, job_id, letter, team.sandbox)
        result = await sandbox.exec("pytest -q", timeout_s=120)
    finally:
        with anyio.CancelScope(shield=True):
            await sandbox.stop()

Confinement: workspace bind-mounted rw at /workspace, peers' latest
snapshots ro at /peers/<letter>, network `none` unless the team says `bridge`, read-only root, tmpfs /tmp,
`cap_drop=ALL`, `no-new-privileges`, pids/memory (swap equal: none)/CPU limits, a non-root user, `init=True`
(else zombies eat the pids limit), an environment built here from constants, nothing of the host's (no keys).

Choices:
- Peers: bind mounts are fixed when the container starts, but peers' latest answers are not. So each peer
  is a fixed host folder, `Workspaces.peer_mount(B)` = `<job>/peers/B`, mounted ro at /peers/B, that the
  workspace layer refreshes IN PLACE when B posts an answer (`Workspaces.publish`). Never replace that folder
  by a rename: the mount pins its inode. A missing folder is created empty here, so a peer that has not
  answered yet is an empty /peers/<letter>.
- The user: commands run as uid/gid 1000 (the image's `sandbox` user) when the server runs as root, otherwise
  as the server's own uid/gid, so files agents write stay the server user's to read, diff and delete. The
  container's keeper (`sleep infinity` under docker-init) runs as another uid (`KEEPER`, nobody), which the
  agent's processes cannot signal.
- Commands go through the container's runner (command_runner.py): one long-lived exec that starts each
  command, since an engine exec per command cost more than most commands. Where the image cannot run it, each
  command is an exec of its own.
- Background processes do not outlive their command: after every command (and after a timeout) the
  runner, as the command's user, sends `kill(-1, SIGKILL)`, which reaches every process of that user in
  the container (`setsid` escapees included) but not the keeper, and checks /proc until none is left;
  if that fails the container is restarted. Without a
  runner a second exec does the same (leftovers.REAP), skipped when the host sees in the container's
  pids cgroup that only the keeper is left (leftovers.py).
- After every command the workspace is settled through files/safe.py's no-follow walk: setuid, setgid
  and world-write bits are cleared, every entry is handed to the command user (as root), and its size
  is measured for the job's disk budget (`CommandResult.workspace_bytes`).
- /tmp is a tmpfs that allows exec (Docker's default is noexec): /workspace is executable anyway, so noexec
  buys nothing and breaks compilers and test runners that run what they build in /tmp.
- Timeouts: the command runs as `timeout -s KILL N sh -c CMD`; coreutils `timeout` leads its own process group
  and kills the whole group, and the reaping above gets the rest. `exec_run` has no timeout of its
  own, so if an exec overruns timeout + grace the container is killed and restarted.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from conclave.config.models import SandboxSpec
from conclave.errors import SandboxError, SandboxStopped, SandboxUnavailable
from conclave.files.settling import Settled, settle
from conclave.sandbox.command_runner import Runner, RunnerGone, RunnerSlot
from conclave.sandbox.disk_watch import Watched, Watcher, kill_user_processes
from conclave.sandbox.engine import (
    ENGINE_NEEDS,
    FIX,
    PROCESS_OWNER,
    Owner,
    connect,
    missing_image,
    remove_container,
)
from conclave.sandbox.image import image_tag
from conclave.sandbox.leftovers import cgroup_of, nothing_left, reap
from conclave.sandbox.output import CommandResult, _Capped, described

__all__ = ["Sandbox", "container_user"]

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
TMP = "rw,exec,nosuid,nodev,size=512m,mode=1777"  # /tmp (see the module docstring for why exec)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
KEEPER = 65534  # nobody: the keeper's uid, never the commands' (see the module docstring)


def container_user() -> tuple[int, int]:
    """Who commands run as: the image's `sandbox` user (1000) under a root server, else the server's user.

    Pass it as the workspace's and the agent tools' file owner, so host-written files are the agent's too.
    """
    return (1000, 1000) if os.getuid() == 0 else (os.getuid(), os.getgid())


def keeper_user(uid: int) -> str:
    """The keeper's user: nobody, or the uid below it when commands themselves run as nobody."""
    keeper = KEEPER if uid != KEEPER else KEEPER - 1
    return f"{keeper}:{keeper}"


class Sandbox:
    """One agent's container for one job: `start`, then `exec` any number of times, then `stop`."""

    grace_s = GRACE_S
    output_cap = OUTPUT_CAP
    reap_always = False  # True: never skip the reaping exec (a keeper that forks: member.py)
    use_runner = True  # commands go through the in-container runner (command_runner.py) where it starts

    def __init__(self, client: Any | None = None, owner: Owner = PROCESS_OWNER) -> None:
        # docker-py's objects are untyped (Any); each is None until `start` connects or creates it
        self._client: Any = client
        self._own_client = client is None  # connected by `start`: closed by `stop`, or its socket stays
        self.owner = owner
        self.container: Any = None
        self._limiter: anyio.CapacityLimiter | None = None  # one command at a time, off the shared pool
        self.uid, self.gid = container_user()
        self._workspace: Path | None = None
        self._cgroup: Path | None = None  # the container's pids cgroup on this host, once found
        self._runner_slot = RunnerSlot(self.use_runner)
        # Bumped when an overrunning exec is abandoned and the container restarted: that exec's thread,
        # still running, must then neither reap nor restart (it would kill the next command's container).
        self._generation = 0

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
        self._runner_slot = RunnerSlot(self.use_runner)  # a stopped sandbox's slot stays ended
        self._workspace = workspace.resolve()
        if self._client is None:
            self._client = await anyio.to_thread.run_sync(connect)
        self.container = await anyio.to_thread.run_sync(self._create, job_id, letter, dict(peers), limits)
        api, user = self._client.api, f"{self.uid}:{self.gid}"  # the runner, ready before the first command
        await anyio.to_thread.run_sync(self._runner_slot.ahead, api, self.container.id, user, self._restart)
        return self.container

    def _create(self, job_id: str, letter: str, peers: dict[str, Path], limits: SandboxSpec) -> Any:
        import docker
        from docker.types import Mount

        assert self._workspace is not None
        launch = self._launch(limits)
        image = launch.pop("image")
        try:
            self._client.images.get(image)
        except docker.errors.ImageNotFound as exc:
            raise SandboxUnavailable(missing_image(image)) from exc
        except docker.errors.DockerException as exc:
            raise SandboxUnavailable(f"the Docker engine failed ({exc}): {FIX}") from exc
        self._settle()
        mounts = [Mount("/workspace", str(self._workspace), type="bind", read_only=False)]
        for peer, folder in sorted(peers.items()):
            folder.mkdir(parents=True, exist_ok=True)
            mounts.append(Mount(f"/peers/{peer}", str(folder.resolve()), type="bind", read_only=True))
        mounts += launch.pop("mounts")
        labels = {
            "conclave.job": job_id,
            "conclave.owner": self.owner.id,
            "conclave.owner_pid": str(self.owner.pid),
            "conclave.agent": letter,
        }
        try:
            return self._client.containers.run(
                image,
                name=f"conclave-{job_id}-{letter}-{secrets.token_hex(3)}",
                detach=True,
                init=True,
                user=keeper_user(self.uid),
                working_dir="/workspace",
                labels=labels,
                mounts=mounts,
                read_only=True,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                pids_limit=limits.pids,
                mem_limit=limits.memory,
                memswap_limit=limits.memory,  # equal to the memory limit: no swap
                nano_cpus=int(limits.cpus * 1e9),
                **launch,
            )
        except docker.errors.DockerException as exc:
            failed = (
                f"the sandbox container of agent {letter} in {job_id} did not start: {exc}; {ENGINE_NEEDS}"
            )
            raise SandboxError(failed) from exc

    def _launch(self, limits: SandboxSpec) -> dict[str, Any]:
        """The image, command, environment, network, tmpfs and extra mounts; a CLI member's sandbox extends
        them (sandbox/member.py), the confinement above stays the same."""
        return {
            "image": image_tag(limits),
            "command": ["sleep", "infinity"],
            "environment": dict(ENVIRONMENT),
            "network_mode": limits.network,
            "tmpfs": {"/tmp": TMP},
            "mounts": [],
        }

    @property
    def image_id(self) -> str:
        """The engine's ID of the image the started container runs (what its name pointed at then)."""
        if self.container is None:
            raise SandboxError("the sandbox has not started: start it before asking for its image")
        return str(self.container.attrs["Image"])

    async def exec(
        self,
        command: str,
        timeout_s: float,
        max_bytes: int | None = None,
        environment: Mapping[str, str] | None = None,
        output_cap: int | None = None,
        on_stdout: Callable[[bytes], None] | None = None,
    ) -> CommandResult:
        """Run `command` with `sh -c` in /workspace; kill it and its process group after `timeout_s`.

        With `max_bytes` (the room the job's disk budget leaves this workspace), no file may grow past it
        and the command is killed as soon as the workspace does (disk_watch.py). `environment` adds to the
        container's for this command only (a CLI member's key: not in the container's stored
        configuration); `output_cap` overrides OUTPUT_CAP for it (a CLI's JSON output). `on_stdout` hears
        each chunk of stdout as it arrives, in the exec's worker thread (a CLI member's live usage)."""
        if self.container is None or self._limiter is None:
            raise SandboxError("the sandbox is not started")
        started = time.monotonic()
        argv = self._argv(command, timeout_s)
        if max_bytes is not None:  # POSIX sh counts `ulimit -f` in 512-byte blocks
            limit = str(max(max_bytes, 0) // 512)
            argv = ["sh", "-c", 'ulimit -f "$1" || exit 125; shift; exec "$@"', "sh", limit, *argv]
        out = _Capped(output_cap or self.output_cap, on_stdout)
        with anyio.move_on_after(timeout_s + self.grace_s) as overrun:
            raw = await anyio.to_thread.run_sync(
                self._run,
                argv,
                self._generation,
                max_bytes,
                dict(environment or {}),
                out,
                abandon_on_cancel=True,
                limiter=self._limiter,
            )
        duration = time.monotonic() - started
        if overrun.cancelled_caught:
            self._generation += 1
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._restart)
                settled = await anyio.to_thread.run_sync(self._settle)
            note = (
                f"the command outlived its {timeout_s:g} s timeout and the sandbox was restarted "
                "(/workspace kept, /tmp emptied, background processes gone)"
            )
            return CommandResult(None, "", "", True, duration, (note,), settled.total_bytes)
        return described(raw, duration, timeout_s, max_bytes)

    def _argv(self, command: str, timeout_s: float) -> list[str]:
        return ["timeout", "-s", "KILL", f"{timeout_s:g}", "sh", "-c", command]

    def _run(
        self,
        argv: list[str],
        generation: int,
        max_bytes: int | None,
        environment: dict[str, str],
        out: _Capped,
    ) -> tuple[int | None, _Capped, _Capped, Settled, Watched]:
        import docker

        if os.getuid() == 0:
            self._settle()  # host-side code may have made root-owned entries since: the agent's to edit
        api = self._client.api
        err = _Capped(out.cap)
        assert self._workspace is not None
        try:
            runner = self._runner_or_none()  # before the disk watch starts: a refused command leaves none
            watcher = Watcher(self._workspace, max_bytes, lambda _reason: self._kill()).start()
            if runner is not None:
                return self._run_in(runner, argv, generation, environment, out, err, watcher)
            options = {"user": f"{self.uid}:{self.gid}", "workdir": "/workspace", "environment": environment}
            try:
                exec_id = api.exec_create(self.container.id, argv, **options)
            except docker.errors.APIError as exc:
                if "is not running" not in str(exc):
                    raise
                self._restart()  # e.g. its keeper was killed: come back once, workspace intact
                exec_id = api.exec_create(self.container.id, argv, **options)
            try:
                for chunk_out, chunk_err in api.exec_start(exec_id["Id"], stream=True, demux=True):
                    out.add(chunk_out)
                    err.add(chunk_err)
                exit_code = api.exec_inspect(exec_id["Id"]).get("ExitCode")
            finally:
                watched = watcher.finish()
                if generation == self._generation and not self._nothing_left():  # else abandoned: restarted
                    self._reap()
            return exit_code, out, err, self._settle(), watched
        except docker.errors.DockerException as exc:
            raise SandboxError(f"the command could not run in the sandbox: {exc}") from exc

    def _run_in(
        self,
        runner: Runner,
        argv: list[str],
        generation: int,
        environment: dict[str, str],
        out: _Capped,
        err: _Capped,
        watcher: Watcher,
    ) -> tuple[int | None, _Capped, _Capped, Settled, Watched]:
        """`_run` through the container's runner, which reaps after the command itself."""
        try:
            try:
                exit_code, reaped = runner.run(argv, environment, out, err)
            except RunnerGone as gone:  # before the command started: the container stopped meanwhile
                self._runner_slot.drop(runner)
                again = None if gone.started else self._runner_or_none()  # (which restarts it)
                if again is None:
                    raise
                runner = again
                exit_code, reaped = runner.run(argv, environment, out, err)
        except RunnerGone:  # killed (by the command, the disk watcher, a restart): reap by an exec
            exit_code, reaped = 137, False
            self._runner_slot.drop(runner)
        finally:
            watched = watcher.finish()
        if self.container is None:  # stopped meanwhile (a cancelled job's command): nothing to reap
            return exit_code, out, err, Settled(), watched
        if not reaped and generation == self._generation and not self._nothing_left():
            self._reap()
        return exit_code, out, err, self._settle(), watched

    def _runner_or_none(self) -> Runner | None:
        container = self.container
        if container is None:  # stopped meanwhile (a cancelled job's command)
            raise SandboxStopped()
        api, user = self._client.api, f"{self.uid}:{self.gid}"
        return self._runner_slot.get(api, container.id, user, self._restart)

    def _nothing_left(self) -> bool:
        """Whether the host sees only the keeper left in the container (leftovers.py); False when unsure."""
        if self.reap_always:
            return False
        self._cgroup = self._cgroup or cgroup_of(self.container.id)
        return self._cgroup is not None and nothing_left(self._cgroup)

    def _reap(self) -> None:
        """Kill every process the command left behind (leftovers.REAP); restart the container if any stays."""
        if not reap(self._client.api, self.container.id, f"{self.uid}:{self.gid}"):
            self._restart()

    def _settle(self) -> Settled:
        """Clear unsafe mode bits, hand entries to the command user (as root), measure (files/safe.py)."""
        if self._workspace is None:
            return Settled()
        return settle(self._workspace, (self.uid, self.gid) if os.getuid() == 0 else None)

    def _kill(self) -> None:
        """Stop every process in the container at once (the disk watcher's cap); `_reap` restarts it."""
        import docker

        kill_user_processes(self.container.id, self.uid)  # at once from the host where it can
        try:
            self.container.kill()
            self.container.wait(timeout=30, condition="not-running")  # the kill lands after the call returns
        except (docker.errors.APIError, OSError):
            pass  # already stopped, or it did not stop in time: `_reap` restarts it either way

    def _restart(self) -> None:
        import docker

        self._runner_slot.close()
        with contextlib.suppress(docker.errors.APIError):  # already stopped
            self.container.kill()
        self.container.start()

    async def kill_all(self) -> None:
        """Kill every process of the command user now (a cancelled CLI member's whole tree, `setsid`
        escapees included: see REAP); restarts the container if any stays."""
        if self.container is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._reap)

    async def stop(self) -> None:
        """Remove the container (force), then close the client `start` connected; safe to call twice or
        before `start`."""
        try:
            await self._remove()
        finally:
            await self._release()

    async def _remove(self) -> None:
        container, self.container = self.container, None
        self._runner_slot.end()
        if container is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(remove_container, container)

    async def _release(self) -> None:
        """Close the engine client `start` connected: each holds a connection, for the server's life."""
        client = self._client if self._own_client else None
        if client is not None:
            self._client = None
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(client.close)
