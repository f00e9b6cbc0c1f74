"""A job's members: their anonymous letters and seed, how their backends are made, and where a job reports.

The orchestrator (orchestrator.py) uses these; tests and benches name them through it.
"""

from __future__ import annotations

import hashlib
import random
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from conclave.backends import create_backend
from conclave.backends.base import Backend, Endpoint, Usage
from conclave.config.models import AgentSpec
from conclave.coordination.reports import JobEvent, Progress
from conclave.coordination.turn_context import TurnContext
from conclave.members.runner import CliMember

if TYPE_CHECKING:
    from conclave.backends.llama_server import LocalServers

BackendFactory = Callable[[AgentSpec], Backend]


class JobSink(Protocol):
    """Where a job reports: every event, with the progress right after it."""

    async def record(self, event: JobEvent, progress: Progress) -> None: ...


def endpoint_factory(environ: Mapping[str, str], local_servers: LocalServers | None = None) -> BackendFactory:
    """Backends for real providers, keys read from `environ`; `local` agents start servers in
    `local_servers`."""

    def make(spec: AgentSpec) -> Backend:
        if spec.provider == "cli":  # a coding-agent CLI: its login is read here, at the job's start
            return CliMember.for_spec(spec, environ)
        endpoint = Endpoint(
            spec.provider,
            spec.model_name,
            spec.api_key(environ),
            spec.endpoint_url,
            spec.timeout_s,
            spec.stream,
            spec.model_path,
        )
        return create_backend(endpoint, local_servers=local_servers)

    return make


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
    ctx: TurnContext | None = None
    usage: Usage = Usage()
    presenting: bool = False

    def charge(self, usage: Usage, first: bool) -> Usage:
        """One report added to this member's usage, at its price unless it says its own cost (a CLI's);
        `first`: it opens a provider attempt (one call). A report without a cost keeps the cost so far
        and makes it partial (backends/base.py `Usage`). Returns the charge as added."""
        charged = replace(usage.priced(self.spec.price), calls=int(first))
        self.usage = self.usage + charged
        return charged
