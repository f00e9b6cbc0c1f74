"""The server's pool of check containers (coordination/check_pool.py), against the real Docker engine:
a job's first check runs in a container started before the job was submitted, the pool starts another
for the next job, and a server that stops removes what its pool holds; a dead server's pool folder is
removed by the next one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from conclave.coordination.check_pool import JOB_LABEL, reap_folders
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.sandbox.engine import PROCESS_OWNER
from conclave.settings import Settings
from tests.fakes.calc_task import TASK, agent
from tests.fakes.environment import environment_of
from tests.fakes.server import FakeProviders
from tests.fakes.team import write_team
from tests.fakes.waits import until_done
from tests.test_verify import ENV, FAST

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_image")]
POOLED = {"label": [f"conclave.job={JOB_LABEL}", f"conclave.owner={PROCESS_OWNER.id}"]}


def pooled() -> list[Any]:
    import docker

    return docker.from_env().containers.list(all=True, ignore_removed=True, filters=POOLED)


def started(container: Any) -> bool:
    """Running, with its command runner up: the last step of `Sandbox.start` (sandbox/command_runner.py)."""
    import docker

    if container.status != "running":
        return False
    try:
        rows = container.top().get("Processes") or []
    except docker.errors.NotFound:  # removed since it was listed: the job that took it has ended
        return False
    return any("python3 -I" in " ".join(row) for row in rows)


async def pooled_running(but: frozenset[str] = frozenset()) -> Any:
    """The pool's started container (not one of `but`), once it is ready for a job."""
    with anyio.fail_after(60):
        while True:
            found = [c for c in await anyio.to_thread.run_sync(pooled) if c.id not in but]
            ready = [c for c in found if await anyio.to_thread.run_sync(started, c)]
            if ready:
                return ready[0]
            await anyio.sleep(0.05)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    return root


async def test_the_first_check_runs_in_a_container_started_before_the_job(
    tmp_path: Path, fakes: FakeProviders, project: Path
) -> None:
    fakes.script.set_default("ann", agent("ann"))
    team = str(
        write_team(tmp_path / "team.yaml", fakes, [("openai", "ann")], coordination={"final": "reuse"})
    )
    settings = Settings(home=tmp_path / "state", verify_concurrency=1)
    async with JobService.serve(environment_of(settings, ENV, FAST), check_pool=True) as service:
        first = await pooled_running()
        view = await service.submit(
            JobRequest(task=TASK, team=team, context_paths=[{"path": str(project)}], verify="hostname")
        )
        view = await until_done(service, view)
        (label,) = view.checks()
        output = (await service.lookup.read(view.job_id, f"verify/{label}", None, 0, 10_000)).content
        assert output.split("--- stdout ---\n", 1)[1].split()[0] == first.id[:12], output
        assert first.id not in {c.id for c in await anyio.to_thread.run_sync(pooled)}  # gone with the job
        second = await pooled_running(but=frozenset({first.id}))  # topped up for the next job
        folder = service.settings.home / "check-pool" / f"{os.getpid()}-{PROCESS_OWNER.id}"
        assert [p.name for p in folder.iterdir()] == ["slot-2"]  # the job removed the slot it took
    assert second.id not in {c.id for c in await anyio.to_thread.run_sync(pooled)}  # removed on shutdown
    assert not folder.exists()


def test_the_folders_of_dead_servers_are_removed(tmp_path: Path) -> None:
    for name in ("111-dead", "222-alive", f"{os.getpid()}-mine"):
        (tmp_path / name / "slot-1").mkdir(parents=True)
    assert reap_folders(tmp_path, lambda pid: pid == 111) == ["111-dead"]
    assert {p.name for p in tmp_path.iterdir()} == {f"{os.getpid()}-mine", "222-alive"}
