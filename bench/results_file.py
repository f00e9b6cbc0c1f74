"""What the benches share: each run in a folder of its own, and the result written to
bench/results/<name>.json and shown (as JSON, or as a table of one line a figure)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


async def in_fresh_folders(run: Callable[[Path], Awaitable[T]], count: int) -> list[T]:
    """`run(root)` `count` times, one after the other, each in a new empty folder (all removed after)."""
    with tempfile.TemporaryDirectory() as tmp:
        results = []
        for index in range(count):
            root = Path(tmp) / str(index)
            root.mkdir()
            results.append(await run(root))
    return results


def write_results(path: Path, result: dict[str, Any], *, table: bool = False) -> None:
    """Write `result` to `path` and print it: the JSON, or with `table` a line a key and where it went."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    if not table:
        print(json.dumps(result, indent=2))
        return
    width = max(map(len, result))
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    print(f"wrote {path}")
