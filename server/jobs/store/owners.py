"""Whether a process is alive: the one check the job store and the container sweep share."""

from __future__ import annotations

import os


def process_alive(pid: int) -> bool:
    """True when a process with `pid` exists on this host (ours or another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, someone else's
    return True
