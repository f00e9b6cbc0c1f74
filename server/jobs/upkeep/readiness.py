"""Whether a server can take jobs now (the HTTP front's /readyz, app/health.py): its store answers a read
and, when one is configured, its Docker engine answers too, and so does a front's queue (Redis:
jobs/queue.py), without which it cannot hand its jobs to the workers.

An engine is configured when DOCKER_HOST names one or the default socket exists; a server with neither
runs only teams without commands, so it is ready without one. Each check has a time limit, so a hung
engine or a locked database makes the server not ready rather than the probe hang.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import anyio
import anyio.to_thread
from pydantic import BaseModel, ConfigDict

from conclave.jobs.queue import JobQueue
from conclave.jobs.store.async_store import AsyncStore
from conclave.sandbox.engine import engine_status

CHECK_S = 5.0  # each check's time limit
DEFAULT_SOCKET = Path("/var/run/docker.sock")

PartState = Literal["ok", "failed", "not configured"]
# What /readyz, which needs no token, says of a part that failed: never its address, URL or message.
REASONS = {
    "store": "the job store did not answer",
    "engine": "the Docker engine did not answer",
    "queue": "the job queue did not answer",
}


class Readiness(BaseModel):
    """What /readyz answers: ready only when every configured part answered."""

    model_config = ConfigDict(extra="forbid")

    ready: bool
    store: PartState
    engine: PartState
    queue: PartState = "not configured"
    errors: list[str] = []  # why, in full (addresses and URLs included): for the operator, not /readyz

    def public(self) -> Readiness:
        """What anyone may be told: the parts' states and a coarse reason for each that failed."""
        failed = [reason for part, reason in REASONS.items() if getattr(self, part) == "failed"]
        return self.model_copy(update={"errors": failed})


async def readiness(
    store: AsyncStore, environ: Mapping[str, str], queue: JobQueue | None = None
) -> Readiness:
    """Ask the store and (if configured) the engine and the queue, each within CHECK_S."""
    errors: list[str] = []
    store_check: PartState = "ok"
    try:
        with anyio.fail_after(CHECK_S):
            await store.read(store.sync.ping)
    except TimeoutError:
        store_check = "failed"
        errors.append(f"the job store did not answer a read within {CHECK_S:g} s")
    except Exception as exc:  # any database error: not ready, and why
        store_check = "failed"
        errors.append(f"the job store failed a read: {exc}")
    engine_check: PartState = "not configured"
    if environ.get("DOCKER_HOST") or DEFAULT_SOCKET.exists():
        with anyio.move_on_after(CHECK_S):
            status = await anyio.to_thread.run_sync(engine_status, abandon_on_cancel=True)
            engine_check = "ok" if status.available else "failed"
            if status.error:
                errors.append(status.error)
        if engine_check == "not configured":
            engine_check = "failed"
            errors.append(f"the Docker engine did not answer within {CHECK_S:g} s")
    queue_check: PartState = "not configured"
    if queue is not None:
        queue_check = "ok"
        try:
            with anyio.fail_after(CHECK_S):
                await queue.ping()
        except Exception as exc:  # a QueueUnavailable saying why, or the time limit
            queue_check = "failed"
            errors.append(str(exc) or f"the job queue did not answer within {CHECK_S:g} s")
    ready = store_check == "ok" and engine_check != "failed" and queue_check != "failed"
    return Readiness(ready=ready, store=store_check, engine=engine_check, queue=queue_check, errors=errors)
