"""What every job of a process shares, decided once where the service (or a worker) starts.

    jobs = JobEnvironment.of(settings)            # production's: from the settings and os.environ
    JobService.serve(jobs)                        # jobs/service.py; `JobService.open(settings)` does both

The settings; the environment variables keys and logins are read from; how agents are made (the one
place an agent's kind is decided, and whether a team's own servers are probed: coordination/agents.py
`Agents`); how patiently provider calls are retried; the route CLI members' egress takes and the extra
CA it trusts (sandbox/route.py, from CONCLAVE_EGRESS_CA); what this process keeps from every job
(files/kept.py). Other agents or another route make another environment (`dataclasses.replace`);
no signature between the service and a member's egress proxy defaults them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from conclave.backends.retry import RetryPolicy
from conclave.coordination.agents import Agents
from conclave.coordination.members import EndpointAgents
from conclave.files.kept import Kept
from conclave.sandbox.route import DirectRoute, EgressRoute
from conclave.settings import Settings


@dataclass(frozen=True)
class JobEnvironment:
    """The jobs' shared parts, built once (`of`) and handed to the service, the lifecycle and each job's
    files."""

    settings: Settings
    environ: Mapping[str, str]
    agents: Agents
    retry: RetryPolicy
    route: EgressRoute  # how CLI members' egress reaches the hosts their allowlists admit
    kept: Kept  # never a job's folder, never copied or written (files/kept.py)

    @classmethod
    def of(
        cls, settings: Settings, environ: Mapping[str, str] | None = None, retry: RetryPolicy | None = None
    ) -> JobEnvironment:
        """Production's: real providers and CLIs, keys from `environ` (by default this process's), each
        host reached by its name with the system's roots and CONCLAVE_EGRESS_CA's."""
        env = dict(os.environ if environ is None else environ)
        return cls(
            settings,
            env,
            EndpointAgents(env),
            retry or RetryPolicy(),
            DirectRoute(extra_ca=settings.egress_ca),
            Kept.of(settings, env),
        )
