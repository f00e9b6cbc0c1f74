"""Follow-ups: a new job that continues an earlier one, and what carries over to it.

    carries over                       why
    the team (its stored form)         the same agents, who keep their letters (the conversation's first seed)
    verify and the budgets             the same check and the same limits per job, unless the caller
                                       gives new ones (a follow-up after a failed check wants the check)
    context_paths                      the same folders and permissions, unless the caller gives others
    the files                          each workspace starts from the earlier answer (files/carry.py); the
                                       diff is against the caller's folder as it is now
    the history                        every earlier round's task, answer and verdict, before the task
    not apply or its consents          writing the caller's files is a consent given per job (force_binary,
                                       allow_artifacts, allow_autorun too)

A job that did not finish (failed, cancelled, interrupted) carries its last best answer: the winner if
one was chosen, else the answer leading when it stopped, else the latest posted.
"""

from __future__ import annotations

import anyio

from conclave.config.models import Team
from conclave.coordination.prompts import Round, history_section
from conclave.errors import InputError
from conclave.files.contexts import ContextPath
from conclave.files.job_folder import JobFolder
from conclave.files.workspaces import Workspaces
from conclave.jobs.read.reader import best_answer, verdict
from conclave.jobs.request import JobRequest
from conclave.jobs.store.sql import ACTIVE_STATES, JobRow, Store

MAX_ROUNDS = 5  # the most recent earlier rounds the team sees; older ones are left out


def carried(earlier: JobRow, request: JobRequest) -> tuple[Team, JobRequest]:
    """The team a follow-up of `earlier` runs with, and `request` with what it carries over (the context
    paths, unless given); refuses a job still running."""
    if earlier.state in ACTIVE_STATES:
        raise InputError(
            "follow_up",
            earlier.id,
            f"that job is still {earlier.state}; steer it with steer_job, or wait for it "
            "(get_status) or cancel it (cancel_job) before following up",
        )
    stored = Team.model_validate_json(earlier.team_json)
    team = request.team
    if team is not None and team.strip() not in (stored.name, ""):
        raise InputError(
            "team",
            team,
            f"a follow-up continues with the earlier job's team ({stored.name!r}); leave team out, "
            "or call ask_team without follow_up to start afresh with another team",
        )
    if request.context_paths is None:  # the same folders and permissions; a consent is given per job
        paths = [ContextPath(path=c.path, permission=c.permission) for c in earlier.options.context_paths]
        request = request.model_copy(update={"context_paths": paths})
    return stored, request


def conversation_history(store: Store, row: JobRow) -> tuple[str, str]:
    """The follow-up `row`'s history for its team, and its conversation's first job's id (for the letters)."""
    chain: list[JobRow] = []
    current = row
    while current.follow_up and current.follow_up not in {e.id for e in chain}:
        earlier = store.job(current.follow_up)
        if earlier is None:
            break  # pruned: the conversation starts after it
        chain.append(earlier)
        current = earlier
    chain.reverse()
    root = chain[0].id if chain else row.id
    rounds = [
        Round(
            task=e.task,
            answer=best_answer(store, e)[1] or "(no answer was posted)",
            verdict=verdict(store, e),
            files=_files_text(e),
        )
        for e in chain[-MAX_ROUNDS:]
    ]
    return history_section(rounds), root


def _files_text(row: JobRow) -> str:
    if row.files is None:
        return ""
    changed = [f"{c.name}/{f.path} ({f.status})" for c in row.files.contexts for f in c.files]
    return "it changed " + ", ".join(changed[:30]) if changed else "it changed no file"


async def carry_files(store: Store, row: JobRow, workspaces: Workspaces) -> dict[str, list[str]]:
    """Start a follow-up's workspaces from its earlier job's answer (files/carry.py); {} when it had none."""
    earlier, label = await anyio.to_thread.run_sync(_earlier_answer, store, row.follow_up or "")
    if earlier is None or not earlier.options.context_paths:
        return {}
    before = Workspaces(JobFolder(workspaces.folder.jobs_root, earlier.id))
    tree = before.final if before.final.is_dir() else before.snapshot_dir(label) if label else None
    if tree is None or not tree.is_dir():
        return {}
    return await workspaces.carry(before, tree, earlier.id)


def _earlier_answer(store: Store, job_id: str) -> tuple[JobRow | None, str | None]:
    """The earlier job and its best answer's label (blocking: reads the store)."""
    earlier = store.job(job_id)
    return earlier, best_answer(store, earlier)[0] if earlier is not None else None
