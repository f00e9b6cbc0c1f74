"""The public Debian base under its public name, for an engine that cannot pull it.

No registry is reachable here, so the Dockerfile route (server/sandbox/dockerfile.py) gets its base the
way a registry would give it: `debian:bookworm-slim`, made as Debian makes it (mmdebstrap's minbase
variant, the release's own sources, docs and man pages left out) from this machine's mirror, and
imported with the base's own CMD. Made once per engine and platform; an image of that name that is
already there is kept.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from conclave.sandbox.image import host_apt_sources
from conclave.sandbox.recipe import BASE_IMAGE, DPKG_EXCLUDES, RELEASE, VARIANT, debian_arch


def ensure_public_base(platform: str = "linux/amd64", name: str = BASE_IMAGE) -> str:
    """`name` in the engine (for `platform`), made from this machine's mirror when it is missing."""
    if subprocess.run(["docker", "image", "inspect", name], capture_output=True).returncode == 0:
        return name
    sources = host_apt_sources()
    assert sources.suite == RELEASE, f"this machine's release is {sources.suite}, the base's {RELEASE}"
    with tempfile.TemporaryDirectory(prefix="conclave-base-") as tmp:
        listing = Path(tmp) / "debian.sources"
        listing.write_text(sources.text)
        tarball = Path(tmp) / "root.tar"
        subprocess.run(
            [
                "mmdebstrap",
                f"--variant={VARIANT}",
                f"--architectures={debian_arch(platform)}",
                "--format=tar",
                "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
                *(f"--dpkgopt={option}" for option in DPKG_EXCLUDES),
                RELEASE,
                str(tarball),
                str(listing),
            ],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            ["docker", "import", "--platform", platform, "--change", 'CMD ["bash"]', str(tarball), name],
            check=True,
            capture_output=True,
        )
    return name
