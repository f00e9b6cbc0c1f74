"""`preload` (backends/__init__.py): a backend of each hosted provider whose SDK is installed, built
with no request sent, in a fresh interpreter (this one has imported every SDK already)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SCRIPT = """
import json, sys
import anyio
for name in sys.argv[1:]:
    sys.modules[name] = None  # importing it raises ImportError, as when it is not installed
from conclave.backends import preload

async def main() -> None:
    backends = preload()
    for backend in backends:
        await backend.aclose()
    loaded = [name for name in ("openai", "anthropic", "google.genai") if sys.modules.get(name) is not None]
    print(json.dumps({"built": [backend.provider for backend in backends], "loaded": loaded}))

anyio.run(main)
"""


def preloaded(*missing: str) -> dict[str, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *missing], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, list[str]] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize(
    ("missing", "built"),
    [((), ["openai", "anthropic", "gemini"]), (("anthropic",), ["openai", "gemini"])],
)
def test_preload_builds_each_installed_hosted_sdk_and_passes_over_a_missing_one(
    missing: tuple[str, ...], built: list[str]
) -> None:
    result = preloaded(*missing)
    assert result["built"] == built
    expected = {"openai": "openai", "anthropic": "anthropic", "gemini": "google.genai"}
    assert result["loaded"] == [expected[provider] for provider in built]
