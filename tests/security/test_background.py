"""Agents' background processes do not outlive their command: not a `&` child, not a `setsid` escapee, not
a fork loop; and the container's keeper survives the cleanup (no restart needed). Both ways commands
run: through the container's runner (sandbox/command_runner.py), and one exec each (an image without it)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from conclave.sandbox.command_runner import RUNNER
from conclave.sandbox.container import Sandbox
from conclave.sandbox.engine import Owner, connect
from tests.security.conftest import SPEC

pytestmark = pytest.mark.anyio


class ExecSandbox(Sandbox):
    use_runner = False


@pytest.fixture(params=["runner", "exec"])
async def box(request: pytest.FixtureRequest, docker_image: str, workspace: Path) -> AsyncIterator[Sandbox]:
    sandbox = (Sandbox if request.param == "runner" else ExecSandbox)(
        connect(), Owner("bg-" + os.urandom(4).hex())
    )
    try:
        await sandbox.start(workspace, {}, "cj-security", "A", SPEC)
        yield sandbox
    finally:
        with anyio.CancelScope(shield=True):
            await sandbox.stop()


async def survivors(box: Sandbox) -> list[str]:
    """Command lines of the processes running as the command user, other than the lister itself and the
    container's command runner (sandbox/command_runner.py), which is meant to stay."""
    listing = await box.exec(
        'for d in /proc/[0-9]*; do [ -O "$d" ] && [ "${d#/proc/}" != "$$" ] && '
        'tr "\\0\\n" "  " < "$d/cmdline" && echo; done',
        timeout_s=10,
    )
    runner = " ".join(["python3", "-I", "-c", RUNNER]).replace("\n", " ").strip()
    lines = [line.strip() for line in listing.stdout.splitlines()]
    assert (runner in lines) == box.use_runner, lines  # else the test would not show what it claims
    return [line for line in lines if line and "/proc/[0-9]" not in line and line != runner]


async def test_setsid_escapees_and_fork_loops_die_with_their_command(box: Sandbox, workspace: Path) -> None:
    marker = await box.exec("echo here > /tmp/keeper-marker", timeout_s=10)
    assert marker.exit_code == 0
    started = await box.exec(
        "setsid sh -c 'while :; do date +%s%N > /workspace/b.tmp; mv /workspace/b.tmp /workspace/beat; "
        "sleep 0.05; done' "
        ">/dev/null 2>&1 & "
        "setsid sh -c 'while :; do (sleep 300 &); sleep 0.01; done' >/dev/null 2>&1 & "
        "nohup sleep 301 >/dev/null 2>&1 & "
        "while [ ! -s /workspace/beat ]; do sleep 0.01; done; echo started",  # the loop ran before the end
        timeout_s=10,
    )
    assert started.stdout == "started\n", started.as_text()
    before = (workspace / "beat").read_text()
    assert before.strip().isdigit(), "the background loop never ran: the test would prove nothing"
    # The loop beats every 0.05 s: a second is 20 beats it would have written.
    await anyio.sleep(1.0)  # sleep-ok: watching for writes that must not come
    after = (workspace / "beat").read_text()
    assert before == after, "a background loop kept writing after its command returned"
    assert await survivors(box) == []
    kept = await box.exec("cat /tmp/keeper-marker", timeout_s=10)
    assert kept.stdout == "here\n", "the container was restarted instead of cleaned"


async def test_a_timed_out_command_leaves_no_process_behind(box: Sandbox) -> None:
    result = await box.exec("setsid sleep 302 >/dev/null 2>&1 & sleep 60", timeout_s=1)
    assert result.timed_out
    assert await survivors(box) == []
