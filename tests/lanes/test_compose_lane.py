"""The compose lane: docs/deploy/compose.yaml as shipped, brought up as its header says, on this host's
engine (bench/compose_lane.py does the work and says how). Two fronts, three workers, a job through each
front, the worker running one `docker kill`ed and its job completed by another; the team file only in
the fronts' team folder, the provider key only on the workers.

Minutes, not seconds (Conclave's image is built from the commit, and the Redis and PostgreSQL images
from Debian's packages the first time), and it takes an operator's paths (/srv/conclave, /srv/projects):
so it runs only as root with Docker, docker-compose and mmdebstrap, and where /srv holds no such folder
but the lane's own. Its committed result is bench/results/compose-lane.json.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bench.compose_lane import MARK, PROJECTS, STATE, TEAM, WORKERS, lane


@pytest.fixture
def host() -> None:
    if os.geteuid() != 0:
        pytest.skip("the lane makes /srv/conclave for the image's user: run it as root")
    for tool in ("docker-compose", "mmdebstrap"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool} (.ci/test-env.sh installs it)")
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.skip("needs a Docker engine (.ci/test-env.sh starts one)")
    for folder in (STATE, PROJECTS):
        if folder.exists() and not (folder / MARK).exists():
            pytest.skip(f"{folder} is an operator's, not the lane's")


def test_the_shipped_compose_file_runs_a_job_per_front_and_survives_a_killed_worker(
    host: None, tmp_path: Path
) -> None:
    result = lane(tmp_path / "compose-lane.json", keep=False)
    fronts = {name: held for name, held in result["layout"].items() if "front" in name}
    workers = {name: held for name, held in result["layout"].items() if "worker" in name}
    assert len(fronts) == 2 and len(workers) == WORKERS
    team = [f"{TEAM}.yaml"]
    assert all(not held["provider_key"] and held["team_folder"] == team for held in fronts.values())
    assert all(held["provider_key"] and held["team_folder"] == ["none"] for held in workers.values())
    first, second = result["jobs"]["first"], result["jobs"]["second"]
    assert first["state"] == "completed" and first["final"], first
    assert first["by"] != first["killed"] and first["to_resumed_s"] is not None
    assert second["state"] == "completed" and second["final"], second
    assert result["jobs"]["killed_state"].startswith("exited")
