"""Fixtures every test module shares."""

from collections.abc import Iterator

import pytest

from tests.fakes.server import FakeProviders


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def fakes() -> Iterator[FakeProviders]:
    """The fake provider servers on 127.0.0.1, fresh for each test (see tests/fakes/server.py)."""
    with FakeProviders() as running:
        yield running
