"""The sandbox image's two routes: which one `conclave sandbox build` picks and what it says, and that the
Dockerfile route and the mmdebstrap route build the same image from the one recipe.

No registry is reachable here, so the Dockerfile route gets `debian:bookworm-slim` the way a registry
would give it, made from this machine's Debian mirror (tests/fakes/debian_base.py). Names no registry
holds stand for a base an engine cannot pull.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
from pathlib import Path
from typing import Any

import anyio
import pytest

from conclave.cli.main import main
from conclave.errors import SandboxError
from conclave.sandbox.dockerfile import get_base, plain_dockerfile
from conclave.sandbox.engine import connect
from conclave.sandbox.image import BuildOptions, build_image, host_apt_sources
from conclave.sandbox.image_route import Route, choose_route
from conclave.sandbox.recipe import (
    BASE_LABEL,
    CLIS_NPM,
    PACKAGES,
    ROUTE_LABEL,
    SMOKE_TEST,
    debian_arch,
    npm_cpu,
)
from tests.fakes.debian_base import ensure_public_base
from tests.fakes.registry import local_registry, serve_base

NO_SUCH_BASE = "conclave-no-such-base/debian:bookworm-slim"  # no registry holds it, no engine has it


@pytest.fixture
def docker(docker_image: str) -> object:
    """A client of the engine (the sandbox image's fixture skips, saying why, where none runs)."""
    return connect()


@pytest.fixture(scope="module")
def public_base() -> str:
    """`debian:bookworm-slim` in the engine, as a registry would give it."""
    try:
        connect()
    except SandboxError as exc:
        pytest.skip(f"needs the Docker engine ({exc}); .ci/run provides it")
    return ensure_public_base()


@pytest.fixture
def no_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PATH with none of the offline route's tools on it."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))


def test_an_engine_that_can_pull_the_base_builds_from_the_dockerfile(
    docker: object, public_base: str, tmp_path: Path
) -> None:
    """A real registry on 127.0.0.1 holds the base; the engine has no copy of it under that name."""
    with local_registry(tmp_path) as registry:
        base = serve_base(docker, registry, public_base)
        try:
            choice = choose_route(
                docker, forced=None, platform="linux/amd64", offline_tools=("mmdebstrap",), base=base
            )
        finally:
            docker.images.remove(base)  # type: ignore[attr-defined]
    assert choice.route is Route.DOCKERFILE
    assert choice.reason == f"the engine pulled {base} for linux/amd64"
    assert choice.base is not None and choice.base.pulled and choice.base.name == base


def test_no_pull_and_mmdebstrap_here_picks_mmdebstrap_and_says_why(docker: object) -> None:
    choice = choose_route(
        docker, forced=None, platform="linux/amd64", offline_tools=("mmdebstrap",), base=NO_SUCH_BASE
    )
    assert choice.route is Route.MMDEBSTRAP
    assert f"could not pull {NO_SUCH_BASE}" in choice.reason
    assert "builds the root offline" in choice.reason


def test_neither_route_is_an_error_that_names_what_is_missing_and_both_fixes(docker: object) -> None:
    with pytest.raises(SandboxError) as caught:
        choose_route(
            docker, forced=None, platform="linux/amd64", offline_tools=("no-such-tool",), base=NO_SUCH_BASE
        )
    message = str(caught.value)
    assert f"could not pull {NO_SUCH_BASE}" in message
    assert "has no copy" in message
    assert "no no-such-tool" in message
    assert f"`docker pull {NO_SUCH_BASE}` must work" in message
    assert "`apt-get install no-such-tool`" in message


def test_a_forced_route_names_its_own_missing_piece_and_the_other_route(docker: object) -> None:
    with pytest.raises(
        SandboxError, match=r"--route dockerfile: the engine could not pull .* --route mmdebstrap"
    ):
        choose_route(
            docker, forced=Route.DOCKERFILE, platform="linux/amd64", offline_tools=(), base=NO_SUCH_BASE
        )
    with pytest.raises(SandboxError, match=r"--route mmdebstrap needs no-such-tool .* --route dockerfile"):
        choose_route(docker, forced=Route.MMDEBSTRAP, platform="linux/amd64", offline_tools=("no-such-tool",))


def test_a_base_the_engine_holds_serves_the_dockerfile_route_without_mmdebstrap(
    docker: object, public_base: str
) -> None:
    choice = choose_route(docker, forced=None, platform="linux/amd64", offline_tools=("no-such-tool",))
    assert choice.route is Route.DOCKERFILE
    assert choice.base is not None and choice.base.name == public_base and not choice.base.pulled
    assert "no no-such-tool here for the offline route" in choice.reason
    assert "using the copy it has" in choice.reason
    # with mmdebstrap here, a base that could not be pulled leaves the build offline
    offline = choose_route(docker, forced=None, platform="linux/amd64", offline_tools=("sh",))
    assert offline.route is Route.MMDEBSTRAP


def test_the_cli_says_what_is_missing_when_no_route_can_build(
    docker: object, isolated: Path, no_path: None, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["sandbox", "build", "--route", "mmdebstrap", "--platform", "linux/arm64"])
    err = capsys.readouterr().err
    assert code != 0
    assert "--route mmdebstrap needs mmdebstrap on this machine" in err
    assert "`apt-get install mmdebstrap`" in err
    assert main(["sandbox", "build", "--platform", "linux/s390x"]) != 0
    assert (
        "'linux/s390x': the sandbox images are built for linux/amd64 or linux/arm64"
        in capsys.readouterr().err
    )


def test_a_bad_mirror_is_refused_before_anything_is_built(
    isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for bad in ("deb.debian.org", "http://mirror/debian", "http://mirror#x", "ftp://mirror"):
        assert main(["sandbox", "build", "--apt-mirror", bad]) != 0
        err = capsys.readouterr().err
        assert f"--apt-mirror {bad!r}: give the mirror's scheme and host" in err, err
    assert BuildOptions(apt_mirror="http://127.0.0.1:3142").apt_mirror == "http://127.0.0.1:3142"


def test_platforms_map_to_debians_and_npms_names() -> None:
    assert [debian_arch(p) for p in ("linux/amd64", "linux/arm64")] == ["amd64", "arm64"]
    assert [npm_cpu(p) for p in ("linux/amd64", "linux/arm64")] == ["x64", "arm64"]


def test_the_npm_lock_pins_node_and_every_cli_for_both_architectures_with_hashes() -> None:
    lock = json.loads((CLIS_NPM / "package-lock.json").read_text())["packages"]
    manifest = json.loads((CLIS_NPM / "package.json").read_text())
    assert lock[""]["dependencies"] == manifest["dependencies"]
    for cpu in ("x64", "arm64"):
        for package in (
            f"node-linux-{cpu}",
            f"@anthropic-ai/claude-code-linux-{cpu}",
            f"@openai/codex-linux-{cpu}",
            f"@github/copilot-linux-{cpu}",
        ):
            entry = lock[f"node_modules/{package}"]
            assert entry["integrity"].startswith("sha512-"), package
            assert entry["cpu"] in (cpu, [cpu]), package
    for name, version in manifest["dependencies"].items():
        assert lock[f"node_modules/{name}"]["version"] == version
        assert lock[f"node_modules/{name}"]["integrity"].startswith("sha512-")


def _run(docker: object, image: str, command: list[str]) -> str:
    output = docker.containers.run(  # type: ignore[attr-defined]
        image, command, network_mode="none", remove=True, user="1000:1000"
    )
    return str(output.decode())


def test_both_routes_build_the_same_image_from_the_one_recipe(
    docker: object, docker_image: str, public_base: str
) -> None:
    """The Dockerfile route, from the base, against the image the mmdebstrap route built (CI builds the
    sandbox image offline: .ci/test-env.sh): the same packages, user, configuration and smoke test."""
    tag = f"conclave-sandbox-routes:{secrets.token_hex(4)}"
    offline = docker_image
    if _route_of(docker, docker_image) != "mmdebstrap":  # built otherwise on this machine: build one
        offline = f"conclave-sandbox-routes:{secrets.token_hex(4)}-mmdebstrap"
        anyio.run(lambda: build_image(offline, client=docker, options=BuildOptions(route=Route.MMDEBSTRAP)))
    lines: list[str] = []
    try:
        report = anyio.run(
            lambda: build_image(
                tag,
                client=docker,
                options=BuildOptions(route=Route.DOCKERFILE, apt_mirror=_host_mirror()),
                log=lines.append,
            )
        )
        assert report.built and report.route is not None and report.route.route is Route.DOCKERFILE
        assert lines[0].startswith(
            f"route: dockerfile (--route dockerfile; the engine could not pull {public_base}"
        )
        assert any(line.startswith("smoke test: python3 -c") for line in lines)
        packages = "dpkg-query -W -f '${Package}\\n' | sort"
        assert _run(docker, tag, ["sh", "-c", packages]) == _run(docker, offline, ["sh", "-c", packages])
        assert (_route_of(docker, tag), _route_of(docker, offline)) == ("dockerfile", "mmdebstrap")
        for image in (tag, offline):
            config = docker.images.get(image).attrs["Config"]  # type: ignore[attr-defined]
            assert config["User"] == "1000:1000" and config["WorkingDir"] == "/workspace"
            assert config["Cmd"] == ["sleep", "infinity"]
            assert "LANG=C.UTF-8" in config["Env"]
            assert _run(docker, image, ["sh", "-c", "id -un; getent passwd sandbox"]) == (
                "sandbox\nsandbox:x:1000:1000:conclave sandbox:/workspace:/bin/sh\n"
            )
            assert _run(docker, image, list(SMOKE_TEST)) == ""
            docs = "/usr/share/doc /usr/share/man /usr/share/info"
            left_in = f"find {docs} -type f ! -name copyright ! -name dir | wc -l"
            assert _run(docker, image, ["sh", "-c", f"{left_in} 2>/dev/null"]) == "0\n"
    finally:
        for built in {tag, offline} - {docker_image}:
            with contextlib.suppress(Exception):
                docker.images.remove(built, force=True)  # type: ignore[attr-defined]


def _route_of(docker: object, image: str) -> str:
    labels = docker.images.get(image).attrs["Config"]["Labels"] or {}  # type: ignore[attr-defined]
    return str(labels.get(ROUTE_LABEL, ""))


def _host_mirror() -> str:
    """This machine's Debian mirror (scheme and host), passed in as a user behind a mirror would."""
    uri = re.search(r"^URIs: (\S+)", host_apt_sources().text, re.MULTILINE)
    assert uri, host_apt_sources().text
    return "/".join(uri[1].split("/")[:3])


def push(docker: Any, image: str, remote: str) -> str:
    """Push `image` as `remote` (name:tag) and drop the engine's copy of that name; the pushed digest."""
    repository, _, tag = remote.rpartition(":")
    docker.images.get(image).tag(repository, tag)
    digest = ""
    for line in docker.images.push(repository, tag=tag, stream=True, decode=True):
        if "error" in line:
            raise RuntimeError(f"push of {remote} failed: {line['error']}")
        digest = line.get("aux", {}).get("Digest", digest)
    docker.images.remove(remote)
    assert digest.startswith("sha256:"), digest
    return str(digest)


def test_a_pinned_base_is_the_pinned_content_when_its_tag_has_moved(
    docker: Any, public_base: str, tmp_path: Path
) -> None:
    with local_registry(tmp_path) as registry:
        remote = f"{registry}/library/debian:bookworm-slim"
        pinned = f"{remote}@{push(docker, public_base, remote)}"
        moved = docker.images.build(fileobj=_dockerfile(f"FROM {public_base}\nLABEL moved=yes\n"), rm=True)[0]
        push(docker, moved.id, remote)  # the tag now names other content
        try:
            got = get_base(docker, pinned, "linux/amd64")
            assert got.pulled and got.name == pinned and got.digest == pinned.rpartition("@")[2]
            labels = docker.images.get(pinned).attrs["Config"]["Labels"] or {}
            assert "moved" not in labels  # what the pin names, not what the tag names now
            assert f'LABEL {BASE_LABEL}="{pinned}"' in plain_dockerfile(got, PACKAGES)
        finally:
            for image in (pinned, moved.id):
                with contextlib.suppress(Exception):
                    docker.images.remove(image, force=True)


def _dockerfile(text: str) -> Any:
    import io

    return io.BytesIO(text.encode())
