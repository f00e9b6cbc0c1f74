"""Where a secret would have leaked: the files under a folder that hold any of them (a job's state, the
user's project), for the tests that run a CLI member on the user's login."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def holding(root: Path, secrets: list[str]) -> list[str]:
    """The files under `root` that hold any of `secrets`."""
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and not path.is_socket():
            data = path.read_bytes()
            if any(secret.encode() in data for secret in secrets):
                found.append(str(path))
    return found


def tokens(content: bytes, min_length: int = 20) -> list[str]:
    """The tokens of a JSON login file: its strings of `min_length` characters or more (access, refresh and
    ID tokens). The tests' own reading, apart from the one the server filters with (clis/cli_adapter.py)."""
    found: list[str] = []
    stack: list[Any] = [json.loads(content)]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack += list(item.values())
        elif isinstance(item, list):
            stack += item
        elif isinstance(item, str) and len(item) >= min_length:
            found.append(item)
    return found
