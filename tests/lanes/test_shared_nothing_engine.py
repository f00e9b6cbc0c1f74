"""The lane of an engine that shares no sockets (issue 29): what Docker Desktop, OrbStack, colima and a
remote engine give, checked against a second dockerd that `.ci/shared-nothing-engine.sh` starts (and
.ci/test-env.sh runs): its API over TCP only, and the tests' folders seen through `bindfs`, which passes
files and refuses a unix socket's connections, as a VM's file sharing does. Its containers live under a
cgroup parent of their own, so the host-side shortcuts that look for a container's cgroup (the disk
cap's kill, the leftovers check) find nothing there and the engine's own calls do the work, as on a VM.

The first test shows the lane is that engine; the second runs the file, check, apply, CLI-member and
security tests on it in a pytest of their own and wants them all to pass, none skipped. At 79cd6b7, when
a CLI member's proxy was a unix socket bind-mounted into its container, the member tests failed here
(bench/results/shared-nothing-lane.json records how).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ENGINE_ONLY

ROOT = Path(__file__).resolve().parents[2]
LANE = f"tcp://127.0.0.1:{os.environ.get('CONCLAVE_LANE_PORT', '7500')}"  # .ci/shared-nothing-engine.sh
SHARED = Path(os.environ.get("CONCLAVE_LANE_SHARED", "/tmp/egress-shared"))  # seen through bindfs there
# What issue 29 asks of every lane: files, checks, apply, CLI members, and the security suite.
FILES = (
    "tests/test_files_e2e.py",
    "tests/test_verify.py",
    "tests/clis/test_cli_members_e2e.py",
    "tests/security/",
)


@pytest.fixture(scope="module")
def lane() -> str:
    """The lane's address; skips, saying why, where its engine is not running."""
    import docker

    try:
        docker.DockerClient(base_url=LANE, timeout=10).version()
    except docker.errors.DockerException as exc:
        pytest.skip(
            f"needs the shared-nothing engine at {LANE} ({exc}): `bash .ci/shared-nothing-engine.sh` "
            "(.ci/test-env.sh runs it)"
        )
    return LANE


def _probe(engine: str, folder: Path, image: str) -> str:
    """From a container of `engine` with `folder` at /x: the file's text, then whether the socket took."""
    script = (
        "import socket\nprint(open('/x/f.txt').read())\nc = socket.socket(socket.AF_UNIX)\n"
        "try:\n    c.connect('/x/s.sock'); print('connected')\nexcept OSError as e: print('refused', e.errno)"
    )
    command = ["docker", "-H", engine, "run", "--rm", "--network", "none", "-v", f"{folder}:/x:ro", image]
    done = subprocess.run([*command, "python3", "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_lane_passes_files_and_refuses_sockets(lane: str, docker_image: str) -> None:
    folder = SHARED / f"probe-{secrets.token_hex(4)}"
    folder.mkdir(parents=True)
    (folder / "f.txt").write_text("a file passes")
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(folder / "s.sock"))
        listening.listen()
        os.chmod(folder / "s.sock", 0o666)
        default = _probe(os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock"), folder, docker_image)
        shared_nothing = _probe(lane, folder, docker_image)
    assert default.split() == ["a", "file", "passes", "connected"], "the control: the local engine shares it"
    assert shared_nothing.split() == ["a", "file", "passes", "refused", "111"], "ECONNREFUSED, as on a VM"


def test_file_check_cli_member_and_security_tests_pass_on_the_lane(lane: str, clis_image: str) -> None:
    """A pytest of their own on the lane's engine, with every temporary folder where it sees them."""
    run = SHARED / f"run-{secrets.token_hex(4)}"
    (run / "tmp").mkdir(parents=True)
    environment = {**os.environ, "DOCKER_HOST": lane, "TMPDIR": str(run / "tmp"), ENGINE_ONLY: "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", f"--basetemp={run}/t"]
    done = subprocess.run(
        [*command, *FILES], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=1800
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    print(f"\nshared-nothing lane: {summary}")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "skipped" not in summary and "passed" in summary, summary
