"""The sandbox images' one recipe, as data both build routes read (image.py and clis_image.py).

The mmdebstrap route (a Debian root made on the host, then imported) and the Dockerfile route (a public
Debian base the engine pulls) install the same packages into the same layout, add the same user, set
the same image configuration and run the same smoke test, so a job behaves the same on either image.
`VARIANT` is what Debian's `-slim` images are made with, so both routes start from the same package set.
The CLI image's npm packages are pinned, integrity hashes included, by `clis_npm/package-lock.json`,
for linux/amd64 and linux/arm64 alike (npm installs the platform packages of the target's CPU).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from conclave import __version__
from conclave.errors import SandboxError

RELEASE = "bookworm"
BASE_IMAGE = f"debian:{RELEASE}-slim"
# The Dockerfile route pulls its base by digest, so a registry (or whoever moves the tag) cannot give it
# other content. The multi-arch index of debian:bookworm-slim as public Dockerfiles pin it; a newer one is
# a deliberate change here (`docker buildx imagetools inspect debian:bookworm-slim` prints it).
BASE_DIGEST = "sha256:60eac759739651111db372c07be67863818726f754804b8707c90979bda511df"
BASE_PINNED = f"{BASE_IMAGE}@{BASE_DIGEST}"
VARIANT = "minbase"  # Essential and Priority: required, and apt: what debian:*-slim holds
# pytest: the check a Python project most often names (`verify: pytest -q`) works out of the box
PACKAGES = ("python3", "python3-pytest", "ca-certificates")
SMOKE_TEST = ("python3", "-c", "import json, sqlite3, ssl, pytest")
DPKG_EXCLUDES = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",  # licences stay
)
# A shell script run with the image's root folder as $1: uid/gid 1000 with /workspace as home;
# `*` in shadow: no password login at all.
ADD_USER = (
    'echo "sandbox:x:1000:1000:conclave sandbox:/workspace:/bin/sh" >> "$1/etc/passwd"'
    ' && echo "sandbox:x:1000:" >> "$1/etc/group"'
    ' && echo "sandbox:*:19000:0:99999:7:::" >> "$1/etc/shadow"'
)
# Dockerfile instructions: `docker import --change` takes the same ones.
IMAGE_CONFIG = (
    'CMD ["sleep", "infinity"]',
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    "USER 1000:1000",
    "WORKDIR /workspace",
    f"LABEL conclave.sandbox.container={__version__}",
)

# The CLI image: the plain one plus these packages (socat: the egress bridge, sandbox/member.py; Node's
# one library beyond libc) and the npm prefix below at CLIS_PREFIX.
CLI_PACKAGES = ("socat", "git", "libstdc++6")
CLIS_NPM = Path(__file__).parent / "clis_npm"
CLIS_PREFIX = "/opt/conclave-clis"
COMMANDS = ("claude", "codex", "gemini", "copilot", "node")
# Left out of the image (about 105 MB): Node's C headers, Codex's voice helper; relative to the prefix.
TRIM = (
    "node_modules/node-linux-*/include",
    "node_modules/@openai/codex-linux-*/vendor/*/codex-resources/voice",
)
# Run as root inside the image (its root folder as $1, for the links): Claude Code's one install script
# puts its native binary for the image's CPU in place, run by the image's own Node.
CLIS_LAYOUT = " && ".join(
    (
        *(f'ln -s {CLIS_PREFIX}/node_modules/.bin/{name} "$1/usr/local/bin/{name}"' for name in COMMANDS),
        f"cd {CLIS_PREFIX}/node_modules/@anthropic-ai/claude-code",
        f"{CLIS_PREFIX}/node_modules/.bin/node install.cjs >/dev/null",
    )
)
CLIS_SMOKE_TEST = (
    "node --version && claude --version && codex --version && gemini --version && copilot --version "
    "&& socat -V >/dev/null && git --version && timeout --version >/dev/null && python3 -c 'import pytest'"
)

# The engine's architecture (`docker version`'s Arch, or a --platform's) -> Debian's and npm's names.
_ARCHES = {"amd64": ("amd64", "x64"), "x86_64": ("amd64", "x64"), "arm64": ("arm64", "arm64")}
_ARCHES["aarch64"] = _ARCHES["arm64"]
BASE_LABEL = "conclave.sandbox.base"  # the base a Dockerfile-route image was built from (dockerfile.py)
ROUTE_LABEL = "conclave.sandbox.route"  # which route built an image: the one line in which they differ


def plain_digest() -> str:
    """A digest of the plain recipe: a changed recipe (say, one more package) gets a new tag."""
    recipe = (RELEASE, VARIANT, PACKAGES, SMOKE_TEST, DPKG_EXCLUDES, ADD_USER, IMAGE_CONFIG)
    return hashlib.sha256(repr(recipe).encode()).hexdigest()[:8]


def clis_digest() -> str:
    """A digest of the CLI recipe, the npm lock (every pin and hash) included."""
    lock = (CLIS_NPM / "package-lock.json").read_bytes()
    recipe = (plain_digest(), CLI_PACKAGES, CLIS_PREFIX, TRIM, CLIS_LAYOUT, CLIS_SMOKE_TEST)
    return hashlib.sha256(repr(recipe).encode() + lock).hexdigest()[:8]


def debian_arch(platform: str) -> str:
    """`linux/arm64` -> `arm64` (mmdebstrap's --arch)."""
    return _arch(platform)[0]


def npm_cpu(platform: str) -> str:
    """`linux/amd64` -> `x64` (npm's --cpu, and the suffix of Node's platform package)."""
    return _arch(platform)[1]


def _arch(platform: str) -> tuple[str, str]:
    os_name, _, arch = platform.partition("/")
    if os_name != "linux" or arch not in _ARCHES:
        raise SandboxError(
            f"platform {platform!r}: the sandbox images are built for linux/amd64 or linux/arm64; "
            "pass one of those (--platform)"
        )
    return _ARCHES[arch]
