"""Where a job's live page is: `conclave web` leaves its address in $CONCLAVE_HOME/web.json while it runs,
so every server sharing the state folder (stdio ones too) can put the page's URL in a JobView.

The file is private like the rest of the state folder (0600 in a 0700 folder) and holds the web view's
token, so that `conclave ask --web` can open a login link; it is removed when `conclave web` stops,
and a file left by a process that is gone is ignored.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from conclave.jobs.owners import process_alive

WEB_FILE = "web.json"


class WebServed(BaseModel):
    """A running web view: its base URL, its process and its token."""

    model_config = ConfigDict(extra="forbid")

    url: str
    pid: int
    token: str

    def job_url(self, job_id: str) -> str:
        return f"{self.url}/jobs/{job_id}"

    def login_url(self, job_id: str | None = None) -> str:
        """A link that signs the browser in (it sets the session cookie) and opens the job's page."""
        target = f"&next=/jobs/{job_id}" if job_id else ""
        return f"{self.url}/login?token={self.token}{target}"


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
    try:
        found = WebServed.model_validate(json.loads((home / WEB_FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError, ValidationError):
        return None
    return found if process_alive(found.pid) else None


def page_url(web_base: str | None, home: Path, job_id: str) -> str | None:
    """A job's live page: on this server's own web view (`serve --http`), else on `conclave web`'s for
    the same state folder, if one runs; None when no web view is served."""
    if web_base is not None:
        return f"{web_base}/jobs/{job_id}"
    web = served(home)
    return web.job_url(job_id) if web else None
