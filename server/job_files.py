"""A job's files: agents' workspaces, their sandboxes and work tools, snapshots, and the final tree.

The orchestrator calls this at four moments: `start` (workspaces and containers), each turn (`tools`,
`picture`), each accepted answer (`on_answer`: snapshot and publish to peers), and the end (`finish`:
the winning answer's snapshot becomes final/). `close` removes the containers, also on cancellation.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.to_thread
from pydantic import ValidationError

from conclave.agent_tools import AgentTools
from conclave.config import Sandbox as SandboxSpec
from conclave.config import Team
from conclave.errors import ApplyError, InputError, SandboxUnavailable
from conclave.prompts import FilesPicture
from conclave.records import ContextChanges, ContextOption, FileChangeView, FilesResult, JobOptions
from conclave.sandbox import Sandbox, container_user, engine_status, image_tag
from conclave.workspace import ContextPath, Workspaces

SandboxFactory = Callable[[], Sandbox]

class JobFiles:
    """Workspaces (always) and sandboxes (when the team runs commands) for one job."""

    def __init__(
        self,
        job_id: str,
        workspaces: Workspaces,
        sandbox: SandboxSpec | None,
        sandbox_factory: SandboxFactory = Sandbox,
    ) -> None:
        self.job_id, self.workspaces, self.spec = job_id, workspaces, sandbox
        self._factory = sandbox_factory
        self._sandboxes: dict[str, Sandbox] = {}
        self._folders = tuple(context.name for context in workspaces.manifest().contexts)

    @property
    def commands(self) -> bool:
        return self.spec is not None

    async def start(self, letters: list[str]) -> None:
        """Each agent's working copy, and its container (started concurrently) when commands are on."""
        await self.workspaces.create(letters)
        if self.spec is None:
            return
        for letter in letters:
            self._sandboxes[letter] = self._factory()
        async with anyio.create_task_group() as tg:
            for letter in letters:
                tg.start_soon(self._start_sandbox, letter, letters)

    async def _start_sandbox(self, letter: str, letters: list[str]) -> None:
        assert self.spec is not None
        peers = {peer: self.workspaces.peer_mount(peer) for peer in letters if peer != letter}
        await self._sandboxes[letter].start(self.workspaces.agent(letter), peers, self.job_id, letter, self.spec)

    def tools(self, letter: str) -> AgentTools:
        return AgentTools(
            workspace=self.workspaces.agent(letter),
            peers=lambda: self.workspaces.peer_view(letter),
            runner=self._sandboxes.get(letter),
            owner=container_user(),
        )

    def picture(self, letter: str) -> FilesPicture:
        peers = {peer: label for peer, label in self.workspaces.latest().items() if peer != letter}
        return FilesPicture(self._folders, peers, self.commands)

    async def on_answer(self, letter: str, label: str) -> Path:
        """Freeze the author's workspace as the answer's snapshot and show it to the peers."""
        snapshot = await self.workspaces.snapshot(letter, label)
        if self.commands:
            await self.workspaces.publish(letter, label)
        return snapshot

    async def finish(self, winner: str | None) -> Path | None:
        """final/ is the winning answer's snapshot: exactly the files the team voted for."""
        if winner is None or not self.workspaces.snapshot_dir(winner).is_dir():
            return None
        return await self.workspaces.finalize(winner)

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            for sandbox in self._sandboxes.values():
                await sandbox.stop()


PATCH_FILE = "diff.patch"


def parse_context_paths(value: object) -> list[ContextPath]:
    """A caller's context_paths as validated models; errors name the item, the value and the fix."""
    if not isinstance(value, list):
        raise InputError("context_paths", value, 'give a list like [{"path": "/abs/project", "permission": "read"}]')
    parsed: list[ContextPath] = []
    for index, item in enumerate(value):
        try:
            parsed.append(ContextPath.model_validate(item))
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'item'} {e['msg']}" for e in exc.errors())
            raise InputError(f"context_paths[{index}]", item, problems) from exc
    return parsed


async def admit(
    job_dir: Path, sources: list[ContextPath], team: Team, apply: bool
) -> JobOptions:
    """Check and copy a job's context paths before it is queued; nothing is left behind on refusal.

    Commands need a Docker engine and the sandbox image: a team that would run them is refused here,
    with the fix, rather than failing later.
    """
    commands = team.sandbox != "none"
    if commands:
        assert not isinstance(team.sandbox, str)
        status = await anyio.to_thread.run_sync(engine_status, image_tag(team.sandbox))
        if not status.available or status.image_present is False:
            raise SandboxUnavailable(
                f"team {team.name!r} runs commands in a Docker sandbox, but {status.error}; "
                "or set `sandbox: none` in the team file to work on files without commands"
            )
    try:
        manifest = await Workspaces(job_dir, agent_owner=container_user()).prepare(sources)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(lambda: shutil.rmtree(job_dir, ignore_errors=True))
        raise
    contexts = [
        ContextOption(name=context.name, path=context.source, permission=context.permission)
        for context in manifest.contexts
    ]
    return JobOptions(context_paths=contexts, apply=apply, commands=commands)


async def collect(files: JobFiles, options: JobOptions) -> FilesResult:
    """The winner's diff per context path, written as one patch file; applied where asked and allowed."""
    workspaces = files.workspaces
    if not workspaces.final.is_dir():
        return FilesResult(error="no final files: the winning answer has no snapshot (see the transcript)")
    patches = await workspaces.diffs()
    chunks, contexts = [], []
    for option in options.context_paths:
        patch = patches[option.name]
        if patch.text:
            chunks.append(f"# {option.name}: {option.path}\n{patch.text}")
        changes = ContextChanges(
            name=option.name, path=option.path, permission=option.permission,
            files=[FileChangeView(path=f.path, status=f.status, added_lines=f.added_lines,
                                  removed_lines=f.removed_lines) for f in patch.files],
            added_lines=sum(f.added_lines for f in patch.files),
            removed_lines=sum(f.removed_lines for f in patch.files),
        )
        if options.apply and option.permission == "write" and patch.files:
            try:
                await workspaces.apply(option.name)
                changes.applied = True
            except ApplyError as exc:
                changes.apply_error = str(exc)
        contexts.append(changes)
    text = "".join(chunks)
    await anyio.to_thread.run_sync((workspaces.job_dir / PATCH_FILE).write_text, text)
    return FilesResult(contexts=contexts, patch_chars=len(text))
