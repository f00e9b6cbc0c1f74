"""Fixtures shared by the provider backend tests: the fake provider servers and the stream mode."""

from __future__ import annotations

import pytest

from tests.backends.helpers import serve_fakes

# A fresh fake server (and script) for each test, so that recorded requests are the test's own.
# A module whose tests each use their own agent may share one: `fakes = pytest.fixture(
# serve_fakes, scope="module", name="fakes")` there overrides this.
fakes = pytest.fixture(serve_fakes, name="fakes")


@pytest.fixture(params=[True, False], ids=["streamed", "whole"])
def stream(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)
