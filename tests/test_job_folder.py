"""A job's folder has one owner: files/job_folder.py's `JobFolder` alone names what is in it."""

from __future__ import annotations

import re
from pathlib import Path

SERVER = Path(__file__).resolve().parent.parent / "server"
OWNER = SERVER / "files" / "job_folder.py"
NAMES = (
    "base",
    "start",
    "agents",
    "snapshots",
    "checks",
    "peers",
    "final",
    "meta",
    "manifest.json",
    "diff.patch",
)
# a path joined from the layout by hand: a layout name as a literal, a job id under the jobs root, a
# name inside a layout folder, or a job's folder carried as a bare path
BY_HAND = re.compile(
    r"/\s*[\"'](?:" + "|".join(re.escape(name) for name in NAMES) + r")[\"']"
    r"|\bjobs_(?:root|dir)\s*/"
    r"|\.(?:agents|snapshots|_?meta|checks|peers)\s*/"
    r"|\bjob_dir\b"
)


def test_only_the_job_folder_names_a_jobs_layout() -> None:
    found = [
        f"{path.relative_to(SERVER)}:{number}: {line.strip()}"
        for path in sorted(SERVER.rglob("*.py"))
        if path != OWNER
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if BY_HAND.search(line)
    ]
    assert not found, "a job's layout built outside files/job_folder.py:\n" + "\n".join(found)
