"""Fixtures every test module shares."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from conclave.config.models import SandboxSpec
from conclave.sandbox.clis_image import clis_tag
from conclave.sandbox.engine import engine_status
from conclave.sandbox.image import image_tag
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, PROVIDER_KEYS, TRIO, install, voter, write_team


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def fakes() -> Iterator[FakeProviders]:
    """The fake provider servers on 127.0.0.1, fresh for each test (see tests/fakes/server.py)."""
    with FakeProviders() as running:
        yield running


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """For the CLI's tests: state under tmp_path/state, user teams under tmp_path/conclave/teams (XDG), and
    no Conclave setting or provider key from the real environment; returns tmp_path."""
    for name in list(os.environ):
        if name.startswith(("CONCLAVE_", "OLLAMA_", "VLLM_")) or name in PROVIDER_KEYS:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CONCLAVE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture
def trio(tmp_path: Path, fakes: FakeProviders, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A team file of three fake agents (one per wire format) that answer once and then vote."""
    install(fakes.script, TRIO, voter())
    monkeypatch.setenv(KEY_ENV, "test-key")
    return write_team(tmp_path / "trio.yaml", fakes, TRIO)


@pytest.fixture(scope="session")
def docker_image() -> str:
    """The sandbox image's tag; a test that needs Docker skips, saying why, where no engine runs."""
    tag = image_tag(SandboxSpec())
    status = engine_status(tag)
    if not status.available or not status.image_present:
        pytest.skip(f"needs the Docker engine and the sandbox image ({status.error}); .ci/run provides both")
    return tag


@pytest.fixture(scope="session")
def clis_image() -> str:
    """The CLI image's tag (`conclave sandbox build --clis`); skips, saying why, without it."""
    tag = clis_tag()
    status = engine_status(tag)
    if not status.available or not status.image_present:
        pytest.skip(
            f"needs the Docker engine and the CLI image {tag} ({status.error}): `conclave sandbox build "
            "--clis`"
        )
    return tag
