"""The Podman lane: the file, `verify`, `apply` and CLI-member end-to-end tests, and the security suite's
tests that reach an engine (issue 29: no weakening on any engine), run in a sub-pytest against Debian's
Podman through its Docker-compatible API socket, must all pass, none skipped.

.ci/test-env.sh starts the service (`podman system service`) on PODMAN_SOCKET and builds both sandbox
images into it with `conclave sandbox build --clis`, the build this lane exercises first.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from conclave.errors import SandboxError
from conclave.sandbox.image import BuildReport, Log, build_once, import_root, smoke_test
from conclave.sandbox.image_route import Route, RouteChoice
from tests.conftest import ENGINE_ONLY

ROOT = Path(__file__).resolve().parent.parent.parent
PODMAN_SOCKET = Path("/tmp/podman-lane/podman.sock")
# file work and apply (test_files_e2e), checks (test_verify), coding-agent CLIs as members, and the
# security suite, as the shared-nothing lane runs them: what a member's HOME (a volume on Podman), its
# egress, the reaping of background processes and the disk cap do differs per engine. Only the tests that
# reach an engine run (conftest.py's ENGINE_ONLY): the rest cannot tell one engine from another, and ran
# twice more for nothing (a lane ran 260 tests; it keeps 67, a test per CLI once: conftest.py LANE_KEEPS)
E2E = [
    "tests/test_files_e2e.py",
    "tests/test_verify.py",
    "tests/clis/test_cli_members_e2e.py",
    "tests/security/",
]


def _engine_name(host: str) -> str:
    """The engine's own name for itself, through the same seam `conclave doctor` uses."""
    code = "from conclave.sandbox.engine import connect, engine_facts; print(engine_facts(connect()).name)"
    done = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "DOCKER_HOST": host}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture(scope="module")
def podman_host() -> str:
    if not PODMAN_SOCKET.is_socket():
        pytest.skip(f"needs Podman's API service on {PODMAN_SOCKET}; .ci/test-env.sh starts it")
    host = f"unix://{PODMAN_SOCKET}"
    assert _engine_name(host) == "Podman"  # the lane would be worthless on Docker by mistake
    return host


@pytest.mark.timeout(3000)  # the sub-run: minutes on 2 busy cores, twice that at worst
def test_the_e2e_tests_pass_on_podman(podman_host: str, tmp_path: Path) -> None:
    report = tmp_path / "podman-lane.xml"
    env = {**os.environ, "DOCKER_HOST": podman_host, ENGINE_ONLY: "1"}
    env.pop("DOCKER_CONTEXT", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", f"--junitxml={report}", *E2E],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=2700,
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "(no output)"
    print(f"podman lane: {summary}")
    assert report.exists(), f"the sub-pytest wrote no report:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    suite = ElementTree.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    counts = {key: int(suite.get(key, "0")) for key in ("tests", "failures", "errors", "skipped")}
    assert done.returncode == 0, f"podman lane failed ({summary}):\n{done.stdout[-8000:]}"
    assert counts["tests"] >= 60 and counts["failures"] == counts["errors"] == counts["skipped"] == 0, counts


async def _tiny_root(folder: Path, say: object) -> Path:
    """A root of /usr/bin/true, /usr/bin/false and the libraries they load (dereferenced): enough to
    import and run, in a second instead of mmdebstrap's minute."""
    libraries = subprocess.run(["ldd", "/usr/bin/true"], capture_output=True, text=True, check=True).stdout
    paths = ["/usr/bin/true", "/usr/bin/false", *(word for word in libraries.split() if word.startswith("/"))]
    tarball = folder / "root.tar"
    with tarfile.open(tarball, "w") as tar:
        for path in paths:
            tar.add(os.path.realpath(path), arcname=path.lstrip("/"))
    return tarball


def _runs_true(docker: object, image: str) -> None:
    smoke_test(docker, image, ["/usr/bin/true"], environment={}, timeout_s=60, what="the tiny root")


def _fails(docker: object, image: str) -> None:
    smoke_test(docker, image, ["/usr/bin/false"], environment={}, timeout_s=60, what="tiny")


async def _build(client: object, tag: str, check: object) -> BuildReport:
    async def make(docker: object, candidate: str, say: Log) -> None:  # the mmdebstrap route's last step
        with tempfile.TemporaryDirectory(prefix="conclave-import-probe-") as tmp:
            await import_root(docker, await _tiny_root(Path(tmp), say), candidate, say)

    return await build_once(
        tag,
        "conclave-import-probe",
        make,
        check,  # type: ignore[arg-type]
        smoke="true",
        client=client,
        log=lambda _line: None,
        route=RouteChoice(Route.MMDEBSTRAP, "a tiny root, imported as the mmdebstrap route imports"),
    )


@pytest.mark.anyio
async def test_a_build_imports_smoke_tests_and_tags_on_podman(podman_host: str) -> None:
    """Podman ignores an import's tag and names the image its own way: the build follows the id the import
    returns (before, `conclave sandbox build` died with a raw NotFound after the import). A candidate that
    fails its smoke test is removed, whatever the engine named it."""
    import docker

    client = docker.DockerClient(base_url=podman_host)
    before = {image.id for image in client.images.list(all=True)}
    tag = f"conclave-import-probe:{secrets.token_hex(4)}"
    try:
        report = await _build(client, tag, _runs_true)
        assert report.built and client.images.get(tag).id not in before
        with pytest.raises(SandboxError, match="failed its smoke test"):
            await _build(client, f"{tag}-broken", _fails)
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            client.images.remove(tag, force=True)
    assert {image.id for image in client.images.list(all=True)} == before  # no candidate left behind
