"""The Dockerfile route: the sandbox images built by the engine from a public Debian base (recipe.py).

Where the engine can pull `debian:bookworm-slim` by its pinned digest (recipe.py `BASE_PINNED`; Docker
Desktop, OrbStack, colima, Podman machine, any engine with a registry), this route needs nothing on the
host but the engine, and npm for the CLI image. The Dockerfile is written from the same recipe as the
mmdebstrap route (image.py): the same packages, dpkg excludes, user and image configuration. apt in the
build uses the base's own sources (deb.debian.org) unless `apt_mirror` names another (`--apt-mirror`),
which then stays in the image as the mmdebstrap route's host mirrors do. The build runs for `platform`,
the engine's architecture unless one is named. The image is labelled with the base it was built from.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from conclave.errors import BaseUnavailable, SandboxError
from conclave.sandbox.recipe import (
    ADD_USER,
    BASE_LABEL,
    CLIS_LAYOUT,
    CLIS_PREFIX,
    DPKG_EXCLUDES,
    IMAGE_CONFIG,
    ROUTE_LABEL,
)

_EXCLUDES_FILE = "conclave-dpkg-excludes"
_CLIS_FOLDER = "clis"


@dataclass(frozen=True)
class BaseImage:
    """The image a Dockerfile starts from, and how the engine got it (said in `conclave sandbox build`).

    `name` is what FROM names: the reference asked for (pinned by digest: recipe.py `BASE_PINNED`), or,
    where the engine could not pull it and holds no copy of it, the engine's own image of its tag alone
    (`pinned` is then the reference it could not get). `digest` is the pulled reference's digest, `image`
    the engine's id of the image used (its config's digest): together they say which base a build used."""

    name: str
    platform: str
    pull_error: str | None = None  # None: pulled; else why the pull failed and the engine's copy serves
    digest: str = ""
    image: str = ""
    pinned: str = ""

    @property
    def pulled(self) -> bool:
        return self.pull_error is None

    @property
    def recorded(self) -> str:
        """Which base this is, as the build prints it and labels the image (recipe.py `BASE_LABEL`)."""
        if "@" in self.name:
            return self.name
        return f"{self.name}@{self.digest}" if self.digest else f"{self.name} (image {self.image})"

    @property
    def how(self) -> str:
        if self.pull_error is None:
            return f"the engine pulled {self.name} for {self.platform}"
        if self.pinned:
            return (
                f"{self.not_pulled}; using the copy it has of {self.name} (image {self.image}), which is not "
                f"the pinned one"
            )
        return f"{self.not_pulled}; using the copy it has"

    @property
    def not_pulled(self) -> str:
        return f"the engine could not pull {self.pinned or self.name} ({self.pull_error})"


def get_base(docker: object, name: str, platform: str) -> BaseImage:
    """Pull `name` for `platform` (by its digest when it has one); where the pull fails, the engine's own
    copy of it, else of its tag alone; else SandboxError."""
    import docker as sdk

    tag, _, digest = name.partition("@")
    try:
        image = docker.images.pull(name, platform=platform)  # type: ignore[attr-defined]
    except sdk.errors.DockerException as exc:
        reason = _first_line(str(getattr(exc, "explanation", None) or exc))
        for held in (name, tag) if digest else (name,):
            try:
                image = docker.images.get(held)  # type: ignore[attr-defined]
            except sdk.errors.ImageNotFound:
                continue
            # a copy of the tag alone is named by its image id: a digest the engine keeps for it (Podman
            # makes one for any image) says nothing a registry vouched for
            pinned = name if held != name else ""
            return BaseImage(held, platform, reason, digest if held == name else "", str(image.id), pinned)
        raise BaseUnavailable(name, reason) from exc
    return BaseImage(name, platform, None, digest or _repo_digest(image), str(image.id))


def _repo_digest(image: object) -> str:
    """The digest a registry gave the image (its first RepoDigests entry), or "" for one it never did."""
    found = (getattr(image, "attrs", {}) or {}).get("RepoDigests") or []
    return str(found[0]).rpartition("@")[2] if found else ""


def plain_dockerfile(base: BaseImage, packages: Sequence[str]) -> str:
    """The plain image: the base, the recipe's packages, its user and its image configuration, and the
    base it was built from as a label."""
    return "\n".join(
        (
            f"FROM {base.name}",
            "ARG APT_MIRROR=",
            "USER root",
            f"COPY {_EXCLUDES_FILE} /etc/dpkg/dpkg.cfg.d/conclave",
            _run(_apt_install(packages, upgrade=True)),
            _run(ADD_USER, ""),
            *IMAGE_CONFIG,
            f"LABEL {ROUTE_LABEL}=dockerfile",
            f"LABEL {BASE_LABEL}={json.dumps(base.recorded)}",
            "",
        )
    )


def clis_dockerfile(base: str, packages: Sequence[str]) -> str:
    """The CLI image: the plain image (`base`) and more packages, then the npm prefix laid out in a
    stage of its own and copied over in one layer (laid out in place, Claude Code's binary put over
    its placeholder would be stored twice, about 200 MB)."""
    return "\n".join(
        (
            f"FROM {base} AS packages",
            "ARG APT_MIRROR=",
            "USER root",
            _run(_apt_install(packages, upgrade=False)),
            "FROM packages AS layout",
            f"COPY {_CLIS_FOLDER} {CLIS_PREFIX}",
            _run(CLIS_LAYOUT, ""),
            "FROM packages",
            f"COPY --from=layout {CLIS_PREFIX} {CLIS_PREFIX}",
            "COPY --from=layout /usr/local/bin /usr/local/bin",
            *IMAGE_CONFIG,
            f"LABEL {ROUTE_LABEL}=dockerfile",
            "",
        )
    )


def write_context(folder: Path, dockerfile: str, clis_prefix: Path | None = None) -> None:
    """The build context: the Dockerfile, the dpkg excludes, and the CLI image's npm prefix (moved)."""
    (folder / "Dockerfile").write_text(dockerfile)
    (folder / _EXCLUDES_FILE).write_text("".join(f"{line}\n" for line in DPKG_EXCLUDES))
    if clis_prefix is not None:
        clis_prefix.rename(folder / _CLIS_FOLDER)


def build(
    docker: object,
    folder: Path,
    candidate: str,
    *,
    platform: str,
    apt_mirror: str | None,
    say: Callable[[str], None],
) -> None:
    """`docker build` the context in `folder` as `candidate`; a failed step raises SandboxError."""
    import docker as sdk

    args = {"APT_MIRROR": apt_mirror} if apt_mirror else {}
    lines: list[str] = []
    try:
        stream = docker.api.build(  # type: ignore[attr-defined]
            path=str(folder),
            tag=candidate,
            platform=platform,
            buildargs=args,
            rm=True,
            forcerm=True,
            decode=True,
        )
        for item in _items(stream):
            if "error" in item:
                lines.append(str(item["error"]))
                raise SandboxError(
                    f"the Dockerfile build failed; nothing was tagged:\n{_tail(lines)}\n"
                    "fix what the step says (a mirror: --apt-mirror) and run `conclave sandbox build` again"
                )
            text = str(item.get("stream", "")).rstrip()
            if text:
                lines.append(text)
                if text.startswith("Step "):
                    say(text)
    except sdk.errors.DockerException as exc:
        raise SandboxError(f"the Dockerfile build failed: {exc}") from exc


def _apt_install(packages: Sequence[str], *, upgrade: bool) -> str:
    """apt from the base's sources, or `$APT_MIRROR` in place of deb.debian.org; lists removed after."""
    steps = [
        "set -eu",
        'if [ -n "$APT_MIRROR" ]; then for f in /etc/apt/sources.list /etc/apt/sources.list.d/*; do '
        'if [ -f "$f" ]; then sed -i "s#http://deb.debian.org#$APT_MIRROR#g" "$f"; fi; done; fi',
        "export DEBIAN_FRONTEND=noninteractive",
        "apt-get update -qq",
        # the base may lag the mirror's security updates, which the mmdebstrap route has from the start
        *(["apt-get upgrade -y -qq"] if upgrade else []),
        "apt-get install -y -qq --no-install-recommends " + " ".join(shlex.quote(p) for p in packages),
        "apt-get clean",
        "rm -rf /var/lib/apt/lists/*",
    ]
    return "; ".join(steps)


def _run(script: str, *args: str) -> str:
    """A RUN in exec form: the script reaches sh as one argument, whatever quotes it holds."""
    return "RUN " + json.dumps(["sh", "-c", script, "sh", *args])


def _items(stream: object) -> Iterator[dict[str, object]]:
    for item in stream:  # type: ignore[attr-defined]
        if isinstance(item, dict):
            yield item


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _tail(lines: list[str], limit: int = 30) -> str:
    return "\n".join(lines[-limit:])
