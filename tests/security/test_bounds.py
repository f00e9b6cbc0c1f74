"""Queue and storage are bounded: at most CONCLAVE_MAX_QUEUED waiting jobs, a per-job disk budget for the
agents' workspaces (writes past it are tool errors), and old jobs pruned by age, then by size."""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio
import pytest

from conclave.errors import QueueFull
from conclave.files.agent_tools import AgentTools
from conclave.files.disk_budget import MB, DiskBudget
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.jobs.store.sql import Store
from conclave.jobs.upkeep.pruning import prune
from conclave.sandbox.container import Sandbox
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.new_jobs import new_job
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, install, voter, write_team

pytestmark = pytest.mark.anyio
SOLO = (("openai", "ann"),)


async def test_past_the_queue_bound_a_job_is_refused_with_the_setting_named(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    install(fakes.script, SOLO, voter(delay=5))
    team = str(write_team(tmp_path / "team.yaml", fakes, SOLO))
    settings = Settings(home=tmp_path / "state", max_jobs=1, max_queued=1)
    async with JobService.serve(environment_of(settings, {KEY_ENV: "k-0123456789"})) as service:
        first = await service.submit(JobRequest(task="one", team=team))
        with anyio.fail_after(20):
            while (await service.lookup.view(first.job_id)).state == "queued":
                await anyio.sleep(0.05)
        second = await service.submit(JobRequest(task="two", team=team))
        assert second.state == "queued"
        with pytest.raises(QueueFull, match="CONCLAVE_MAX_QUEUED=1"):
            await service.submit(JobRequest(task="three", team=team))
        for job in (second, first):
            await service.cancel(job.job_id)


async def test_writes_past_the_jobs_disk_budget_are_tool_errors(tmp_path: Path) -> None:
    budget = DiskBudget(limit=1 * MB)
    a, b = tmp_path / "A", tmp_path / "B"
    a.mkdir(), b.mkdir()
    budget.measured("A", 0), budget.measured("B", 0)
    tools_a = AgentTools(a, peers=dict, disk=budget.agent("A")).handlers()
    tools_b = AgentTools(b, peers=dict, disk=budget.agent("B")).handlers()
    assert (await tools_a["write_file"]({"path": "x", "content": "a" * 600_000})).startswith("wrote")
    refused = await tools_b["write_file"]({"path": "y", "content": "b" * 600_000})  # the budget is the job's
    assert (
        refused.startswith("Error:")
        and "disk budget of 1 MB" in refused
        and "CONCLAVE_JOB_DISK_MB" in refused
    )
    assert not (b / "y").exists()
    assert (await tools_a["write_file"]({"path": "x", "content": "small"})).startswith(
        "wrote"
    )  # shrinking is fine
    assert (await tools_b["write_file"]({"path": "y", "content": "b" * 600_000})).startswith("wrote")


async def test_a_command_that_fills_the_workspace_is_stopped_at_the_budget_and_blocks_further_writes(
    box: Sandbox, workspace: Path
) -> None:
    budget = DiskBudget(limit=1 * MB)
    tools = AgentTools(workspace, peers=dict, sandbox=box, disk=budget.agent("A")).handlers()
    ran = await tools["run_command"]({"command": "head -c 2000000 /dev/zero > big.bin && echo done"})
    assert "done" not in ran and "disk budget" in ran, ran  # stopped during the command (disk_watch.py)
    assert (workspace / "big.bin").stat().st_size <= 1 * MB
    refused = await tools["write_file"]({"path": "more.txt", "content": "x"})
    assert refused.startswith("Error:") and "disk budget" in refused


def test_gc_prunes_finished_jobs_by_age_then_size_and_never_an_active_one(tmp_path: Path) -> None:
    now = time.time()  # prune's clock: the store's is set back to make the jobs old
    clock = [now - 40 * 86400]
    store = Store(tmp_path / "conclave.db")
    store._clock = lambda: clock[0]
    jobs = tmp_path / "jobs"
    for job_id, age_days, size, state in [
        ("cj-000000000001", 40, 10, "completed"),
        ("cj-000000000002", 5, 3000, "failed"),
        ("cj-000000000003", 1, 3000, "completed"),
        ("cj-000000000004", 50, 10, "running"),
    ]:
        clock[0] = now - age_days * 86400
        store.create_job(new_job(job_id, "t"), os.getpid(), "owner")
        store.set_state(job_id, state)
        (jobs / job_id).mkdir(parents=True)
        (jobs / job_id / "data").write_bytes(b"x" * size)
    report = prune(store, jobs, keep_days=30, max_bytes=4000)
    assert report.removed == ["cj-000000000001", "cj-000000000002"]  # too old; then the oldest over size
    assert store.job("cj-000000000001") is None and not (jobs / "cj-000000000001").exists()
    assert store.job("cj-000000000003") is not None and (jobs / "cj-000000000003").exists()
    assert store.job("cj-000000000004") is not None and (jobs / "cj-000000000004").exists()  # still running
    store.close()


def test_conclave_gc_prunes_with_the_settings_or_its_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conclave.cli.main import main

    home = tmp_path / "home"
    store = Store.of(Settings(home=home))
    store._clock = lambda: 1000.0  # finished long ago
    store.create_job(new_job("cj-00000000000a", "t"), os.getpid(), "owner")
    store.set_state("cj-00000000000a", "completed")
    store.close()
    (home / "jobs" / "cj-00000000000a").mkdir(parents=True)
    monkeypatch.setenv("CONCLAVE_HOME", str(home))
    assert main(["gc", "--dry-run"]) == 0
    assert "would have removed 1 job," in capsys.readouterr().out
    assert (home / "jobs" / "cj-00000000000a").exists()
    assert main(["gc", "--keep-days", "1"]) == 0
    assert "removed 1 job," in capsys.readouterr().out and not (home / "jobs" / "cj-00000000000a").exists()
