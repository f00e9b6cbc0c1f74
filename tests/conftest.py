"""Fixtures every test module shares."""

from collections.abc import Iterator

import pytest

from conclave.config.models import SandboxSpec
from conclave.sandbox.engine import engine_status
from conclave.sandbox.image import image_tag
from tests.fakes.server import FakeProviders


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def fakes() -> Iterator[FakeProviders]:
    """The fake provider servers on 127.0.0.1, fresh for each test (see tests/fakes/server.py)."""
    with FakeProviders() as running:
        yield running


@pytest.fixture(scope="session")
def docker_image() -> str:
    """The sandbox image's tag; a test that needs Docker skips, saying why, where no engine runs."""
    tag = image_tag(SandboxSpec())
    status = engine_status(tag)
    if not status.available or not status.image_present:
        pytest.skip(f"needs the Docker engine and the sandbox image ({status.error}); .ci/run provides both")
    return tag
