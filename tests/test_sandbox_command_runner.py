"""The container's command runner (server/sandbox/command_runner.py), against the real Docker engine: commands
cost no engine exec each, a timed-out command's whole process tree is killed, a command can neither
read nor write the runner's streams, a command that kills the runner gets a new one next time, and a
runner whose first frame never comes is started again instead of holding the container's start."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from conclave.config.models import SandboxSpec
from conclave.sandbox import command_runner
from conclave.sandbox.container import Sandbox
from conclave.sandbox.engine import Owner, connect
from tests.fakes.counting_docker import CountingApi, counting_sandbox

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_image")]
# pid and name of the command user's processes but the lister and its `timeout`
LIST_MINE = (
    'for d in /proc/[0-9]*; do p=${d#/proc/}; [ -O "$d" ] && [ $p != $$ ] && [ $p != $PPID ] && '
    'echo "$p $(cat $d/comm)"; done; true'
)


@pytest.fixture
async def counted(tmp_path: Path) -> AsyncIterator[tuple[Sandbox, CountingApi]]:
    sandbox, api = counting_sandbox(Sandbox)
    try:
        await sandbox.start(tmp_path, {}, "cj-test", "A", SandboxSpec(memory="256m", cpus=1, pids=64))
        yield sandbox, api
    finally:
        with anyio.CancelScope(shield=True):
            await sandbox.stop()


async def mine(sandbox: Sandbox) -> dict[str, str]:
    """The command user's processes (pid: name) but the lister's own."""
    listing = await sandbox.exec(LIST_MINE, timeout_s=10)
    return dict(line.split(" ", 1) for line in listing.stdout.splitlines())


async def test_commands_go_through_one_runner_started_with_the_container(
    counted: tuple[Sandbox, CountingApi],
) -> None:
    sandbox, api = counted
    assert api.execs == 1  # the runner, started by `start`
    first = await sandbox.exec("echo out; echo err >&2; exit 3", timeout_s=10)
    assert (first.exit_code, first.stdout, first.stderr) == (3, "out\n", "err\n")
    env = await sandbox.exec('echo "$SECRET:$HOME"; pwd', timeout_s=10, environment={"SECRET": "s3"})
    assert env.stdout == "s3:/workspace\n/workspace\n"
    assert (await sandbox.exec('echo "${SECRET:-unset}"', timeout_s=10)).stdout == "unset\n"  # per command
    assert api.execs == 1  # three commands, no exec of their own


async def test_a_timed_out_command_has_its_process_tree_killed(counted: tuple[Sandbox, CountingApi]) -> None:
    sandbox, api = counted
    result = await sandbox.exec("sleep 300 & setsid sleep 301 >/dev/null 2>&1 & (sleep 302 &); sleep 60", 1)
    assert result.timed_out and result.exit_code == 137
    assert list((await mine(sandbox)).values()) == ["python3"]  # the runner alone
    assert api.execs == 1  # reaped by the runner, no restart


async def test_a_command_cannot_reach_the_runners_streams_or_memory(
    counted: tuple[Sandbox, CountingApi],
) -> None:
    sandbox, _ = counted
    (runner,) = [pid for pid, name in (await mine(sandbox)).items() if name == "python3"]
    for probe_command in (f"ls /proc/{runner}/fd", f"cat /proc/{runner}/environ", f"cat /proc/{runner}/mem"):
        probe = await sandbox.exec(f"{probe_command} > /dev/null || echo denied", timeout_s=10)
        assert "denied" in probe.stdout and "Permission denied" in probe.stderr, probe.as_text()
    forged = await sandbox.exec(f"printf 'X\\0\\0\\0\\5\\0\\0\\0\\0\\1' > /proc/{runner}/fd/1; exit 7", 10)
    assert forged.exit_code == 7


async def test_a_command_that_kills_the_runner_gets_a_new_one(counted: tuple[Sandbox, CountingApi]) -> None:
    sandbox, api = counted
    killed = await sandbox.exec("kill -KILL -1; sleep 5", timeout_s=10)
    assert killed.exit_code == 137 and not killed.timed_out
    after = await sandbox.exec("echo after", timeout_s=10)
    assert (after.exit_code, after.stdout) == (0, "after\n")
    assert list((await mine(sandbox)).values()) == ["python3"]  # the new runner, nothing else
    assert api.execs >= 2  # a new runner (and the reaping exec, when the host could not see the cgroup)


class SilentFirstRunner(CountingApi):
    """The real API, but the container's first runner is a process that never answers: what the host saw
    when Podman 4.3 dropped what an exec wrote before its attach was joined (command_runner.py)."""

    def exec_create(self, container: str, cmd: Any, **options: Any) -> Any:
        if not self.commands and cmd[:2] == ["python3", "-I"]:
            cmd = ["sleep", "120"]
        return super().exec_create(container, cmd, **options)


@pytest.mark.timeout(120)  # before the fix `start` waited for the first runner's `R` for ever
async def test_a_runner_that_never_says_it_is_ready_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(command_runner, "READY_S", 2.0)  # 15 s, made short to watch it pass
    client = connect()
    api = client.api = SilentFirstRunner(client.api)
    sandbox = Sandbox(client, Owner("test-" + os.urandom(4).hex()))
    try:
        await sandbox.start(tmp_path, {}, "cj-test", "A", SandboxSpec(memory="256m", cpus=1, pids=64))
        result = await sandbox.exec("echo ok", timeout_s=10)
        assert (result.exit_code, result.stdout) == (0, "ok\n")
        assert api.commands[0] == ["sleep", "120"] and api.execs == 2  # the silent one, then a runner
        assert list((await mine(sandbox)).values()) == ["python3"]  # the runner; the silent one reaped
    finally:
        with anyio.CancelScope(shield=True):
            await sandbox.stop()


async def test_a_sandbox_starts_and_runs_in_a_process_holding_over_1024_descriptors(tmp_path: Path) -> None:
    """A busy server holds many sockets: the runner's stream then has a descriptor past 1024, which
    select() refuses (every job of a long suite run failed so); the runner waits with poll."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"this process may open at most {hard} files: no descriptor can pass 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    sandbox, _ = counting_sandbox(Sandbox)
    try:
        await sandbox.start(tmp_path, {}, "cj-test", "A", SandboxSpec(memory="256m", cpus=1, pids=64))
        assert (await sandbox.exec("echo fine", timeout_s=10)).stdout == "fine\n"
    finally:
        with anyio.CancelScope(shield=True):
            await sandbox.stop()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _sockets() -> int:
    """This process's open sockets (the listing's own descriptor is gone by the time it is read)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


async def test_a_stopped_sandbox_leaves_no_connection_to_the_engine(tmp_path: Path) -> None:
    """A server starts sandboxes for every job; each connected its own engine client, and stopping it
    left the client's connections open: a long suite run held over 700 sockets to the engine."""
    before = _sockets()
    for _ in range(3):
        sandbox = Sandbox()
        await sandbox.start(tmp_path, {}, "cj-test", "A", SandboxSpec(memory="256m", cpus=1, pids=64))
        assert (await sandbox.exec("echo fine", timeout_s=10)).stdout == "fine\n"
        await sandbox.stop()
    assert _sockets() <= before
