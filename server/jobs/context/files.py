"""A job's file steps around its run: admit the context paths when the job is submitted (checks only, no
copying: ask_team returns at once), prepare them when it starts (the copy), collect the diff and apply
after.

One object owns a job's files from their copy on (`job_files`): `ContextFiles` for a job with context
paths, `NoContextFiles` for one without (the same calls, doing nothing). It holds what the orchestrator
is given during the run (`run_files`, coordination/job_files.py) and adds the job's own steps: the copy
(`prepare`), a follow-up's carried files (`carry`), its checks (`verifier`), and the diff collected and
applied after the run (`collect`). A job taken over from a server that died (jobs/upkeep/takeover.py)
keeps the copy and carried files its first server made; `prepare` then only clears what that server left
running."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

import anyio
import anyio.to_thread

from conclave.config.models import SandboxSpec, Team
from conclave.coordination.baselines import FOLDER as BASELINES
from conclave.coordination.baselines import KeptBaselines
from conclave.coordination.check_pool import CheckPool
from conclave.coordination.job_files import Files, JobFiles, NoFiles
from conclave.coordination.verification import Verifier
from conclave.errors import ApplyError, ConclaveError, PathOutsideRoot, SandboxUnavailable, ServerState
from conclave.files.contexts import ContextPath, named
from conclave.files.disk_budget import MB
from conclave.files.job_folder import JobFolder
from conclave.files.kept import Kept
from conclave.files.removal import remove_tree
from conclave.files.review import FIXES, HeldBack
from conclave.files.roots import identify
from conclave.files.secrets import Secrets
from conclave.files.trees import list_tree
from conclave.files.workspaces import Workspaces
from conclave.jobs.context.follow_ups import carry_files
from conclave.jobs.derived import ContextChanges, FilesResult, JobOptions
from conclave.jobs.environment import JobEnvironment
from conclave.jobs.store.async_store import AsyncStore
from conclave.jobs.store.sql import JobRow
from conclave.sandbox.container import container_user
from conclave.sandbox.engine import engine_status, sweep
from conclave.sandbox.image import image_tag
from conclave.settings import Settings

logger = logging.getLogger(__name__)
MAX_OUTSIDE = 200  # files listed outside the context folders; more are cut


async def admit(sources: list[ContextPath], team: Team) -> JobOptions:
    """Check a job's context paths and sandbox when it is submitted; nothing is copied yet.

    Commands and a `verify` check need a Docker engine and the sandbox image: a job that would run
    them is refused here, with the fix, rather than failing later.
    """
    commands = team.sandbox != "none"
    spec = team.sandbox if not isinstance(team.sandbox, str) else SandboxSpec()
    if commands or team.verify is not None:
        status = await anyio.to_thread.run_sync(engine_status, image_tag(spec))
        if not status.available or status.image_present is False:
            if commands:
                raise SandboxUnavailable(
                    f"team {team.name!r} runs commands in a Docker sandbox, but {status.error}; "
                    "or set `sandbox: none` in the team file to work on files without commands"
                )
            raise SandboxUnavailable(
                f"verify runs {team.verify!r} on each answer's files in a Docker sandbox, but "
                f"{status.error}; "
                "or leave verify out to run the job without checks"
            )
    # each folder's identity, taken without following a link: the copy and the apply check it (files/roots.py)
    pinned = [
        source.model_copy(update={"identity": await anyio.to_thread.run_sync(identify, source.path)})
        for source in named(sources)
    ]
    return JobOptions(context_paths=pinned, commands=commands)


def refuse_kept(kept: Kept, options: JobOptions) -> None:
    """Refuse a context path that touches what this process keeps (files/kept.py): a worker checks with
    its own home, jobs and team folders, which need not be where the front that admitted the job has
    them (blocking: stats and the mount table)."""
    for index, option in enumerate(options.context_paths):
        kept.refuse(f"context_paths[{index}].path", option.path)


async def prepare(folder: JobFolder, options: JobOptions) -> None:
    """Copy the context paths into the job's base/ when it starts; nothing is left behind on failure."""
    try:
        await Workspaces(folder, agent_owner=container_user()).prepare(list(options.context_paths))
    except BaseException:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(remove_tree, folder.base)
        raise


NO_CONSENSUS = (
    "not applied: the team reached no consensus (no strict majority of the votes); review the diff, "
    'or run it again with apply "force" (CLI: --force-apply) to apply without one'
)


async def collect_files(
    files: JobFiles, row: JobRow, consensus: bool, kept: Kept | None = None
) -> FilesResult:
    """The winner's diff per context path, written as one patch file; applied where asked and allowed:
    `apply: true` only with consensus, `apply: "force"` without, and never into what `kept` holds."""
    options, request = row.options, row.request
    workspaces = files.workspaces
    if not workspaces.final.is_dir():
        return FilesResult(error="no final files: the winning answer has no snapshot (see the transcript)")
    patches = await workspaces.diffs()
    held = workspaces.held(files.final_label) if files.final_label else {}
    chunks, contexts = [], []
    for option in options.context_paths:
        name = option.name
        assert name is not None, "every context path is named when the job is admitted (admit above)"
        patch = patches[name]
        if patch.text:
            chunks.append(f"# {name}: {option.path}\n{patch.text}")
        changes = ContextChanges(
            name=name,
            path=option.path,
            permission=option.permission,
            files=list(patch.files),
            added_lines=sum(f.added_lines for f in patch.files),
            removed_lines=sum(f.removed_lines for f in patch.files),
        )
        if request.apply and option.permission == "write" and patch.files:
            if not consensus and request.apply != "force":
                changes.apply_error = NO_CONSENSUS
                contexts.append(changes)
                continue
            try:
                if kept is not None:
                    field = f"context_paths[{options.context_paths.index(option)}].path"
                    await anyio.to_thread.run_sync(kept.refuse, field, option.path)
                done = await workspaces.apply(name, consent=request.consent(), patch=patch)
                changes.held_back = done.held
                changes.applied = not done.empty
                if done.empty:
                    changes.apply_error = "nothing applied: every change was held back (see held_back)"
            # PathOutsideRoot: the folder moved (files/roots.py); ServerState: it is this process's state
            except (ApplyError, PathOutsideRoot, ServerState) as exc:
                changes.apply_error = str(exc)
        changes.held_back += _secret_files(held, name)
        contexts.append(changes)
    text = "".join(chunks)
    await anyio.to_thread.run_sync(workspaces.patch.write_text, text)
    outside = await anyio.to_thread.run_sync(
        _outside, workspaces.final, {o.name for o in options.context_paths if o.name}
    )
    return FilesResult(contexts=contexts, patch_chars=len(text), outside=outside)


def _secret_files(held: dict[str, str], name: str) -> list[HeldBack]:
    """The winner's files of context `name` left out of its snapshot: they hold a member's secret."""
    inside = sorted(rel.split("/", 1)[1] for rel in held if rel.startswith(f"{name}/"))
    return [HeldBack(path=rel, reason="secret", fix=FIXES["secret"]) for rel in inside]


def _outside(final: Path, names: set[str]) -> list[str]:
    """Files of the final tree outside every context folder (a command wrote them): said, never lost
    silently."""
    files = list_tree(final, max_files=MAX_OUTSIDE).files
    return sorted(rel for rel in files if rel.split("/", 1)[0] not in names)[:MAX_OUTSIDE]


class JobFileSteps(Protocol):
    """A job's files from the copy to the collected diff: what the orchestrator is given, and the job's
    steps around its run."""

    @property
    def run_files(self) -> Files:
        """The job's files during the run (coordination/job_files.py), the orchestrator's."""
        ...

    async def prepare(self, store: AsyncStore) -> None:
        """Copy the context paths into the job folder, saying so (`prepare` above)."""
        ...

    async def carry(self, store: AsyncStore, row: JobRow) -> None:
        """A follow-up's workspaces start from the earlier job's files (jobs/context/follow_ups.py)."""
        ...

    def verifier(self, team: Team, limiter: anyio.CapacityLimiter, pool: CheckPool | None) -> Verifier | None:
        """The job's checks (`verify`), or None."""
        ...

    async def collect(self, store: AsyncStore, row: JobRow, consensus: bool) -> None:
        """The winner's diff kept with the job, applied where asked and allowed (`collect_files`)."""
        ...

    def release(self) -> None:
        """Another server took the job over: leave its folder to that server (JobFiles.release)."""
        ...


class ContextFiles:
    """A job with context paths: its workspaces and sandboxes during the run (`run_files`), and the
    steps around the run."""

    def __init__(
        self,
        run_files: JobFiles,
        options: JobOptions,
        settings: Settings,
        *,
        kept: Kept,
        verifies: bool = False,
    ) -> None:
        self.run_files = run_files
        self.job_id = run_files.job_id
        self.workspaces = run_files.workspaces
        self.options, self.settings, self.kept = options, settings, kept
        self.verifies = verifies  # the team checks answers (`verify`): its check containers too

    async def prepare(self, store: AsyncStore) -> None:
        if await anyio.to_thread.run_sync(self._copied):
            await store.set_state(self.job_id, "running", "resuming from the copy made when the job started")
            await self._clear_leftovers()
            return
        await store.set_state(self.job_id, "running", "copying the context paths")
        await anyio.to_thread.run_sync(refuse_kept, self.kept, self.options)
        await prepare(self.workspaces.folder, self.options)

    def _copied(self) -> bool:
        """Whether the context paths were copied already: a job taken over (jobs/upkeep/takeover.py) keeps the
        copy its first process made when it started (the caller's files may have changed since, and the
        diff is against that copy); a copy cut short left no manifest, and its base/ is removed."""
        if self.workspaces.folder.manifest.is_file():
            return True
        remove_tree(self.workspaces.base)
        return False

    async def _clear_leftovers(self) -> None:
        """What the dead process left running or half-made: its containers for this job on this engine
        (another engine's are swept by the servers there), and its check folders."""
        if self.run_files.commands or self.verifies:
            try:
                removed = await sweep(lambda _owner, _pid: True, job=self.job_id)  # never this process's
            except ConclaveError:
                removed = []  # no engine: the job's own steps say so when they need it
            if removed:
                logger.info("job %s: removed its earlier server's containers %s", self.job_id, removed)
        await anyio.to_thread.run_sync(remove_tree, self.workspaces.folder.checks)

    async def carry(self, store: AsyncStore, row: JobRow) -> None:
        if row.follow_up and not self.workspaces.start.is_dir():  # a resumed job made its start/ already
            await store.set_state(self.job_id, "running", "starting from the earlier job's files")
            await carry_files(store.sync, row, self.workspaces)

    def verifier(self, team: Team, limiter: anyio.CapacityLimiter, pool: CheckPool | None) -> Verifier | None:
        if team.verify is None:
            return None
        spec = team.sandbox if not isinstance(team.sandbox, str) else SandboxSpec()
        return Verifier(
            self.job_id,
            team.verify,
            self.workspaces,
            spec,
            timeout_s=self.settings.verify_timeout_s,
            limiter=limiter,
            protect=team.verify_protect,
            pool=pool,
            kept=KeptBaselines(self.settings.home / BASELINES),
        )

    async def collect(self, store: AsyncStore, row: JobRow, consensus: bool) -> None:
        await store.set_files(self.job_id, await collect_files(self.run_files, row, consensus, self.kept))

    def release(self) -> None:
        self.run_files.release()


class NoContextFiles:
    """A job without context paths: nothing to carry, check or collect (plan.shape_team refused a
    `verify` without context paths)."""

    def __init__(self) -> None:
        self.run_files = NoFiles()

    async def prepare(self, store: AsyncStore) -> None:
        pass

    async def carry(self, store: AsyncStore, row: JobRow) -> None:
        pass

    def verifier(self, team: Team, limiter: anyio.CapacityLimiter, pool: CheckPool | None) -> Verifier | None:
        return None

    async def collect(self, store: AsyncStore, row: JobRow, consensus: bool) -> None:
        pass

    def release(self) -> None:
        pass


def job_files(
    folder: JobFolder,
    team: Team,
    options: JobOptions,
    jobs: JobEnvironment,
) -> JobFileSteps:
    """The owner of a job's files, from their copy to their diff, in the jobs' environment: its route for
    CLI members' egress (sandbox/route.py), and what this process keeps, never copied or written
    (files/kept.py)."""
    if not options.context_paths:
        return NoContextFiles()
    sandbox = team.sandbox if options.commands and not isinstance(team.sandbox, str) else None
    workspaces = Workspaces(folder, agent_owner=container_user(), secrets=Secrets())
    settings = jobs.settings
    run_files = JobFiles(
        folder.job_id,
        workspaces,
        sandbox,
        jobs.route,
        disk_budget=settings.job_disk_mb * MB,
        egress_allow=settings.egress_allow,
    )
    verifies = team.verify is not None
    return ContextFiles(run_files, options, settings, kept=jobs.kept, verifies=verifies)
