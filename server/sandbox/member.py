"""A coding-agent CLI member's container: the plain sandbox, with no network but its egress bridge.

    allow = allowlist_for("codex", base_url=agent.base_url, extra=extra_hosts)
    async with egress_proxy(allow, route=route, label=f"{job}/{letter}") as proxy:
        sandbox = MemberSandbox(client, owner, proxy)
        try:
            await sandbox.start(workspace, peers, job_id, letter, limits)
            result = await sandbox.exec("codex exec ... </dev/null", timeout_s=600, environment=secrets)
        finally:
            with anyio.CancelScope(shield=True):
                await sandbox.stop()

Everything container.py confines stays (read-only root, cap_drop ALL, no-new-privileges, limits, uid 1000,
init, the reaping after each command). What differs:
- `network_mode` is always `none`, whatever the team's sandbox says: the only way out is the bridge.
- The container's keeper (uid nobody, which the agent's commands cannot signal) runs the member's relay
  (sandbox/egress_channel.py) in one exec: it listens on 127.0.0.1:3128 and carries each connection over
  the engine's API to the member's proxy (sandbox/egress.py), so nothing but plain folders is shared with
  the engine. `start` returns once that port listens. HTTPS_PROXY, HTTP_PROXY and their lower-case
  forms point there; NODE_USE_ENV_PROXY=1 makes Node's own fetch use them too. NO_PROXY is left unset: no
  host is reached directly, and a client that bypasses the proxy finds nothing to connect to.
- HOME is /home/sandbox, a private tmpfs (mode 0700, owned by the command user) that dies with the
  container: the place for the CLI's login files, its caches and its leftovers (XDG_* point into it).
  Podman's tmpfs mounts take no uid= option (4.3 refuses it), so there HOME is a tmpfs volume of the
  member's own (the local driver passes uid/gid/mode to mount(2); Podman refuses its size= option, so the
  container's memory limit caps it: tmpfs pages count against it), removed with the container.
- The image is the CLI image (`conclave sandbox build --clis`, sandbox/clis_image.py) unless the team names
  its own, which then needs python3 (for the relay).
A key never enters the container: a member that logs in with one gets a placeholder and the bridge as its
base URL, and its proxy adds the key on the host (`EgressProxy.serve_key`, sandbox/provider_key.py). Login
files (plan logins) go into HOME with `write_home_file` (through an exec: `docker cp` cannot write a
tmpfs), and their variables in `exec(..., environment=...)`, never in the container's stored configuration.
"""

from __future__ import annotations

import base64
import secrets
import shlex
from pathlib import PurePosixPath
from typing import Any, NoReturn

import anyio.to_thread

from conclave.config.models import SandboxSpec
from conclave.errors import SandboxError
from conclave.sandbox.container import ENVIRONMENT, Sandbox, keeper_user
from conclave.sandbox.disk_watch import kill_user_processes
from conclave.sandbox.egress import EgressProxy
from conclave.sandbox.egress_channel import EgressChannel
from conclave.sandbox.engine import PROCESS_OWNER, Owner, is_podman, remove_volume
from conclave.sandbox.image import IMAGE_REPO
from conclave.sandbox.provider_key import BRIDGE_PORT
from conclave.sandbox.route import CA_PATH, ca_environment

__all__ = ["HOME", "PROXY_PORT", "PROXY_URL", "MemberSandbox", "member_environment"]

PROXY_PORT = BRIDGE_PORT
PROXY_URL = f"http://127.0.0.1:{PROXY_PORT}"
HOME = "/home/sandbox"
BRIDGE_WAIT_S = 10.0  # for the relay to listen, as `_AWAIT_BRIDGE` waits after a restart
HOME_SIZE = "1g"  # a cap, not a reservation: Copilot alone unpacks ~235 MB into its cache on first run
# 127.0.0.1:3128 listening, as /proc/net/tcp writes it (address:port in hex, state 0A)
_LISTENING = f"0100007F:{PROXY_PORT:04X} 00000000:0000 0A"
_AWAIT_BRIDGE = (
    f"i=0; until grep -q '{_LISTENING}' /proc/net/tcp; "
    "do i=$((i+1)); [ $i -gt 200 ] && exit 1; sleep 0.05; done"
)


def member_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The container's environment for a CLI member: the plain sandbox's, HOME on its tmpfs, the proxy."""
    return {
        **ENVIRONMENT,
        "HOME": HOME,
        "XDG_CACHE_HOME": f"{HOME}/.cache",
        "XDG_CONFIG_HOME": f"{HOME}/.config",
        "XDG_DATA_HOME": f"{HOME}/.local/share",
        "XDG_STATE_HOME": f"{HOME}/.local/state",
        "HTTPS_PROXY": PROXY_URL,
        "HTTP_PROXY": PROXY_URL,
        "https_proxy": PROXY_URL,
        "http_proxy": PROXY_URL,
        "NODE_USE_ENV_PROXY": "1",
        **(extra or {}),
    }


class MemberSandbox(Sandbox):
    """One CLI member's container for one job; `start`, `exec`, `stop` as for `Sandbox`."""

    reap_always = True  # its relay starts threads per connection: a count of tasks proves nothing here
    use_runner = False  # a CLI turn runs for minutes: an exec each costs it nothing

    def __init__(
        self,
        client: Any | None,
        owner: Owner = PROCESS_OWNER,
        egress: EgressProxy | None = None,
    ) -> None:
        """`egress`: the member's egress proxy, which its relay is attached to, and whose count of admitted
        connections says whether a CLI run reached its provider at all (clis/member.py charges no
        estimate for one that did not). Its image is the CLI image, or the team's own when it names one.
        The container trusts the extra CA of the proxy's route, if it has one (sandbox/route.py): its
        tunnels end where the route sends them."""
        super().__init__(client, owner)
        if egress is None:
            raise SandboxError("a CLI member's sandbox needs its egress proxy")
        self.egress = egress
        self._volumes: list[str] = []  # HOME's volume on Podman, removed by `stop`
        self._channel: EgressChannel | None = None

    def _launch(self, limits: SandboxSpec) -> dict[str, Any]:
        from docker.types import Mount

        from conclave.sandbox.clis_image import clis_tag

        launch = super()._launch(limits)
        home = f"rw,exec,nosuid,nodev,size={HOME_SIZE},mode=0700,uid={self.uid},gid={self.gid}"
        mounts = []
        tmpfs = {**launch["tmpfs"], HOME: home}
        if is_podman(self._client):
            del tmpfs[HOME]
            mounts.append(Mount(HOME, self._home_volume(), type="volume"))
        environment: dict[str, str] = {}
        if (ca := self.egress.route.extra_ca) is not None:
            mounts.append(Mount(CA_PATH, str(ca.resolve()), type="bind", read_only=True))
            environment.update(ca_environment())
        launch.update(
            image=launch["image"] if limits.image != IMAGE_REPO else clis_tag(),
            environment=member_environment(environment),
            network_mode="none",
            tmpfs=tmpfs,
            mounts=mounts,
        )
        return launch

    def _home_volume(self) -> str:
        """Create the member's HOME as a tmpfs volume of its own (Podman; see the module docstring)."""
        import docker

        name = f"conclave-home-{secrets.token_hex(6)}"
        options = {"type": "tmpfs", "device": "tmpfs", "o": f"uid={self.uid},gid={self.gid},mode=0700"}
        options["o"] += ",nosuid,nodev"
        labels = {"conclave.owner": self.owner.id, "conclave.owner_pid": str(self.owner.pid)}
        try:
            self._client.volumes.create(name, driver="local", driver_opts=options, labels=labels)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"could not create the CLI member's HOME volume {name}: {exc}") from exc
        self._volumes.append(name)
        return name

    async def stop(self) -> None:
        """End the relay's channel, remove the container as `Sandbox.stop` does, then the HOME volume it
        had (Podman)."""
        if self._channel is not None:
            self._channel.close()
        try:
            await self._remove()
        finally:
            volumes, self._volumes = self._volumes, []
            try:
                with anyio.CancelScope(shield=True):
                    for name in volumes:
                        await anyio.to_thread.run_sync(remove_volume, self._client, name)
            finally:
                await self._release()

    async def start(self, *args: Any, **kwargs: Any) -> Any:
        """`Sandbox.start`, then attach its relay to the proxy and wait (a few seconds at most) until it
        listens."""
        container = await super().start(*args, **kwargs)
        self._channel = EgressChannel(
            self._client.api, container.id, keeper_user(self.uid), label=self.egress.label
        )
        try:
            self.egress.attach(self._channel.serve)
            if not await self._channel.listening(BRIDGE_WAIT_S):
                self._bridge_failed()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.stop()
            raise
        return container

    async def write_home_file(self, path: str, data: bytes) -> None:
        """Write `data` to `$HOME/path` (mode 0600, folders 0700) as the command user: a login file.

        The bytes travel in the exec's environment (readable only by that user's processes, never in the
        container's stored configuration); `docker cp` cannot reach a tmpfs. Limit: 96 KB.
        """
        parts = PurePosixPath(path).parts
        if not parts or PurePosixPath(path).is_absolute() or ".." in parts or len(data) > 96_000:
            raise SandboxError(
                f"cannot write {path!r} into the member's HOME: give a relative path, files < 96 KB"
            )
        script = 'umask 077; mkdir -p "$(dirname "$1")" && printf %s "$CONCLAVE_FILE" | base64 -d > "$1"'
        result = await self.exec(
            f"sh -c {shlex.quote(script)} sh {shlex.quote(f'{HOME}/{path}')}",
            timeout_s=30,
            environment={"CONCLAVE_FILE": base64.b64encode(data).decode()},
        )
        if result.exit_code != 0:
            raise SandboxError(f"could not write {path!r} into the member's HOME: {result.as_text()}")

    async def kill_all(self) -> None:
        """Kill every process of the command user at once from the host (a cancelled CLI run's whole
        tree, `setsid` children too); the exec then ends and its own reaping (container.py) sweeps up.
        Not a reaping exec of its own here: two at once kill each other (`kill -1`), and the loser's
        failure would restart the container under the ending exec. Where the host cannot signal the
        container's processes, the reaping exec it is."""
        if self.container is None:
            return
        with anyio.CancelScope(shield=True):
            if not await anyio.to_thread.run_sync(kill_user_processes, self.container.id, self.uid):
                await super().kill_all()

    def _restart(self) -> None:
        super()._restart()
        self._await_bridge()  # its relay's exec ended with the container: the channel starts another

    def _await_bridge(self) -> None:
        api = self._client.api
        exec_id = api.exec_create(self.container.id, ["sh", "-c", _AWAIT_BRIDGE], user=keeper_user(self.uid))
        api.exec_start(exec_id["Id"])
        if api.exec_inspect(exec_id["Id"]).get("ExitCode") != 0:
            self._bridge_failed()

    def _bridge_failed(self) -> NoReturn:
        raise SandboxError(
            f"the egress relay (on 127.0.0.1:{PROXY_PORT}) did not start in the CLI member's "
            "container: the image needs python3 (`conclave sandbox build --clis` builds one), and the "
            "engine's API a unix socket or plain TCP (the log says which failed)"
        )
