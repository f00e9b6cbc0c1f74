"""What every job of a process shares, decided once where the service (or a worker) starts.

    jobs = JobEnvironment.of(settings, os.environ)   # production's: the settings and the process's variables
    JobService.serve(jobs)                           # jobs/service.py; `JobService.open(settings)` does both

The settings; the environment variables keys and logins are read from; how agents are made (the one
place an agent's kind is decided, and whether a team's own servers are probed: coordination/agents.py
`Agents`); how patiently provider calls are retried; the route CLI members' egress takes and the extra
CA it trusts (sandbox/route.py, from CONCLAVE_EGRESS_CA); what this process keeps from every job
(files/kept.py). Other agents, another route or another retry make another environment
(`dataclasses.replace`); no signature between the service and a member's egress proxy defaults them.
"""

from __future__ import annotations

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
    def of(cls, settings: Settings, environ: Mapping[str, str]) -> JobEnvironment:
        """Production's: real providers and CLIs, keys and logins read from `environ` (a copy: the
        variables as the process started with them), each host reached by its name with the system's
        roots and CONCLAVE_EGRESS_CA's."""
        env = dict(environ)
        return cls(
            settings,
            env,
            EndpointAgents(env),
            RetryPolicy(),
            DirectRoute(extra_ca=settings.egress_ca),
            Kept.of(settings, env),
        )
