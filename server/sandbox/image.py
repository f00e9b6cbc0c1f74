"""Build the sandbox image by one of two routes, smoke-test it, tag it (the recipe: sandbox/recipe.py).

`build_image()` does nothing when the tag exists. Otherwise sandbox/image_route.py picks the route and
says why, and the candidate is built under a temporary tag:

- the Dockerfile route (sandbox/dockerfile.py): the engine builds from `debian:bookworm-slim`, pulled by
  its pinned digest; the build prints which base it used and labels the image with it;
- the mmdebstrap route: `mmdebstrap --variant=minbase` makes the root on this machine with the
  recipe's packages, the `merged-usr` and `eatmydata` hooks, docs/man pages/locales left out by dpkg
  `path-exclude` options, and a customize hook that adds the `sandbox` user. The mirrors are the ones apt
  on this machine uses (its deb822 `.sources` stanzas for the host's release, security suite
  included), so the build reaches no other network; they land in the image as apt's own `.sources`
  file. The tarball goes to a temporary file first (never a pipe, so a failed mmdebstrap cannot hide
  behind a successful import) and is imported with no name: the candidate is the image id the
  import returns, tagged with the candidate's name (engines name an imported image their own way:
  Podman ignores the tag and prefixes `docker.io/library/` or `localhost/`).

Either way the candidate runs `python3 -c 'import json,sqlite3,ssl,pytest'` as uid 1000 with no
network; only then does it get the real tag. On any failure the candidate is removed and `SandboxError`
carries the tool's stderr.

`build_image_sync()` is the CLI's entry (`conclave sandbox build`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import anyio
import anyio.to_thread

from conclave.config.models import SandboxSpec
from conclave.errors import SandboxError
from conclave.sandbox import dockerfile
from conclave.sandbox.engine import ENGINE_NEEDS, connect
from conclave.sandbox.engine import FIX as ENGINE_FIX
from conclave.sandbox.image_route import Route, RouteChoice, choose_route
from conclave.sandbox.recipe import (
    ADD_USER,
    BASE_PINNED,
    DPKG_EXCLUDES,
    IMAGE_CONFIG,
    PACKAGES,
    ROUTE_LABEL,
    SMOKE_TEST,
    VARIANT,
    debian_arch,
    plain_digest,
)

IMAGE_REPO = "conclave-sandbox"
_HOOKS = Path("/usr/share/mmdebstrap/hooks")

_ONE_LINE = re.compile(r"\s*deb\s+(?:\[(?P<opts>[^\]]*)\]\s+)?(?P<uri>\S+)\s+(?P<suite>\S+)\s*(?P<comps>.*)")

Log = Callable[[str], None]
# Builds the candidate image under the tag it is given (`say` reports progress).
MakeCandidate = Callable[[object, str, Log], Awaitable[None]]


def default_tag(platform: str | None = None) -> str:
    """The image this version of Conclave runs agents' commands in: the version and a digest of the
    recipe, so a changed recipe is built anew instead of reusing an old tag. A `platform` named
    (--platform) adds its architecture, so a build for another CPU never takes the engine's own tag."""
    return _tag_for(IMAGE_REPO, plain_digest(), platform)


def _tag_for(repo: str, digest: str, platform: str | None) -> str:
    from conclave import __version__

    suffix = f"-{debian_arch(platform)}" if platform else ""
    return f"{repo}:{__version__}-{digest}{suffix}"


@dataclass(frozen=True)
class BuildReport:
    """What `build_image` did."""

    tag: str
    built: bool  # False: the tag already existed, nothing was done
    seconds: float
    size_bytes: int
    route: RouteChoice | None = None  # None when nothing was built


@dataclass(frozen=True)
class AptSources:
    """The release to build and the deb822 text that names its mirrors."""

    suite: str
    text: str


@dataclass(frozen=True)
class BuildOptions:
    """How `conclave sandbox build` builds: the route (None: chosen), the platform (None: the engine's
    own), a Debian mirror for the Dockerfile route's apt (None: the base's own sources), and that
    route's base (pinned by digest)."""

    route: Route | None = None
    platform: str | None = None
    apt_mirror: str | None = None
    base: str = BASE_PINNED

    def __post_init__(self) -> None:
        if self.platform is not None:
            debian_arch(self.platform)  # linux/amd64 or linux/arm64, else the error says so
        mirror = self.apt_mirror
        if mirror is not None and not re.fullmatch(r"https?://[^\s/#'\"]+", mirror):
            raise SandboxError(
                f"--apt-mirror {mirror!r}: give the mirror's scheme and host (and port), such as "
                "http://mirror.example:3142; it takes the place of http://deb.debian.org in apt's sources"
            )


async def build_image(
    tag: str | None = None,
    *,
    client: object | None = None,
    options: BuildOptions | None = None,
    log: Log | None = None,
) -> BuildReport:
    """Build `tag` (default `default_tag()`) unless it exists; see the module docstring."""
    options = options or BuildOptions()
    start = await start_build(tag or default_tag(options.platform), client, options, log)
    if isinstance(start, BuildReport):
        return start
    docker, tag, target, choice, say = start.docker, start.tag, start.target, start.route, start.say

    async def with_dockerfile(docker: object, candidate: str, say: Log) -> None:
        assert choice.base is not None  # the Dockerfile route always comes with its base
        text = dockerfile.plain_dockerfile(choice.base, PACKAGES)
        with tempfile.TemporaryDirectory(prefix=f"{IMAGE_REPO}-") as tmp:
            dockerfile.write_context(Path(tmp), text)
            say(f"docker build from {choice.base.name} for {target} with {', '.join(PACKAGES)}")
            await anyio.to_thread.run_sync(
                partial(
                    dockerfile.build,
                    docker,
                    Path(tmp),
                    candidate,
                    platform=target,
                    apt_mirror=options.apt_mirror,
                    say=say,
                )
            )

    async def with_mmdebstrap(docker: object, candidate: str, say: Log) -> None:
        apt = host_apt_sources()
        with tempfile.TemporaryDirectory(prefix=f"{IMAGE_REPO}-") as tmp:
            tarball = Path(tmp) / "root.tar"
            say(f"mmdebstrap {apt.suite} for {target} with {', '.join(PACKAGES)} (about a minute)")
            await mmdebstrap(apt, PACKAGES, Path(tmp), tarball, platform=target)
            await import_root(docker, tarball, candidate, say)

    make = with_dockerfile if choice.route is Route.DOCKERFILE else with_mmdebstrap
    smoke = " ".join(SMOKE_TEST)
    return await build_once(
        tag, IMAGE_REPO, make, _smoke_test, smoke=smoke, client=docker, log=say, route=choice
    )


@dataclass(frozen=True)
class BuildStart:
    """A build decided: the engine, the tag, the platform and the route (this file and clis_image.py)."""

    docker: object
    tag: str
    target: str
    route: RouteChoice
    say: Log


async def start_build(
    tag: str,
    client: object | None,
    options: BuildOptions,
    log: Log | None,
    *,
    needs: Callable[[str], None] = lambda _tag: None,
) -> BuildStart | BuildReport:
    """`tag`'s report when the engine has it already; else, once `needs(tag)` found nothing missing on
    this machine, the platform and the route, said in the log."""
    say = log or (lambda _line: None)
    docker = client or await anyio.to_thread.run_sync(connect)
    existing = await anyio.to_thread.run_sync(_image_size, docker, tag)
    if existing is not None:
        return BuildReport(tag, False, 0.0, existing)
    needs(tag)
    target = await target_platform(docker, options)
    choice = await anyio.to_thread.run_sync(
        partial(
            choose_route,
            docker,
            forced=options.route,
            platform=target,
            offline_tools=("mmdebstrap",),
            base=options.base,
        )
    )
    say(f"route: {choice.route} ({choice.reason})")
    if choice.base is not None:
        say(f"base: {choice.base.recorded}")  # which image the build starts from (also its label)
    return BuildStart(docker, tag, target, choice, say)


async def build_once(
    tag: str,
    repo: str,
    make: MakeCandidate,
    check: Callable[[object, str], None],
    *,
    smoke: str,
    client: object,
    log: Log,
    route: RouteChoice,
) -> BuildReport:
    """Build `tag`: `make` builds a candidate under a temporary tag, and only a candidate that passes
    `check` (`smoke`, in words) gets `tag`; the candidate goes either way (this file and
    clis_image.py)."""
    started = time.monotonic()
    candidate = f"{repo}-candidate:{secrets.token_hex(4)}"
    try:
        await make(client, candidate, log)
        log(f"smoke test: {smoke}")
        await anyio.to_thread.run_sync(check, client, candidate)
        await anyio.to_thread.run_sync(_tag, client, candidate, tag)
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_remove_image, client, candidate)
    size = await anyio.to_thread.run_sync(_image_size, client, tag)
    log(f"built {tag}: {(size or 0) // 1_000_000} MB in {time.monotonic() - started:.0f} s ({route.route})")
    return BuildReport(tag, True, time.monotonic() - started, size or 0, route)


async def target_platform(docker: object, options: BuildOptions) -> str:
    """The platform named (--platform), else the engine's own."""
    if options.platform:
        return options.platform
    return await anyio.to_thread.run_sync(engine_platform, docker)


def engine_platform(docker: object) -> str:
    """The engine's own platform, `linux/amd64` or `linux/arm64` (what its containers run natively)."""
    info = docker.version()  # type: ignore[attr-defined]
    return f"{info.get('Os', 'linux')}/{info.get('Arch', 'amd64')}"


async def import_root(docker: object, tarball: Path, candidate: str, say: Log) -> None:
    """`docker import` the root tarball as `candidate`, with the recipe's image configuration."""
    say(f"importing {tarball.stat().st_size // 1_000_000} MB as {candidate}")
    image_id = await anyio.to_thread.run_sync(_import, docker, tarball)
    await anyio.to_thread.run_sync(_tag, docker, image_id, candidate)


def build_image_sync(*, options: BuildOptions | None = None) -> BuildReport:
    """`conclave sandbox build`: build the image from a synchronous caller, printing its progress."""
    return anyio.run(partial(build_image, options=options, log=print))


def host_apt_sources(root: Path = Path("/")) -> AptSources:
    """The host's own Debian/Ubuntu mirrors for its release (third-party repositories left out)."""
    suite = _os_release(root).get("VERSION_CODENAME", "")
    stanzas: list[dict[str, str]] = []
    for path in sorted((root / "etc/apt/sources.list.d").glob("*.sources")):
        stanzas += _deb822_stanzas(path.read_text())
    one_line = root / "etc/apt/sources.list"
    if one_line.exists():
        stanzas += _one_line_stanzas(one_line.read_text())
    if not suite and stanzas:
        suite = stanzas[0]["Suites"].split()[0]
    ours = [s for s in stanzas if suite and _is_release(s["Suites"], suite)]
    if not ours:
        raise SandboxError(
            "cannot find this machine's Debian mirrors in /etc/apt/sources.list(.d); "
            "the mmdebstrap route builds from them; use `conclave sandbox build --route dockerfile`"
        )
    text = "\n".join("".join(f"{k}: {v}\n" for k, v in stanza.items()) for stanza in ours)
    return AptSources(suite, text)


def _is_release(suites: str, codename: str) -> bool:
    return all(s == codename or s.startswith(codename + "-") for s in suites.split())


def _deb822_stanzas(text: str) -> list[dict[str, str]]:
    found = []
    for block in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue  # comments; multi-line fields (inline keys) are not carried over
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
        types = fields.get("Types", "").split()
        enabled = fields.get("Enabled", "yes") != "no"
        if "deb" in types and enabled and "URIs" in fields and "Suites" in fields:
            keep = {"Types": "deb", "URIs": fields["URIs"], "Suites": fields["Suites"]}
            keep["Components"] = fields.get("Components", "main")
            if "Signed-By" in fields:
                keep["Signed-By"] = fields["Signed-By"]
            found.append(keep)
    return found


def _one_line_stanzas(text: str) -> list[dict[str, str]]:
    found = []
    for line in text.splitlines():
        match = _ONE_LINE.match(line)
        if not match:
            continue
        stanza = {"Types": "deb", "URIs": match["uri"], "Suites": match["suite"]}
        stanza["Components"] = match["comps"].split("#")[0].strip() or "main"
        for option in (match["opts"] or "").split():
            key, _, value = option.partition("=")
            if key == "signed-by":
                stanza["Signed-By"] = value
        found.append(stanza)
    return found


def _os_release(root: Path) -> dict[str, str]:
    path = root / "etc/os-release"
    if not path.exists():
        return {}
    pairs = (line.partition("=") for line in path.read_text().splitlines() if "=" in line)
    return {key: value.strip().strip('"') for key, _, value in pairs}


async def mmdebstrap(
    sources: AptSources,
    packages: Sequence[str],
    tmp: Path,
    tarball: Path,
    *,
    platform: str,
    hooks: Sequence[str] = (),
) -> None:
    """The root for `platform` as a tarball; `hooks` are more customize hooks (the CLI image's npm
    prefix and its layout). A foreign architecture runs its maintainer scripts through binfmt_misc."""
    sources_file = tmp / "conclave.sources"  # the .sources suffix keeps it deb822 inside the image
    sources_file.write_text(sources.text)
    argv = [
        "mmdebstrap",
        f"--variant={VARIANT}",
        f"--architectures={debian_arch(platform)}",
        "--include=" + ",".join(packages),
        "--format=tar",
        f"--hook-dir={_HOOKS / 'merged-usr'}",
        f"--hook-dir={_HOOKS / 'eatmydata'}",
        *(f"--dpkgopt={option}" for option in DPKG_EXCLUDES),
        f"--customize-hook={ADD_USER}",
        *(f"--customize-hook={hook}" for hook in hooks),
        sources.suite,
        str(tarball),
        str(sources_file),
    ]
    result = await anyio.run_process(argv, check=False, env={**os.environ, "LC_ALL": "C.UTF-8"})
    if result.returncode != 0 or not tarball.exists() or tarball.stat().st_size == 0:
        raise SandboxError(
            f"mmdebstrap failed (exit {result.returncode}); nothing was imported:\n{_tail(result.stderr)}"
        )


def _import(docker: object, tarball: Path) -> str:
    """Import the root with no name and return the image id the engine replies with."""
    import docker as sdk

    try:
        reply = docker.api.import_image_from_file(  # type: ignore[attr-defined]
            str(tarball), changes=[*IMAGE_CONFIG, f"LABEL {ROUTE_LABEL}=mmdebstrap"]
        )
    except sdk.errors.DockerException as exc:
        raise SandboxError(f"the engine refused to import {tarball.name}: {exc}") from exc
    return imported_id(str(reply))


def imported_id(reply: str) -> str:
    """The image id in an import's reply: one JSON object per line, the last naming `sha256:...` in
    `status` (Docker) or `id` (Podman also). The engine may report a failure inside a 200 reply."""
    found = None
    for line in reply.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if not isinstance(message, dict):
            continue
        if message.get("error") or message.get("errorDetail"):
            break
        for key in ("id", "status"):
            value = message.get(key)
            if isinstance(value, str) and value.startswith("sha256:"):
                found = value
    if found is None:
        raise SandboxError(
            f"the engine's reply to the import names no image id, so the build stopped:\n{_tail(reply)}\n"
            "check that the engine answers Docker's API (`docker version` with the same DOCKER_HOST)"
        )
    return found


def _smoke_test(docker: object, image: str) -> None:
    smoke_test(
        docker,
        image,
        list(SMOKE_TEST),
        environment={"HOME": "/workspace"},
        timeout_s=120,
        what=f"the candidate image ({' '.join(SMOKE_TEST)})",
    )


def smoke_test(
    docker: object,
    image: str,
    command: list[str],
    *,
    environment: dict[str, str],
    timeout_s: int,
    what: str,
    tmpfs: dict[str, str] | None = None,
) -> None:
    """Run `command` in `image` as uid 1000 with no network, read-only, every capability dropped; a
    non-zero exit raises SandboxError and the candidate is not tagged (this file and clis_image.py)."""
    import docker as sdk

    try:
        container = docker.containers.create(  # type: ignore[attr-defined]
            image,
            command,
            user="1000:1000",
            network_mode="none",
            read_only=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            environment=environment,
            **({"tmpfs": tmpfs} if tmpfs else {}),
        )
    except sdk.errors.DockerException as exc:
        raise SandboxError(f"the candidate image {image} cannot even be created: {exc}") from exc
    try:
        container.start()
        status = container.wait(timeout=timeout_s)
        if status.get("StatusCode") != 0:
            output = container.logs(stdout=True, stderr=True)
            raise SandboxError(
                f"{what} failed its smoke test (exit {status.get('StatusCode')}); "
                f"not tagged:\n{_tail(output)}"
            )
    except (sdk.errors.DockerException, OSError) as exc:  # OSError: the wait's read timed out
        raise SandboxError(
            f"{what} could not run its smoke test ({exc}); not tagged. The engine could not start a "
            f"container: {ENGINE_NEEDS}"
        ) from exc
    finally:
        with contextlib.suppress(sdk.errors.DockerException):
            container.remove(force=True)


def _tag(docker: object, candidate: str, tag: str) -> None:
    import docker as sdk

    repo, _, version = tag.rpartition(":")
    try:
        docker.images.get(candidate).tag(repo, version)  # type: ignore[attr-defined]
    except sdk.errors.DockerException as exc:
        raise SandboxError(f"could not tag the image {candidate} as {tag}: {exc}") from exc


def _image_size(docker: object, tag: str) -> int | None:
    import docker as sdk

    try:
        return int(docker.images.get(tag).attrs.get("Size", 0))  # type: ignore[attr-defined]
    except sdk.errors.ImageNotFound:
        return None
    except sdk.errors.DockerException as exc:
        raise SandboxError(f"the engine could not look up the image {tag}: {exc}; {ENGINE_FIX}") from exc


def _remove_image(docker: object, image_id: str) -> None:
    """Remove the candidate's name: the image too if that was its only name (a candidate that failed),
    only the name once the real tag is on it. Gone already is fine, and so is an engine that refuses (the
    build's own error says what failed; an untagged image is only disk space)."""
    import docker as sdk

    with contextlib.suppress(sdk.errors.DockerException):
        docker.images.remove(image_id, force=True)  # type: ignore[attr-defined]


def _tail(data: bytes | str, limit: int = 4000) -> str:
    text = data.decode(errors="replace") if isinstance(data, bytes) else data
    return text if len(text) <= limit else "…" + text[-limit:]


def image_tag(spec: SandboxSpec) -> str:
    """The team's image, with this version's tag when it names none.

    `conclave-sandbox` -> `conclave-sandbox:0.1.0-<recipe digest>`.
    """
    if spec.image == IMAGE_REPO:
        return default_tag()
    return spec.image if ":" in spec.image.rsplit("/", 1)[-1] else f"{spec.image}:latest"
