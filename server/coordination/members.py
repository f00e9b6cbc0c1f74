"""A job's members: their anonymous letters and seed, how their agents are made, and where a job reports.

The orchestrator (orchestrator.py) uses these; tests and benches name them through it.
"""

from __future__ import annotations

import hashlib
import random
import string
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, ClassVar, Protocol

from conclave.backends import create_backend, create_scorer
from conclave.backends.base import Endpoint, Usage
from conclave.clis.member import CliMember
from conclave.config.models import AgentSpec, CliAgentSpec
from conclave.coordination.agents import Agent, AgentFactory, ApiAgent, CliAgent, SplitAgent
from conclave.coordination.budget import MemberLimit
from conclave.coordination.reports import JobEvent, Progress
from conclave.coordination.turn_context import InFlight, TurnContext

if TYPE_CHECKING:
    from conclave.backends.llama_server import LocalServers


class JobSink(Protocol):
    """Where a job reports: every event, with the progress right after it."""

    async def record(self, event: JobEvent, progress: Progress) -> None: ...


def endpoint_factory(environ: Mapping[str, str], local_servers: LocalServers | None = None) -> AgentFactory:
    """Agents for real providers, keys read from `environ`; `local` agents start servers in
    `local_servers`. The one place the kind of agent is decided (agents.py)."""

    def make(spec: AgentSpec) -> Agent:
        if isinstance(spec, CliAgentSpec):  # a coding-agent CLI: its login is read here, at the job's start
            return CliAgent(CliMember.for_spec(spec, environ))
        endpoint = endpoint_of(spec, environ)
        if spec.turn == "split":
            scorer = create_scorer(endpoint, local_servers=local_servers)
            if scorer is not None:
                return SplitAgent(scorer, scorer)
            return SplitAgent(create_backend(endpoint, local_servers=local_servers))
        return ApiAgent(create_backend(endpoint, local_servers=local_servers))

    return make


@dataclass(frozen=True)
class EndpointAgents:
    """Agents for real providers and CLIs (`endpoint_factory`), keys and logins read from `environ`."""

    environ: Mapping[str, str]
    probes: ClassVar[bool] = True  # a team's own servers are checked to answer before its job runs

    def factory(self, local_servers: LocalServers) -> AgentFactory:
        return endpoint_factory(self.environ, local_servers)


def endpoint_of(spec: AgentSpec, environ: Mapping[str, str]) -> Endpoint:
    """How an API agent's model is called: its provider, model, key (read from `environ`), URL and limits."""
    return Endpoint(
        provider=spec.provider,
        model=spec.model_name,
        api_key=spec.api_key(environ),
        base_url=spec.endpoint_url,
        timeout_s=spec.timeout_s,
        stream=spec.stream,
        model_path=spec.model_path,
    )


def seed_for(job_id: str) -> int:
    """The job's seed (letters, voters' orders): derived from its id, so a job replays the same."""
    return int(hashlib.sha256(job_id.encode()).hexdigest()[:16], 16)


def assign_letters(count: int, seed: int) -> list[str]:
    """Anonymous letters for `count` agents, shuffled by `seed`; item i is agent i's letter."""
    letters = list(string.ascii_uppercase[:count])
    random.Random(seed).shuffle(letters)
    return letters


@dataclass
class Member:
    spec: AgentSpec
    letter: str
    agent: Agent | None = None  # built at the job's start (endpoint_factory), with its context
    ctx: TurnContext | None = None
    usage: Usage = Usage()
    presenting: bool = False
    in_flight: InFlight = field(default_factory=InFlight)  # its calls' estimates, until they report
    limit: MemberLimit = field(init=False)  # its own token limit (budget.max_tokens), beside the job's

    def __post_init__(self) -> None:
        self.limit = MemberLimit(self.spec.budget.max_tokens if self.spec.budget is not None else None)

    def charge(self, usage: Usage, first: bool) -> Usage:
        """One report added to this member's usage, at its price unless it says its own cost (a CLI's);
        `first`: it opens a provider attempt (one call); a refund says its own calls (-1: turn_context.py
        `Provisional`). A report without a cost keeps the cost so far and makes it partial
        (backends/base.py `Usage`). Returns the charge as added."""
        charged = replace(usage.priced(self.spec.price), calls=usage.calls or int(first))
        self.usage = self.usage + charged
        return charged

    def spent(self) -> Usage:
        """What counts against the limits: its usage, less the estimates of its calls still in flight (a
        budget's stop would cancel them, and their input is billed anyway); an estimate that stays, for
        a call that ended without a report, counts."""
        flying = self.in_flight.tokens
        if not flying:
            return self.usage
        return self.usage - Usage(flying, estimated_input_tokens=flying).priced(self.spec.price)
