"""What the CLI members' end-to-end tests share: the CLI image, and the project with its failing test."""

from __future__ import annotations

from pathlib import Path

import pytest

from conclave.sandbox.clis_image import clis_tag
from conclave.sandbox.engine import engine_status
from tests.fakes.calc_task import calc_project


@pytest.fixture(scope="session")
def clis_image() -> str:
    tag = clis_tag()
    status = engine_status(tag)
    if not status.available or not status.image_present:
        pytest.skip(
            f"needs the Docker engine and the CLI image {tag} ({status.error}): `conclave sandbox build "
            "--clis`"
        )
    return tag


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return calc_project(tmp_path)
