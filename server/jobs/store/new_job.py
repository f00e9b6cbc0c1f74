"""A job as admission hands it to the store: every check passed, its team shaped, ready to queue."""

from __future__ import annotations

from dataclasses import dataclass, field

from conclave.config.models import Team
from conclave.jobs.derived import JobOptions
from conclave.jobs.request import JobRequest


@dataclass(frozen=True)
class NewJob:
    """One admitted job (jobs/admission/admit.py), written whole in one transaction (`Store.create_job`)
    and run from what it holds: the service starts it, or a worker takes it from the queue."""

    id: str
    task: str
    team: Team  # shaped: verify and budgets folded in
    caller: str
    request: JobRequest  # as the caller asked, after what a follow-up carries over
    options: JobOptions = field(default_factory=JobOptions)  # what admission derived from the request
    follow_up: str | None = None  # the earlier job it continues
