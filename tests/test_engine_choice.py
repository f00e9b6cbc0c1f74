"""The engine is chosen the way the `docker` command chooses it (sandbox/endpoint.py), for real: a docker
context written as `docker context create` writes it, pointing at Podman's API socket (the lane's, which
.ci/test-env.sh starts), and `conclave doctor` naming the engine it reached."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from conclave.cli.main import main
from conclave.sandbox.endpoint import choose_endpoint
from conclave.sandbox.engine import connect, engine_facts, engine_status, is_podman
from tests.lanes.test_podman_lane import PODMAN_SOCKET

PODMAN = f"unix://{PODMAN_SOCKET}"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of its own, no engine variables: only the docker config written below chooses."""
    if not PODMAN_SOCKET.is_socket():
        pytest.skip(f"needs Podman's API service on {PODMAN_SOCKET}; .ci/test-env.sh starts it")
    for name in ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def write_context(home: Path, name: str, host: str, *, current: bool) -> None:
    """What `docker context create NAME --docker host=HOST` (and `docker context use NAME`) write."""
    folder = home / ".docker"
    meta = folder / "contexts" / "meta" / hashlib.sha256(name.encode()).hexdigest()
    meta.mkdir(parents=True)
    endpoints = {"docker": {"Host": host, "SkipTLSVerify": False}}
    (meta / "meta.json").write_text(json.dumps({"Name": name, "Metadata": {}, "Endpoints": endpoints}))
    if current:
        (folder / "config.json").write_text(json.dumps({"currentContext": name}))


def test_the_active_docker_context_chooses_the_engine(home: Path) -> None:
    write_context(home, "podman-lane", PODMAN, current=True)
    assert choose_endpoint(os.environ).chosen_by == "docker context podman-lane"
    assert engine_facts(connect()).name == "Podman"


def test_docker_context_beats_the_config_and_docker_host_beats_both(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_context(home, "podman-lane", PODMAN, current=True)
    write_context(home, "local", "unix:///var/run/docker.sock", current=False)
    monkeypatch.setenv("DOCKER_CONTEXT", "local")
    assert engine_facts(connect()).name == "Docker"
    monkeypatch.setenv("DOCKER_HOST", PODMAN)
    assert engine_facts(connect()).name == "Podman"


def test_with_no_context_the_default_socket_answers(home: Path) -> None:
    assert choose_endpoint(os.environ).chosen_by == "the default socket /var/run/docker.sock"
    assert engine_facts(connect()).name == "Docker"


def test_doctor_names_the_engine_its_os_arch_and_what_works(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DOCKER_HOST", PODMAN)
    monkeypatch.setenv("CONCLAVE_HOME", str(home / "state"))
    main(["doctor"])
    out = capsys.readouterr().out
    facts = engine_facts(connect())
    engine = next(line for line in out.splitlines() if "docker engine:" in line)
    assert f"Podman {facts.version}" in engine and facts.arch in engine, engine
    assert f"chosen by DOCKER_HOST={PODMAN}" in engine, engine
    assert "[ok  ] file work on Podman: workspaces, run_command, verify and apply" in out, out
    assert "[ok  ] CLI members on Podman" in out, out


def test_the_ping_tells_podman_and_the_version_as_the_engine_reports_them(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CLI member's start and a job's admission ask the ping (sandbox/engine.py), not /version and /info,
    which Podman answers in about a second; what they learn must be what those say."""
    for host in (PODMAN, "unix:///var/run/docker.sock"):
        monkeypatch.setenv("DOCKER_HOST", host)
        client, facts = connect(), engine_facts(connect())
        assert is_podman(client) == (facts.name == "Podman") == (host == PODMAN)
        assert engine_status().version == facts.version
