"""A test's own agents as the jobs' `Agents` (server/coordination/agents.py), through the same door as
production's (server/jobs/environment.py):

    jobs = given_agents(environment_of(settings, ENV, FAST), factory)
    async with JobService.serve(jobs) as service: ...
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from conclave.backends.llama_server import LocalServers
from conclave.coordination.agents import AgentFactory
from conclave.jobs.environment import JobEnvironment


@dataclass(frozen=True)
class GivenAgents:
    """The agents `make` builds; they call no server a team names, so none is probed before a job."""

    make: AgentFactory
    probes: ClassVar[bool] = False

    def factory(self, local_servers: LocalServers) -> AgentFactory:
        return self.make


def given_agents(jobs: JobEnvironment, make: AgentFactory) -> JobEnvironment:
    """`jobs` with the agents `make` builds."""
    return replace(jobs, agents=GivenAgents(make))
