"""What `conclave doctor` says runs on an engine matches what a lane shows running there (issue 36).

The shared-nothing lane (tests/lanes/test_shared_nothing_engine.py) is an engine that shares no socket
with this host and sees its files only through a shared folder, as Docker Desktop, OrbStack, colima and
Rancher Desktop do from their VMs; file work and CLI members pass there. So on each of those engines, as
it describes itself, doctor must say every feature it reports runs, given the images. The features are
doctor's own list (FEATURES), and each must name the lane's tests that show it, so a new feature cannot
be reported without a lane behind it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conclave.cli.doctor import FEATURES, VM_ENGINES, works_here
from conclave.cli.main import main
from conclave.sandbox.engine import engine_facts
from tests.lanes.test_shared_nothing_engine import FILES, LANE, ROOT

# Which of the lane's tests show each feature doctor reports running.
SHOWN_BY = {
    "file work": ("tests/test_files_e2e.py", "tests/test_verify.py"),
    "CLI members": ("tests/clis/test_cli_members_e2e.py", "tests/security/"),
}

# What each engine in a VM says of itself (its /version and /info), as engine_facts reads them.
VM_DESCRIPTIONS = {
    "Docker Desktop": {"OperatingSystem": "Docker Desktop", "Name": "docker-desktop"},
    "OrbStack": {"OperatingSystem": "OrbStack", "Name": "orbstack"},
    "colima": {"OperatingSystem": "Ubuntu 24.04.1 LTS", "Name": "colima"},
    "Rancher Desktop": {"OperatingSystem": "Alpine Linux v3.20", "Name": "lima-rancher-desktop"},
}


class Described:
    """An engine's answers to /version and /info, for engine_facts (there is no Mac here)."""

    def __init__(self, info: dict[str, str]) -> None:
        self._info = {**info, "Architecture": "aarch64"}

    def version(self) -> dict[str, Any]:
        return {"Version": "27.3.1", "Components": [{"Name": "Engine"}], "Os": "linux", "Arch": "arm64"}

    def info(self) -> dict[str, Any]:
        return self._info


def test_every_feature_doctor_reports_is_shown_by_the_shared_nothing_lane() -> None:
    assert {feature.name for feature in FEATURES} == set(SHOWN_BY), "say which lane tests show it"
    for paths in SHOWN_BY.values():
        for path in paths:
            assert path in FILES and (ROOT / path).exists(), path


# How docker-py addresses an engine's API: the VM engines' contexts are unix sockets on this host, the
# lane's engine is plain TCP (its only link to this host besides the shared folder).
UNIX, LANE_API = "http+docker://localhost", LANE.replace("tcp://", "http://")
ALL_IMAGES = {feature.image: True for feature in FEATURES}


@pytest.mark.parametrize("api_url", [UNIX, LANE_API])
@pytest.mark.parametrize("name", sorted(VM_ENGINES))
def test_doctor_says_every_feature_runs_on_an_engine_in_a_vm(name: str, api_url: str) -> None:
    facts = engine_facts(Described(VM_DESCRIPTIONS[name]))
    assert facts.name == name
    probes = works_here(facts, api_url, ALL_IMAGES)
    assert [probe.name for probe in probes] == [f"{feature.name} on {name}" for feature in FEATURES]
    assert all(probe.ok for probe in probes), [probe.line() for probe in probes]


@pytest.mark.parametrize("api_url", ["https://engine.example:2376", "http+docker://ssh"])
def test_doctor_says_a_relayed_feature_needs_a_plain_api_stream(api_url: str) -> None:
    """Over TLS or SSH docker-py gives no exec a plain socket, so a CLI member's relay cannot start
    (sandbox/egress_channel.py says so at run time): doctor says it first, with the way round it."""
    facts = engine_facts(Described(VM_DESCRIPTIONS["Docker Desktop"]))
    for feature, probe in zip(FEATURES, works_here(facts, api_url, ALL_IMAGES), strict=True):
        assert probe.ok is not feature.raw_stream, probe.line()
        if feature.raw_stream:
            assert f"not over {api_url}" in probe.line() and "-> reach the engine through a" in probe.line()


def test_doctor_says_what_a_feature_needs_when_its_image_is_missing() -> None:
    facts = engine_facts(Described(VM_DESCRIPTIONS["OrbStack"]))
    for feature in FEATURES:
        images = {other.image: other is not feature for other in FEATURES}
        (probe,) = [p for p in works_here(facts, UNIX, images) if p.name.startswith(feature.name)]
        assert not probe.ok and probe.line().endswith(f"need the {feature.image} -> {feature.fix}")


def test_doctor_on_the_shared_nothing_lane_says_every_feature_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole of doctor against the lane's own engine (API over TCP), with the images it holds."""
    import docker

    try:
        docker.DockerClient(base_url=LANE, timeout=10).version()
    except docker.errors.DockerException as exc:
        pytest.skip(f"needs the shared-nothing engine at {LANE} ({exc}): `bash .ci/shared-nothing-engine.sh`")
    monkeypatch.setenv("DOCKER_HOST", LANE)
    monkeypatch.setenv("CONCLAVE_HOME", str(tmp_path / "state"))
    main(["doctor"])
    out = capsys.readouterr().out
    assert f"chosen by DOCKER_HOST={LANE}" in out, out
    for feature in FEATURES:
        assert f"[ok  ] {feature.name} on Docker: {feature.covers}" in out, out
