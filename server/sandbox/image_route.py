"""Which route builds the sandbox images, and why (`conclave sandbox build` says both).

- `dockerfile` (sandbox/dockerfile.py): the engine builds from a public Debian base, pulled by its
  pinned digest. Chosen when the engine can pull the base: any engine with a registry, on any host.
- `mmdebstrap` (sandbox/image.py): the host makes the Debian root and the engine imports it. Chosen
  when the engine cannot pull and the host has the tools (a Debian or Ubuntu host with no registry,
  such as CI's).
- When neither: a base the engine already holds still serves the Dockerfile route (the pinned one, else
  its copy of the tag, which the reason names by its image id); else the error names what is missing
  and both fixes.
`--route` forces one; its own missing piece is then the error.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from conclave.errors import BaseUnavailable, SandboxError
from conclave.sandbox.dockerfile import BaseImage, get_base
from conclave.sandbox.recipe import BASE_PINNED


class Route(StrEnum):
    DOCKERFILE = "dockerfile"
    MMDEBSTRAP = "mmdebstrap"


@dataclass(frozen=True)
class RouteChoice:
    """The route, and in words why (`conclave sandbox build` prints it)."""

    route: Route
    reason: str
    base: BaseImage | None = None  # the Dockerfile route's base, once the engine has it


def choose_route(
    docker: object,
    *,
    forced: Route | None,
    platform: str,
    offline_tools: Sequence[str],
    base: str = BASE_PINNED,
) -> RouteChoice:
    """Pick the route (see the module docstring); blocking: it may pull `base`."""
    missing = [tool for tool in offline_tools if shutil.which(tool) is None]
    if forced is Route.MMDEBSTRAP:
        if missing:
            raise SandboxError(
                f"--route mmdebstrap needs {' and '.join(missing)} on this machine; install it (Debian or "
                f"Ubuntu: `apt-get install {' '.join(missing)}`), or use --route dockerfile where the "
                f"engine can pull {base}"
            )
        return RouteChoice(Route.MMDEBSTRAP, "--route mmdebstrap")
    if forced is Route.DOCKERFILE:
        try:
            got = get_base(docker, base, platform)
        except BaseUnavailable as exc:
            raise SandboxError(
                f"--route dockerfile: {exc}; give the engine registry access (`docker pull {base}` must "
                f"work) or load the image into it, or use --route mmdebstrap on a Debian or Ubuntu host"
            ) from exc
        return RouteChoice(Route.DOCKERFILE, f"--route dockerfile; {got.how}", got)
    return _auto(docker, base, platform, missing)


def _auto(docker: object, base: str, platform: str, missing: list[str]) -> RouteChoice:
    tools = " or ".join(missing)
    try:
        got = get_base(docker, base, platform)
    except BaseUnavailable as exc:
        if not missing:
            return RouteChoice(Route.MMDEBSTRAP, f"{exc}; this machine builds the root offline")
        raise SandboxError(
            f"cannot build the sandbox image: {exc}, and this machine has no {tools} for the offline "
            f"route; give the engine registry access (`docker pull {base}` must work), or on Debian or "
            f"Ubuntu `apt-get install {' '.join(missing)}`; then run `conclave sandbox build` again"
        ) from exc
    if got.pulled:
        return RouteChoice(Route.DOCKERFILE, got.how, got)
    if not missing:
        return RouteChoice(Route.MMDEBSTRAP, f"{got.not_pulled}; this machine builds the root offline")
    return RouteChoice(Route.DOCKERFILE, f"no {tools} here for the offline route; {got.how}", got)
