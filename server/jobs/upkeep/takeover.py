"""Taking over the jobs of a server that died: a job's lease (its owner's id, until `lease_until`,
renewed by the owner's heartbeat: jobs/upkeep/maintenance.py) runs out, or its owner's process is gone; any
server sharing the store claims it (one wins: the claim names the owner it replaces) and resumes it
(jobs/run/lifecycle.py replays its protocol journal, coordination/journal.py).

A starting server looks once before it serves, and a running one at every heartbeat, so a job's
takeover waits at most for its lease (CONCLAVE_STALE_AFTER_S) and one heartbeat.

A job with files resumes from what is durable in its folder (CONCLAVE_JOBS_DIR, which every host of a
shared store mounts), never from the dead process's containers: the copy of the context paths made when
it started (not copied again), and each posted answer's snapshot; each agent's working copy is rebuilt
from its latest snapshot, and its container (and a CLI member's egress proxy) made anew on this
server's engine, the dead one's containers for the job removed where that engine is this one
(jobs/context/files.py, files/workspaces.py `restore`). Checks whose result was reported are not run
again. A coding-agent CLI member keeps no conversation between its runs (each is a fresh CLI process,
coordination/cli_turns.py), so its turn in flight simply runs again in its new container, shown the
current answers; what its killed run had reported of its usage is kept, the rest of that run is lost
with the process (a run this process kills is charged an estimate: clis/member.py). An API member's
call in flight at the death keeps what it was charged: an estimate of its input from its start, or
its provider's figures once they came (coordination/turn_context.py `Provisional`); the resumed job
asks again and charges nothing of it twice. A job that cannot be resumed ends `interrupted`, saying
why: one whose stored team no longer reads.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from pydantic import ValidationError

from conclave.config.models import Team
from conclave.jobs.store.async_store import AsyncStore
from conclave.jobs.store.owners import process_alive
from conclave.jobs.store.sql import JobRow
from conclave.settings import Settings

logger = logging.getLogger(__name__)

Resumer = Callable[[str, str, Team, str], None]  # (job id, task, team, caller): start it resuming


def resumable(row: JobRow) -> Team | str:
    """The job's team when the job can be resumed here, else why not."""
    try:
        return Team.model_validate_json(row.team_json)
    except ValidationError:
        return "its stored team no longer reads"


async def take_over(store: AsyncStore, settings: Settings, owner_id: str, resume: Resumer) -> list[str]:
    """Claim every job whose owner is gone and resume it (or end it `interrupted`, saying why); the
    ids of the jobs resumed."""
    resumed = []
    for job_id, old_owner in await store.orphans(process_alive, settings.stale_after_s):
        row = await store.job(job_id)
        if row is None or not await store.claim(
            job_id, old_owner, owner_id, os.getpid(), settings.stale_after_s
        ):
            continue  # gone, or another server claimed it first
        team = resumable(row)
        if isinstance(team, str):
            await store.set_state(job_id, "interrupted", f"the server that ran this job stopped; {team}")
            continue
        logger.info("resuming job %s (its server stopped)", job_id)
        resume(job_id, row.task, team, row.caller)
        resumed.append(job_id)
    return resumed
