"""Run one part of a bench script in a child process on a source tree (a commit's, or this one), so the
before and after of a comparison each import their own code: the child prints its result as JSON on its
last line (bench_checks.py, bench_cli_decisions.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_child(script: str, part: str, tree: Path) -> dict[str, Any]:
    """`python script --child part --tree tree`'s result; SystemExit with its output when it fails."""
    done = subprocess.run(
        [sys.executable, script, "--child", part, "--tree", str(tree)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    if done.returncode != 0:
        raise SystemExit(f"{part} on {tree} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))
