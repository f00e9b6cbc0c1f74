"""What the CLI members' end-to-end tests share (the CLI image is tests/conftest.py's): the project
with its failing test, and the fake provider hosts the login tests reach over TLS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.calc_task import calc_project
from tests.fakes.login_hosts import LoginHosts
from tests.fakes.script import Script


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return calc_project(tmp_path)


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[LoginHosts]:
    with LoginHosts(Script(), tmp_path / "tls") as running:
        yield running
