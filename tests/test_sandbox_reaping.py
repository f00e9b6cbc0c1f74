"""Where a container has no command runner (sandbox/command_runner.py: an image without python3), the reaping
exec after a command is skipped only when the host sees nothing left in the container
(server/sandbox/leftovers.py), against the real Docker engine: what a command leaves is still reaped."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from conclave.config.models import SandboxSpec
from conclave.sandbox.container import Sandbox
from conclave.sandbox.leftovers import REAP, cgroup_of, nothing_left
from tests.fakes.counting_docker import CountingApi, counting_sandbox

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_image")]
# the names of the command user's processes but the lister and its `timeout`
LIST_MINE = (
    'for d in /proc/[0-9]*; do p=${d#/proc/}; [ -O "$d" ] && [ $p != $$ ] && [ $p != $PPID ] && cat $d/comm; '
    "done; true"
)


class ExecSandbox(Sandbox):
    """A sandbox whose commands are one exec each, as in an image that cannot run the runner."""

    use_runner = False


def reaps(api: CountingApi) -> int:
    return sum(cmd == ["sh", "-c", REAP] for cmd in api.commands)


@pytest.fixture
async def counted(tmp_path: Path) -> AsyncIterator[tuple[Sandbox, CountingApi]]:
    sandbox, api = counting_sandbox(ExecSandbox)
    try:
        await sandbox.start(tmp_path, {}, "cj-test", "A", SandboxSpec(memory="256m", cpus=1, pids=64))
        if cgroup_of(sandbox.container.id) is None:
            pytest.skip(
                "this host cannot see the container's pids cgroup: every command is reaped by an exec"
            )
        yield sandbox, api
    finally:
        with anyio.CancelScope(shield=True):
            await sandbox.stop()


async def test_a_command_that_leaves_nothing_costs_no_reaping_exec(
    counted: tuple[Sandbox, CountingApi],
) -> None:
    sandbox, api = counted
    for command in ("true", "echo hi > /workspace/a.txt", "sleep 0.1 & wait"):
        assert (await sandbox.exec(command, timeout_s=10)).exit_code == 0
    assert reaps(api) == 0


async def test_what_a_command_leaves_is_still_reaped(counted: tuple[Sandbox, CountingApi]) -> None:
    sandbox, api = counted
    left = await sandbox.exec("setsid sleep 300 >/dev/null 2>&1 & (sleep 301 &); echo started", timeout_s=10)
    assert left.stdout == "started\n" and reaps(api) == 1
    assert (await sandbox.exec(LIST_MINE, timeout_s=10)).stdout == ""  # both sleeps gone
    timed_out = await sandbox.exec("setsid sleep 302 >/dev/null 2>&1 & sleep 60", timeout_s=1)
    assert timed_out.timed_out and reaps(api) == 2
    assert (await sandbox.exec(LIST_MINE, timeout_s=10)).stdout == ""


async def test_only_the_keeper_alone_counts_as_nothing_left(
    counted: tuple[Sandbox, CountingApi], tmp_path: Path
) -> None:
    """A running command, or a count the task list does not match (a fork in flight, a zombie), is not
    'nothing left'; the keeper alone is."""
    sandbox, _ = counted
    cgroup = cgroup_of(sandbox.container.id)
    assert cgroup is not None
    with anyio.fail_after(10):  # start's own execs may still be leaving the container under load
        while not await anyio.to_thread.run_sync(nothing_left, cgroup):
            await anyio.sleep(0.02)  # until only the keeper is left
    async with anyio.create_task_group() as tg:
        tg.start_soon(sandbox.exec, "sleep 2", 10)
        with anyio.fail_after(10):
            while await anyio.to_thread.run_sync(nothing_left, cgroup):
                await anyio.sleep(0.02)  # until the command's process is in the container
        assert not await anyio.to_thread.run_sync(nothing_left, cgroup)
    assert await anyio.to_thread.run_sync(nothing_left, cgroup)
    seen = tmp_path / "seen"  # the same tasks, and a count one higher than the list
    seen.mkdir()
    tasks = (cgroup / "tasks") if (cgroup / "tasks").is_file() else (cgroup / "cgroup.threads")
    (seen / "tasks").write_text(tasks.read_text())
    (seen / "pids.current").write_text(str(int((cgroup / "pids.current").read_text()) + 1))
    assert not nothing_left(seen)
    (seen / "pids.current").write_text((cgroup / "pids.current").read_text())
    assert nothing_left(seen)
    (seen / "tasks").write_text(f"{tasks.read_text()}{os.getpid()}\n")  # a task of another uid (ours)
    (seen / "pids.current").write_text(str(int((cgroup / "pids.current").read_text()) + 1))
    assert not nothing_left(seen)
