"""Who owns a job: whether a process is alive (the one check the job store and the container sweep
share), and the owner of the jobs that wait on the queue for a worker (jobs/queue.py)."""

from __future__ import annotations

import os

# The owner of a job admitted by a front that queued it (CONCLAVE_QUEUE_URL): no process holds it, so
# it has no lease to run out; a worker takes it from this owner (Store.take_queued) when it starts it.
QUEUE_OWNER = "queue"


def process_alive(pid: int) -> bool:
    """True when a process with `pid` exists on this host (ours or another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, someone else's
    return True
