"""Tool and argument descriptions are written for the calling model: they name tools, arguments and
result fields, never our internals (a function, a constant, a module path).

They are read from server/app/manifest.json, which tests/test_stdio_front.py keeps equal to what the
server answers, so this checks what every client's model reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MANIFEST = Path(__file__).resolve().parents[1] / "server" / "app" / "manifest.json"
SNAKE = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")  # parse_context_paths, job_id
CONSTANT = re.compile(r"\b[A-Z][A-Z0-9]{3,}\b|\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b")  # CALLER, MAX_WAIT_S
MODULE = re.compile(
    r"\bconclave\.\w+|\b(?:server|tools|tests|bench)/[\w/]+\.py\b"
)  # conclave.files, server/errors.py
# Words in capitals a reader knows; variables a user sets (keys, CONCLAVE_* settings).
PLAIN_CAPS = {"JSON", "YAML", "HTTP", "HTTPS", "UTF", "NUL", "PATH"}
USER_VARIABLE = re.compile(r"^(CONCLAVE_\w+|\w+_API_KEY)$")


def tools() -> list[dict[str, Any]]:
    manifest = json.loads(MANIFEST.read_text(encoding="utf-8"))
    return manifest["results"]["tools/list"]["tools"]  # type: ignore[no-any-return]


def descriptions(node: Any, where: str) -> Iterator[tuple[str, str]]:
    """Every `description` under `node`, with where it is."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "description" and isinstance(value, str):
                yield where, value
            else:
                yield from descriptions(value, f"{where}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from descriptions(value, f"{where}[{index}]")


def names(node: Any) -> Iterator[str]:
    """Every property name in a schema: what a calling model may see named."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                yield from value
            yield from names(value)
    elif isinstance(node, list):
        for value in node:
            yield from names(value)


def internal_names(text: str, known: set[str]) -> list[str]:
    found = [word for word in SNAKE.findall(text) if word not in known]
    found += [
        word for word in CONSTANT.findall(text) if word not in PLAIN_CAPS and not USER_VARIABLE.match(word)
    ]
    return found + MODULE.findall(text)


def test_the_checker_catches_what_leaked_before() -> None:
    leaked = (
        "Validated with the context `CALLER` (as `parse_context_paths` does when a job is submitted); "
        "see conclave.files.contexts and MAX_WAIT_S"
    )
    assert internal_names(leaked, {"context_paths"}) == [
        "parse_context_paths",
        "CALLER",
        "MAX_WAIT_S",
        "conclave.files",
    ]
    assert internal_names("set OPENAI_API_KEY or CONCLAVE_MAX_JOBS; JSON or YAML", set()) == []


def test_no_tool_or_argument_description_names_internals() -> None:
    listed = tools()
    known = {tool["name"] for tool in listed} | {name for tool in listed for name in names(tool)}
    leaks = []
    for tool in listed:
        for where, text in descriptions(tool, tool["name"]):
            found = internal_names(text, known)
            if found:
                leaks.append(f"{where}: {found} in {text!r}")
    assert not leaks, "\n".join(leaks)
