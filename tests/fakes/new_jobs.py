"""Jobs written straight to a store, as admission would hand them over (server/jobs/store/new_job.py):

store.create_job(new_job("cj-0123456789ab", "task", caller="alice"), os.getpid(), "owner")
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from conclave.config.models import AgentSpec, Team
from conclave.jobs.derived import JobOptions
from conclave.jobs.request import JobRequest
from conclave.jobs.store.new_job import NewJob


def new_job(
    job_id: str,
    task: str = "task",
    *,
    team: str | Team = "team",
    caller: str = "local",
    options: JobOptions | None = None,
    follow_up: str | None = None,
) -> NewJob:
    """`task` for `team` (a name: a one-member team of that name), asked as the request alone."""
    shaped = team if isinstance(team, Team) else Team(name=team, agents=[AgentSpec(model="openai/m")])
    request = JobRequest(task=task, team=shaped.name, follow_up=follow_up)
    return NewJob(job_id, task, shaped, caller, request, options or JobOptions(), follow_up)


def unreadable_teams(database: Path, team_json: str = "{}") -> None:
    """Every team stored in the SQLite file `database` made one that no longer reads (as an older
    release's may): a job taken over is then marked interrupted, not run again."""
    db = sqlite3.connect(database)
    db.execute("UPDATE jobs SET team_json = ?", (team_json,))
    db.commit()
    db.close()
