"""Every public base image is pinned by digest where the engine pulls it, and a build says (and records
on the image it makes) which base it used. Before: `debian:bookworm-slim` and the deploy image's bases
were mutable tags, and where the pull failed the sandbox build took whatever image the engine held under
the tag, saying only "using the copy it has".

That a pinned pull gets the pinned content when the registry's tag has moved is
tests/test_image_routes.py's (a registry on 127.0.0.1, which Docker reaches without TLS and Podman not).
"""

from __future__ import annotations

import contextlib
import io
import re
import secrets
from pathlib import Path
from typing import Any

import anyio
import pytest

from conclave.errors import SandboxError
from conclave.sandbox.dockerfile import plain_dockerfile
from conclave.sandbox.engine import connect
from conclave.sandbox.image import BuildOptions, BuildStart, start_build
from conclave.sandbox.image_route import Route, choose_route
from conclave.sandbox.recipe import BASE_IMAGE, BASE_LABEL, BASE_PINNED, PACKAGES
from tests.fakes.debian_base import ensure_public_base

DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def docker() -> Any:
    try:
        return connect()
    except SandboxError as exc:
        pytest.skip(f"needs the Docker engine ({exc}); .ci/run provides it")


@pytest.fixture(scope="module")
def public_base(docker: Any) -> str:
    return ensure_public_base()


def test_the_sandbox_and_deploy_bases_are_pinned_by_digest() -> None:
    assert BASE_PINNED.startswith(f"{BASE_IMAGE}@") and DIGEST.search(BASE_PINNED)
    assert choose_route.__kwdefaults__["base"] == BASE_PINNED
    assert BuildOptions().base == BASE_PINNED
    dockerfile = (ROOT / "docs" / "deploy" / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", dockerfile, re.MULTILINE))
    froms = re.findall(r"^FROM (\S+)", dockerfile, re.MULTILINE)
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", dockerfile, re.MULTILINE))
    external = [args.get(name.strip("${}"), name) for name in froms if name not in stages]
    assert external and all(DIGEST.search(name) for name in external), external


def test_a_base_the_engine_holds_under_the_tag_alone_is_named_with_its_image_digest(
    docker: Any, public_base: str
) -> None:
    image_id = docker.images.get(public_base).id
    choice = choose_route(docker, forced=None, platform="linux/amd64", offline_tools=("no-such-tool",))
    assert choice.base is not None and choice.base.name == public_base and not choice.base.pulled
    assert f"could not pull {BASE_PINNED}" in choice.reason
    assert f"image {image_id}" in choice.reason and "not the pinned one" in choice.reason
    assert choice.base.recorded == f"{public_base} (image {image_id})"


def test_a_build_prints_and_records_the_base_it_used(docker: Any, public_base: str) -> None:
    """What `conclave sandbox build` prints before it builds, and the label the Dockerfile gives the
    image (its base and its label only: apt's step needs a mirror the engine's builds reach, which not
    every lane's engine does; tests/test_image_routes.py builds the whole image)."""
    lines: list[str] = []
    options = BuildOptions(route=Route.DOCKERFILE)
    tag = f"conclave-sandbox-base:{secrets.token_hex(4)}"
    start = anyio.run(lambda: start_build(tag, docker, options, lines.append))
    assert isinstance(start, BuildStart) and start.route.base is not None
    recorded = f"{public_base} (image {docker.images.get(public_base).id})"
    assert f"base: {recorded}" in lines, lines
    text = plain_dockerfile(start.route.base, PACKAGES)
    kept = [line for line in text.splitlines() if line.startswith(("FROM ", "LABEL "))]
    try:
        image = docker.images.build(fileobj=io.BytesIO("\n".join(kept).encode()), tag=tag, rm=True)[0]
        assert image.attrs["Config"]["Labels"][BASE_LABEL] == recorded
    finally:
        with contextlib.suppress(Exception):
            docker.images.remove(tag, force=True)
