"""Which recording of the handshake the stdio front may use (server/app/manifest.json), on the standard
library alone: the recording is keyed on the versions of Conclave and the libraries that shape what the
app lists, and on a hash of Conclave's own sources, so an edited tool (an editable install) is never
answered from a stale recording.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from importlib import metadata
from pathlib import Path
from typing import Any

MANIFEST = Path(__file__).with_name("manifest.json")
# The libraries whose versions shape what the app lists; a manifest recorded with others is not used.
LIBRARIES = ("fastmcp", "mcp", "pydantic")
PACKAGE = Path(__file__).resolve().parents[1]  # conclave/: its sources shape what the app lists


def load_manifest() -> dict[str, Any] | None:
    """The recorded answers (MANIFEST), or None when missing, unreadable or recorded for other versions."""
    try:
        manifest = json.loads(MANIFEST.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("versions") != installed_versions():
        return None
    return manifest


def source_hash() -> str:
    """A hash of every Python source of Conclave (PACKAGE: tools, models, app): a change to any of them
    may change a tool's schema, so the recording is used only for the very sources it was made from.
    The same for a wheel and an editable install, where conclave.tools lives apart (pyproject)."""
    spec = importlib.util.find_spec("conclave.tools")  # finds the folder without running the package
    found = list(spec.submodule_search_locations or []) if spec is not None else []
    tools = Path(found[0]).resolve() if found else PACKAGE / "tools"
    digest = hashlib.sha256()
    for root, prefix in ((PACKAGE, ""), (tools, "tools/")):
        for path in sorted(root.rglob("*.py")):
            inside = path.relative_to(root)
            if "__pycache__" in inside.parts or (prefix == "" and path.is_relative_to(tools)):
                continue
            digest.update(f"{prefix}{inside.as_posix()}".encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def installed_versions() -> dict[str, str]:
    """Conclave's and the listed libraries' versions, and the hash of Conclave's sources, as the manifest
    records them."""
    from conclave import __version__

    found = {"conclave": __version__, "sources": source_hash()}
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "missing"
    return found
