"""State is private and short-lived: CONCLAVE_HOME and its jobs 0700, the database 0600, and agents'
working copies deleted when the job ends (snapshots and final/ stay)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, install, voter, write_team
from tests.fakes.waits import until_done

pytestmark = pytest.mark.anyio


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


async def test_state_is_private_and_working_copies_go_with_the_job(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    install(fakes.script, TRIO, voter())
    project = tmp_path / "proj"
    project.mkdir()
    (project / "a.txt").write_text("a\n")
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    home = tmp_path / "state"
    old = os.umask(0o022)  # a usual umask: what is private is made so on purpose
    try:
        async with JobService.serve(
            environment_of(Settings(home=home), {KEY_ENV: "k-0123456789"})
        ) as service:
            view = await until_done(
                service,
                await service.submit(
                    JobRequest(task="Look at a.txt", team=team, context_paths=[{"path": str(project)}])
                ),
            )
    finally:
        os.umask(old)
    assert view.state == "completed", view.text()
    job = home / "jobs" / view.job_id
    assert (mode(home), mode(home / "jobs"), mode(job)) == (0o700, 0o700, 0o700)
    for db in home.glob("conclave.db*"):
        assert mode(db) == 0o600, db
    assert not (job / "agents").exists() and not (job / "peers").exists()
    assert (job / "final" / "proj" / "a.txt").read_text() == "a\n" and any((job / "snapshots").iterdir())
