"""Build the sandbox image with no registry: mmdebstrap a Debian root, `docker import` it, smoke-test, tag.

`build_image()` does nothing when the tag exists. Otherwise:

1. `mmdebstrap --variant=essential --include=python3,python3-pytest,ca-certificates` with the
   `merged-usr` and `eatmydata` hooks, docs/man pages/locales left out by dpkg `path-exclude` options,
   and a customize hook that adds the `sandbox` user (uid/gid 1000, home /workspace). The mirrors are
   the ones apt on this machine uses (its deb822 `.sources` stanzas for the host's release, security
   suite included), so the build reaches no other network; they land in the image as apt's own
   `.sources` file.
2. The tarball goes to a temporary file first (never a pipe, so a failed mmdebstrap cannot hide behind a
   successful import) and is imported with no name: the candidate is the image id the import returns.
   Engines name an imported image their own way (Podman ignores the tag and prefixes `docker.io/library/`
   or `localhost/`), so the build never looks the candidate up by a name.
3. The candidate runs `python3 -c 'import json,sqlite3,ssl,pytest'` as uid 1000 with no network;
   only then does it get the real tag. On any failure the candidate is removed and `SandboxError`
   carries the tool's stderr.

`build_image_sync()` is the CLI's entry (`conclave sandbox build`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import anyio
import anyio.to_thread

from conclave import __version__
from conclave.config.models import SandboxSpec
from conclave.errors import SandboxError
from conclave.sandbox.engine import ENGINE_NEEDS, connect
from conclave.sandbox.engine import FIX as ENGINE_FIX

IMAGE_REPO = "conclave-sandbox"
# pytest: the check a Python project most often names (`verify: pytest -q`) works out of the box
DEFAULT_PACKAGES = ("python3", "python3-pytest", "ca-certificates")
SMOKE_TEST = ("python3", "-c", "import json, sqlite3, ssl, pytest")
_HOOKS = Path("/usr/share/mmdebstrap/hooks")
_EXCLUDES = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",  # licences stay
)
# uid/gid 1000 with /workspace as home; `*` in shadow: no password login at all.
_ADD_USER = (
    'echo "sandbox:x:1000:1000:conclave sandbox:/workspace:/bin/sh" >> "$1/etc/passwd"'
    ' && echo "sandbox:x:1000:" >> "$1/etc/group"'
    ' && echo "sandbox:*:19000:0:99999:7:::" >> "$1/etc/shadow"'
)
_CHANGES = (
    'CMD ["sleep", "infinity"]',
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    "USER 1000:1000",
    "WORKDIR /workspace",
    f"LABEL conclave.sandbox.container={__version__}",
)

_ONE_LINE = re.compile(r"\s*deb\s+(?:\[(?P<opts>[^\]]*)\]\s+)?(?P<uri>\S+)\s+(?P<suite>\S+)\s*(?P<comps>.*)")

Log = Callable[[str], None]


def default_tag() -> str:
    """The image this version of Conclave runs agents' commands in: the version and a digest of the
    recipe, so a changed recipe (say, one more package) is built anew instead of reusing an old tag."""
    recipe = repr((DEFAULT_PACKAGES, SMOKE_TEST, _EXCLUDES, _ADD_USER, _CHANGES)).encode()
    return f"{IMAGE_REPO}:{__version__}-{hashlib.sha256(recipe).hexdigest()[:8]}"


@dataclass(frozen=True)
class BuildReport:
    """What `build_image` did."""

    tag: str
    built: bool  # False: the tag already existed, nothing was done
    seconds: float
    size_bytes: int


@dataclass(frozen=True)
class AptSources:
    """The release to build and the deb822 text that names its mirrors."""

    suite: str
    text: str


async def build_image(
    tag: str | None = None,
    *,
    client: object | None = None,
    packages: Sequence[str] = DEFAULT_PACKAGES,
    sources: AptSources | None = None,
    log: Log | None = None,
) -> BuildReport:
    """Build `tag` (default `conclave-sandbox:<version>`) unless it exists; see the module docstring."""

    async def root(folder: Path, say: Log) -> Path:
        apt = sources or host_apt_sources()
        tarball = folder / "root.tar"
        say(f"mmdebstrap {apt.suite} with {', '.join(packages)} (about a minute)")
        await _mmdebstrap(apt, packages, folder, tarball)
        return tarball

    return await build_once(
        tag or default_tag(),
        IMAGE_REPO,
        root,
        _smoke_test,
        smoke=" ".join(SMOKE_TEST),
        tools=("mmdebstrap",),
        rerun="conclave sandbox build",
        client=client,
        log=log,
    )


async def build_once(
    tag: str,
    repo: str,
    root: Callable[[Path, Log], Awaitable[Path]],
    check: Callable[[object, str], None],
    *,
    smoke: str,
    tools: Sequence[str],
    rerun: str,
    client: object | None,
    log: Log | None,
) -> BuildReport:
    """Build `tag` unless it exists: `root(folder, say)` writes the root tarball in a temporary folder,
    it is imported with no name (the candidate is the id the engine returns), and only a candidate that
    passes `check` (`smoke`, in words) gets `tag`; a candidate that fails is removed. `tools`: host
    commands the build needs (the apt package of the same name), `rerun`: the command to run once they
    are installed (this file and clis_image.py)."""
    say = log or (lambda _line: None)
    docker = client or await anyio.to_thread.run_sync(connect)
    started = time.monotonic()
    existing = await anyio.to_thread.run_sync(_image_size, docker, tag)
    if existing is not None:
        return BuildReport(tag, False, time.monotonic() - started, existing)
    for tool in tools:
        if shutil.which(tool) is None:
            raise SandboxError(
                f"cannot build {tag}: {tool} is not installed; install it (`apt-get install {tool}`) "
                f"and run `{rerun}` again"
            )
    with tempfile.TemporaryDirectory(prefix=f"{repo}-") as tmp:
        tarball = await root(Path(tmp), say)
        say(f"importing {tarball.stat().st_size // 1_000_000} MB")
        candidate = await anyio.to_thread.run_sync(_import, docker, tarball)
    tagged = False
    try:
        say(f"smoke test of {candidate[:19]}: {smoke}")
        await anyio.to_thread.run_sync(check, docker, candidate)
        await anyio.to_thread.run_sync(_tag, docker, candidate, tag)
        tagged = True
    finally:
        if not tagged:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_remove_image, docker, candidate)
    size = await anyio.to_thread.run_sync(_image_size, docker, tag)
    say(f"built {tag}: {(size or 0) // 1_000_000} MB in {time.monotonic() - started:.0f} s")
    return BuildReport(tag, True, time.monotonic() - started, size or 0)


def build_image_sync(tag: str | None = None, *, log: Log | None = print, **options: object) -> BuildReport:
    """`conclave sandbox build`: build the image from a synchronous caller (prints progress by default)."""
    return anyio.run(partial(build_image, tag, log=log, **options))  # type: ignore[arg-type]


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
            "pass sources= to build_image (a deb822 text and a suite)"
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


async def _mmdebstrap(
    sources: AptSources, packages: Sequence[str], tmp: Path, tarball: Path, hooks: Sequence[str] = ()
) -> None:
    """The root as a tarball; `hooks` are more customize hooks (the CLI image copies its CLIs in)."""
    sources_file = tmp / "conclave.sources"  # the .sources suffix keeps it deb822 inside the image
    sources_file.write_text(sources.text)
    argv = [
        "mmdebstrap",
        "--variant=essential",
        "--include=" + ",".join(packages),
        "--format=tar",
        f"--hook-dir={_HOOKS / 'merged-usr'}",
        f"--hook-dir={_HOOKS / 'eatmydata'}",
        *(f"--dpkgopt={option}" for option in _EXCLUDES),
        f"--customize-hook={_ADD_USER}",
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
            str(tarball), changes=list(_CHANGES)
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
    """Remove a candidate that failed; gone already is fine, and so is an engine that refuses (the
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
