"""Where a secret would have leaked: the files under a folder that hold any of them (a job's state, the
user's project), for the tests that run a CLI member on the user's login."""

from __future__ import annotations

from pathlib import Path


def holding(root: Path, secrets: list[str]) -> list[str]:
    """The files under `root` that hold any of `secrets`."""
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and not path.is_socket():
            data = path.read_bytes()
            if any(secret.encode() in data for secret in secrets):
                found.append(str(path))
    return found
