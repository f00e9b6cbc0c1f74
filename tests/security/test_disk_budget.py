"""The job's disk budget holds during a command, not after it: one big write, many files written fast,
and a second command after the first, all against a real container (server/sandbox/disk_watch.py).
The overshoot itself is measured in bench/bench_disk.py (bench/results/disk.json), never asserted as a
timing here; the margin below is generous on purpose (a loaded machine polls later)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conclave.files.agent_tools import AgentTools
from conclave.files.disk_budget import MB, DiskBudget
from conclave.sandbox.container import Sandbox
from conclave.sandbox.disk_watch import measure

pytestmark = pytest.mark.anyio
LIMIT = 64 * MB
MARGIN = 64 * MB  # far below what the attacks write (600 MB, then 300 MB more)


def tools(box: Sandbox, workspace: Path) -> tuple[DiskBudget, dict]:  # type: ignore[type-arg]
    budget = DiskBudget(limit=LIMIT)
    budget.measured("A", 0)
    return budget, AgentTools(workspace, peers=dict, sandbox=box, disk=budget.agent("A")).handlers()


async def test_one_command_cannot_write_600_mb_past_a_64_mb_budget(box: Sandbox, workspace: Path) -> None:
    _, handlers = tools(box, workspace)
    ran = await handlers["run_command"](
        {"command": "head -c 600000000 /dev/zero > big.bin; echo exit=$?", "timeout_s": 120}
    )
    size = measure(workspace)
    assert size <= LIMIT + MARGIN, f"{size / MB:.0f} MB written past a {LIMIT / MB:.0f} MB budget: {ran}"
    assert "disk budget" in ran, ran
    again = await handlers["run_command"](
        {"command": "head -c 300000000 /dev/zero > more.bin", "timeout_s": 120}
    )
    assert measure(workspace) <= LIMIT + MARGIN, again


async def test_many_files_written_fast_are_stopped_at_the_cap_too(box: Sandbox, workspace: Path) -> None:
    _, handlers = tools(box, workspace)
    script = (
        "i=0; while [ $i -lt 200 ]; do head -c 3000000 /dev/zero > f$i.bin || break; i=$((i+1)); done; "
        "echo wrote $i"
    )
    ran = await handlers["run_command"]({"command": script, "timeout_s": 120})
    size = measure(workspace)
    assert size <= LIMIT + MARGIN, f"{size / MB:.0f} MB in {ran}"
    assert "killed" in ran and "disk budget" in ran, ran
    after = await handlers["run_command"]({"command": "echo still here", "timeout_s": 30})
    assert "still here" in after  # the sandbox came back for the next command
