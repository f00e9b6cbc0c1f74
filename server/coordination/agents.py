"""The agent seam: every kind of team member behind one protocol, the kind decided once when it is built.

    agent = make(spec)                          # members.py `endpoint_factory`: the one place that decides
    agent.own_container                         # decided with its kind: a CLI's own, else None (job_files.py)
    agent.attach(sandbox)                       # its container, when the job has one (a CLI runs in it)
    event = await agent.turn(ctx, action, shown, files)   # one turn to a protocol event
    text = await agent.present(ctx, task, shown, outcome) # the winner's final answer
    await agent.aclose()

    ApiAgent     a model over an API: one call ending in a decision (turns.py)
    SplitAgent   a plain answer, then a separate short choice, or a vote by its scorer (split_turns.py)
    CliAgent     a coding-agent CLI member: a work run and a decision run (cli_turns.py)

Each holds what it calls, typed: the orchestrator hands every kind the same `TurnContext` (limits,
prompts, work tools, budget gate, sinks) and never asks which kind it has.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from conclave.backends.base import Backend, Scorer
from conclave.clis.member import CliMember
from conclave.config.models import AgentSpec
from conclave.coordination import prompts
from conclave.coordination.cli_turns import cli_turn, presentation_answers
from conclave.coordination.protocol_events import ProtocolEvent, StartTurn
from conclave.coordination.reports import ShownAnswer
from conclave.coordination.split_turns import split_turn
from conclave.coordination.tally import Outcome
from conclave.coordination.turn_context import TurnContext
from conclave.coordination.turns import api_turn, present
from conclave.errors import ConfigError
from conclave.sandbox.allowlist import CLIS, CliName

if TYPE_CHECKING:
    from conclave.backends.llama_server import LocalServers
    from conclave.files.secrets import Secrets
    from conclave.sandbox.container import Sandbox


@dataclass(frozen=True)
class OwnContainer:
    """A CLI member's container, decided with its kind: its own, whose only way out is an egress proxy of
    its own allowing `cli`'s hosts and `base_url` (coordination/job_files.py, sandbox/member.py)."""

    cli: CliName
    base_url: str | None = None


class Agent(Protocol):
    """One team member as the orchestrator drives it."""

    @property
    def own_container(self) -> OwnContainer | None:
        """The container it runs in when the job has them: its own (a CLI member's), else None: the
        job's plain sandbox, where its work tools run commands (files/agent_tools.py)."""
        ...

    def attach(self, sandbox: Sandbox | None, secrets: Secrets) -> None:
        """The agent's container for this job (None when the team runs no commands), and its secrets: the
        job's, which every snapshot keeps out, and its own, which only its own do (files/secrets.py)."""
        ...

    async def turn(
        self,
        ctx: TurnContext,
        action: StartTurn,
        shown: list[ShownAnswer],
        files: prompts.FilesPicture | None,
    ) -> ProtocolEvent:
        """One turn to its decision: `shown` is the current answers in this voter's order (the action's
        labels), `files` the picture of the job's files when it has some."""
        ...

    async def present(self, ctx: TurnContext, task: str, shown: list[ShownAnswer], outcome: Outcome) -> str:
        """The winner's presentation: the final answer in plain text."""
        ...

    async def aclose(self) -> None: ...


AgentFactory = Callable[[AgentSpec], Agent]


class Agents(Protocol):
    """How a process's jobs make their agents (members.py `EndpointAgents`), given once to the jobs'
    environment (jobs/environment.py)."""

    @property
    def probes(self) -> bool:
        """Whether its agents call the servers a team names (their `base_url`s), so a job is refused
        when one does not answer (jobs/admission/reach.py)."""
        ...

    def factory(self, local_servers: LocalServers) -> AgentFactory:
        """The jobs' agent factory; `local` agents start their model servers in `local_servers`."""
        ...


@dataclass
class ApiAgent:
    """A model called over an API: each turn is one call ending in a decision (turns.py)."""

    backend: Backend

    @property
    def own_container(self) -> OwnContainer | None:
        return None

    def attach(self, sandbox: Sandbox | None, secrets: Secrets) -> None:
        """Nothing to attach: its work tools reach the container through the job (files/agent_tools.py)."""

    async def turn(
        self,
        ctx: TurnContext,
        action: StartTurn,
        shown: list[ShownAnswer],
        files: prompts.FilesPicture | None,
    ) -> ProtocolEvent:
        return await api_turn(ctx, self.backend, action, shown, files)

    async def present(self, ctx: TurnContext, task: str, shown: list[ShownAnswer], outcome: Outcome) -> str:
        return await present(ctx, self.backend, task, shown, outcome)

    async def aclose(self) -> None:
        await self.backend.aclose()


@dataclass
class SplitAgent(ApiAgent):
    """A small model's split turn (split_turns.py); `scorer` is its backend when that scores replies (the
    local one), so it votes by likelihood. With the job's files it needs its work tools, which only a
    full turn offers, so its turns are then an API agent's (config/models.py `turn`); it presents as one."""

    scorer: Scorer | None = None

    async def turn(
        self,
        ctx: TurnContext,
        action: StartTurn,
        shown: list[ShownAnswer],
        files: prompts.FilesPicture | None,
    ) -> ProtocolEvent:
        if ctx.work_tools:
            return await super().turn(ctx, action, shown, files)
        return await split_turn(ctx, self.backend, self.scorer, action, shown)


@dataclass
class CliAgent:
    """A coding-agent CLI member (clis/member.py), run in its own container (cli_turns.py)."""

    member: CliMember

    @property
    def own_container(self) -> OwnContainer:
        spec = self.member.spec
        return OwnContainer(_cli_name(spec.facts.name), spec.base_url)

    def attach(self, sandbox: Sandbox | None, secrets: Secrets) -> None:
        """The CLI runs in this container, through its egress proxy (clis/member.py `bind`); its
        login's values join the job's secrets, and each of its runs adds what its CLI refreshed to its
        own."""
        self.member.bind(sandbox, secrets=secrets)

    async def turn(
        self,
        ctx: TurnContext,
        action: StartTurn,
        shown: list[ShownAnswer],
        files: prompts.FilesPicture | None,
    ) -> ProtocolEvent:
        return await cli_turn(ctx, self.member, action, shown, files)

    async def present(self, ctx: TurnContext, task: str, shown: list[ShownAnswer], outcome: Outcome) -> str:
        """Its answer as it stands when presenting would add nothing (cli_turns.py
        `presentation_answers`) or its CLI's brief run would still cost too much (Copilot CLI: its
        adapter's `presents`), else a brief run: the member is also a Backend whose reply is a run with
        our system prompt and no work tools, about a decision's size (clis/member.py)."""
        assert outcome.winner is not None
        answers = presentation_answers(shown, outcome.winner)
        if answers is None or not self.member.adapter.presents:
            return next(a.content for a in shown if a.label == outcome.winner)
        return await present(ctx, self.member, task, answers, outcome)

    async def aclose(self) -> None:
        await self.member.aclose()


def _cli_name(cli: str) -> CliName:
    """The coding-agent CLI's name as its egress allowlist knows it (the team file's check named one)."""
    for name in CLIS:
        if name == cli:
            return name
    raise ConfigError(f"no egress allowlist for CLI {cli!r}: it is one of {', '.join(CLIS)}")
