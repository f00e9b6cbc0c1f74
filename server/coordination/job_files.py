"""A job's files: agents' workspaces, their sandboxes and work tools, snapshots, and the final tree.

The orchestrator calls this at four moments: `start` (workspaces and containers), each turn (`tools`,
`picture`), each accepted answer (`on_answer`: snapshot and publish to peers), and the end (`finish`:
the winning answer's snapshot becomes final/). `close` removes the containers and the agents' working
copies (snapshots and final/ stay), also on cancellation.

`Files` is that interface; `JobFiles` serves a job with context paths, `NoFiles` one without (the same
calls, doing nothing), so the orchestrator always holds one. The job's own steps around the run (copy,
follow-up carry, collect and apply) hold one of them, in jobs/context/files.py.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import anyio
import anyio.abc
import anyio.to_thread
from anyio.abc import TaskStatus

from conclave.config.models import SandboxSpec
from conclave.coordination.prompts import FilesPicture
from conclave.errors import ConclaveError, HostStepFailed, SandboxError
from conclave.files.agent_tools import AgentTools
from conclave.files.disk_budget import DiskBudget
from conclave.files.workspaces import Workspaces
from conclave.sandbox.allowlist import Allowlist, allowlist_for
from conclave.sandbox.container import Sandbox, container_user
from conclave.sandbox.egress import EgressProxy, egress_proxy
from conclave.sandbox.member import MemberSandbox
from conclave.sandbox.route import EgressRoute

if TYPE_CHECKING:
    from conclave.coordination.agents import Agent, OwnContainer
    from conclave.files.secrets import Secrets

logger = logging.getLogger(__name__)


class Files(Protocol):
    """What the orchestrator asks of a job's files, from `start` to `close`."""

    @property
    def secrets(self) -> Secrets | None:
        """The job's secret values, kept out of every snapshot and report (files/secrets.py)."""
        ...

    async def start(self, agents: Mapping[str, Agent], resumed: Sequence[str] | None = None) -> None:
        """Each agent's working copy and, when the job runs commands, the container its kind says
        (`Agent.own_container`), by letter."""
        ...

    def attach(self, agent: Agent, letter: str) -> None: ...

    def tools(self, letter: str) -> AgentTools | None: ...

    def picture(self, letter: str) -> FilesPicture | None: ...

    async def on_answer(self, letter: str, label: str) -> Path | None: ...

    async def finish(self, winner: str | None) -> Path | None: ...

    async def close(self) -> None: ...

    def egress(self) -> contextlib.AbstractAsyncContextManager[None]: ...


class NoFiles:
    """A job without context paths: no workspaces, no containers; every call does nothing."""

    @property
    def secrets(self) -> Secrets | None:
        return None

    async def start(self, agents: Mapping[str, Agent], resumed: Sequence[str] | None = None) -> None:
        pass

    def attach(self, agent: Agent, letter: str) -> None:
        """No container and no secrets: the agent stays as built."""

    def tools(self, letter: str) -> AgentTools | None:
        return None

    def picture(self, letter: str) -> FilesPicture | None:
        return None

    async def on_answer(self, letter: str, label: str) -> Path | None:
        return None

    async def finish(self, winner: str | None) -> Path | None:
        return None

    async def close(self) -> None:
        pass

    def egress(self) -> contextlib.AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()


class JobFiles:
    """Workspaces (always) and sandboxes (when the team runs commands) for one job."""

    def __init__(
        self,
        job_id: str,
        workspaces: Workspaces,
        sandbox: SandboxSpec | None,
        route: EgressRoute,
        *,
        disk_budget: int | None = None,
        egress_allow: tuple[str, ...] = (),
    ) -> None:
        """`route`: how CLI members' egress reaches the hosts it admits (sandbox/route.py), the one the
        jobs' environment decided (jobs/environment.py)."""
        self.job_id, self.workspaces, self.spec = job_id, workspaces, sandbox
        self._egress_allow, self._route = egress_allow, route
        self._proxies: anyio.abc.TaskGroup | None = None  # hosts CLI members' egress proxies (`egress`)
        self._budget = DiskBudget(disk_budget) if disk_budget is not None else None
        self._sandboxes: dict[str, Sandbox] = {}
        self._changes: dict[str, str] | None = None  # label -> patch, for a team with CLI members
        self.final_label: str | None = None
        self._released = False  # another server took the job over: its folder is that server's now

    @property
    def _folders(self) -> tuple[str, ...]:
        """The context folders' names, from the manifest the copy recorded (read once, by `workspaces`):
        a job's files exist before its copy (jobs/context/files.py)."""
        return tuple(context.name for context in self.workspaces.manifest().contexts)

    @property
    def _root(self) -> str | None:
        """One context path: its folder is the agent's whole workspace, so nothing can land outside it."""
        return self.workspaces.root_name()

    @property
    def commands(self) -> bool:
        return self.spec is not None

    @property
    def secrets(self) -> Secrets | None:
        return self.workspaces.secrets

    def attach(self, agent: Agent, letter: str) -> None:
        """The agent's container (a CLI member runs in it), and its secrets: the job's, which its login's
        values join, and its own (what its runs leave in its login file: files/secrets.py)."""
        agent.attach(self.sandbox(letter), self.workspaces.member_secrets(letter))

    async def start(self, agents: Mapping[str, Agent], resumed: Sequence[str] | None = None) -> None:
        """Each agent's working copy (`agents`: by letter), and its container (started concurrently) when
        commands are on.

        An agent with a container of its own (a CLI member: `Agent.own_container`) gets a member sandbox
        whose only way out is its own egress proxy (sandbox/member.py, sandbox/egress.py), allowing its
        CLI's hosts and its base_url; every other agent a plain sandbox.
        `resumed`: a job taken over from a process that died (jobs/upkeep/takeover.py), with the labels of the
        answers its journal kept: the working copies are rebuilt from their snapshots (Workspaces.restore),
        and the peers and the CLI members' decisions shown the latest answers again; every container
        is a new one, on this server's engine."""
        letters = sorted(agents)
        own = {letter: agent.own_container for letter, agent in agents.items()}
        sizes = await self._working_copies(letters, resumed)
        # what a CLI member's decision is shown (cli_turns.py): kept when one has its own container
        self._changes = {} if any(c is not None for c in own.values()) else None
        if self._changes is not None:
            for label in resumed or ():
                if self.workspaces.snapshot_dir(label).is_dir():
                    self._changes[label] = await self.workspaces.changes(label)
        if self._budget is not None:
            for letter in letters:
                self._budget.measured(letter, sizes[letter])
        if self.spec is None:
            return
        for letter, label in self.workspaces.latest().items() if resumed else ():
            await self.workspaces.publish(letter, label)
        for letter in letters:
            container = own[letter]
            if container is not None:  # a CLI member: its own container, behind its own proxy
                self._sandboxes[letter] = await self._member(letter, container)
            else:
                self._sandboxes[letter] = Sandbox()
        async with anyio.create_task_group() as tg:
            for letter in letters:
                tg.start_soon(self._start_sandbox, letter, letters)

    async def _working_copies(self, letters: list[str], resumed: Sequence[str] | None) -> dict[str, int]:
        """Each agent's working copy, made afresh or rebuilt for a resumed job; their sizes in bytes."""
        if resumed is None:
            await self.workspaces.create(letters)
            copied = sum(
                record.size for c in self.workspaces.manifest().contexts for record in c.files.values()
            )
            return dict.fromkeys(letters, copied)
        restored = await self.workspaces.restore(letters, resumed)
        if restored.lost:
            logger.warning(
                "job %s resumed: answers %s have no files (their snapshots were never made)",
                self.job_id,
                ", ".join(restored.lost),
            )
        return restored.sizes

    @contextlib.asynccontextmanager
    async def egress(self) -> AsyncIterator[None]:
        """Where CLI members' egress proxies live: around the whole run (`start` to `close`), as a task
        group of its own, since a proxy's task group cannot be entered in one cancel scope and left in
        another (the orchestrator's set-up runs under the job's deadline)."""
        async with anyio.create_task_group() as group:
            self._proxies = group
            try:
                yield
            finally:
                group.cancel_scope.cancel()
                self._proxies = None

    async def _member(self, letter: str, container: OwnContainer) -> Sandbox:
        assert self.spec is not None
        if self._proxies is None:
            raise SandboxError("a CLI member's egress proxy needs JobFiles.egress() around the job's run")
        extra = [*self.spec.allow_hosts, *self._egress_allow]
        allow = allowlist_for(container.cli, base_url=container.base_url, extra=extra)
        proxy = await self._proxies.start(self._serve, allow, f"{self.job_id}/{letter}")
        return MemberSandbox(None, egress=proxy)  # the proxy's route says the extra CA it trusts

    async def _serve(self, allow: Allowlist, label: str, *, task_status: TaskStatus[EgressProxy]) -> None:
        async with egress_proxy(allow, label=label, route=self._route) as proxy:
            task_status.started(proxy)
            await anyio.sleep_forever()

    async def _start_sandbox(self, letter: str, letters: list[str]) -> None:
        assert self.spec is not None
        peers = {peer: self.workspaces.peer_mount(peer) for peer in letters if peer != letter}
        workspace = self.workspaces.rooted(self.workspaces.agent(letter))
        await self._sandboxes[letter].start(workspace, peers, self.job_id, letter, self.spec)

    def tools(self, letter: str) -> AgentTools:
        return AgentTools(
            workspace=self.workspaces.rooted(self.workspaces.agent(letter)),
            folders=() if self._root else self._folders,
            peers=lambda: self.workspaces.peer_view(letter),
            sandbox=self._sandboxes.get(letter),
            owner=container_user(),
            disk=self._budget.agent(letter) if self._budget is not None else None,
        )

    def sandbox(self, letter: str) -> Sandbox | None:
        """The agent's container (a CLI member runs in it), None when the team runs no commands."""
        return self._sandboxes.get(letter)

    def picture(self, letter: str) -> FilesPicture:
        peers = {peer: label for peer, label in self.workspaces.latest().items() if peer != letter}
        changes = dict(self._changes or {})
        return FilesPicture(self._folders, peers, self.commands, root=self._root, changes=changes)

    async def on_answer(self, letter: str, label: str) -> Path:
        """Freeze the author's workspace as the answer's snapshot and show it to the peers.

        Any failure is a ConclaveError: the orchestrator then keeps the answer without files, and
        something unexpected here never fails the job.
        """
        with _host_step(f"the snapshot of {label}"):
            snapshot = await self.workspaces.snapshot(letter, label)
            if self.commands:
                await self.workspaces.publish(letter, label)
            if self._changes is not None:  # what a CLI member's decision is shown (cli_turns.py)
                self._changes[label] = await self.workspaces.changes(label)
            return snapshot

    async def finish(self, winner: str | None) -> Path | None:
        """final/ is the winning answer's snapshot: exactly the files the team voted for."""
        if winner is None or not self.workspaces.snapshot_dir(winner).is_dir():
            return None
        self.final_label = winner  # whose held-back files the result names (jobs/context/files.py)
        with _host_step(f"the final files of {winner}"):
            return await self.workspaces.finalize(winner)

    def release(self) -> None:
        """Another server took the job over (jobs/upkeep/takeover.py) and rebuilds its working copies in the
        same folder: `close` then stops this server's containers and leaves the folder alone."""
        self._released = True

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            for sandbox in self._sandboxes.values():
                await sandbox.stop()
            if not self._released:  # after the containers: no process writes there
                await self.workspaces.remove_working_copies()


@contextmanager
def _host_step(what: str) -> Iterator[None]:
    """An unexpected error in a host-side file step as a HostStepFailed naming the step (logged)."""
    try:
        yield
    except ConclaveError:
        raise
    except Exception as exc:
        logger.warning("%s failed", what, exc_info=True)
        raise HostStepFailed(
            f"{what} could not be made ({type(exc).__name__}: {exc}); the answer stands without its files"
        ) from exc
