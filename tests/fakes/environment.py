"""A test's jobs' environment: production's (server/jobs/environment.py), with the test's variables and,
where given, a faster retry:

    async with JobService.serve(environment_of(settings, ENV, FAST)) as service: ...
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from conclave.backends.retry import RetryPolicy
from conclave.jobs.environment import JobEnvironment
from conclave.settings import Settings


def environment_of(
    settings: Settings, environ: Mapping[str, str], retry: RetryPolicy | None = None
) -> JobEnvironment:
    """`JobEnvironment.of(settings, environ)`, retrying as `retry` says when given."""
    jobs = JobEnvironment.of(settings, environ)
    return jobs if retry is None else replace(jobs, retry=retry)
