"""Where a job's live page is: `conclave web` leaves its address in $CONCLAVE_HOME/web.json while it runs,
so every server sharing the state folder (stdio ones too) can put the page's URL in a JobView.

The file is private like the rest of the state folder (0600 in a 0700 folder) and holds the web view's
token, with which `conclave web --link` and `conclave ask --web` ask the running view for a one-time
sign-in code (web/serve.py `sign_in_link`); it is removed when `conclave web` stops, and a file left by a
process that is gone is ignored.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from conclave.jobs.store.owners import process_alive

WEB_FILE = "web.json"
RACY_NS = 1_000_000_000


class WebServed(BaseModel):
    """A running web view: its base URL, its process and its token."""

    model_config = ConfigDict(extra="forbid")

    url: str
    pid: int
    token: str

    def job_url(self, job_id: str) -> str:
        return f"{self.url}/jobs/{job_id}"


def announce(home: Path, served: WebServed) -> Path:
    """Write web.json (0600) for other processes to find."""
    path = home / WEB_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(served.model_dump_json())
    return path


def withdraw(home: Path, pid: int) -> None:
    """Remove web.json if it is still this process's."""
    found = served(home)
    if found is not None and found.pid == pid:
        (home / WEB_FILE).unlink(missing_ok=True)


def served(home: Path) -> WebServed | None:
    """The web view running for this state folder, if any."""
    found = _parsed(home)
    return found if found is not None and process_alive(found.pid) else None


def _parsed(home: Path) -> WebServed | None:
    try:
        return WebServed.model_validate(json.loads((home / WEB_FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError, ValidationError):
        return None


class WebLinks:
    """Where a server's job pages are: on its own web view (`serve --http` sets `base`), else on `conclave
    web`'s for the same state folder, if one runs. Every JobView asks, so web.json is parsed again only
    when it changes (another inode, size or mtime: `announce` rewrites it, `withdraw` removes it); what
    is left is a stat and a liveness check, blocking, so callers run it in a reader thread
    (jobs/read/view_read.py)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.base: str | None = None
        self._seen: tuple[tuple[int, int, int, int], WebServed | None] | None = None

    def page_url(self, job_id: str) -> str | None:
        """The job's live page; None when no web view is served."""
        if self.base is not None:
            return f"{self.base}/jobs/{job_id}"
        web = self._served()
        return web.job_url(job_id) if web is not None and process_alive(web.pid) else None

    def _served(self) -> WebServed | None:
        try:
            info = os.stat(self.home / WEB_FILE)
        except OSError:
            return None
        stamp = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        seen = self._seen  # one read of the pair: reader threads may replace it meanwhile
        # a file written within the last second may be rewritten within its timestamps' granularity,
        # the same size: it is read again until it is older (git's "racy" index entries, the same way)
        if seen is not None and seen[0] == stamp and time.time_ns() - info.st_mtime_ns > RACY_NS:
            return seen[1]
        found = _parsed(self.home)
        self._seen = (stamp, found)
        return found
