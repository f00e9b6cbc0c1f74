"""Per-job, per-agent workspaces under `$CONCLAVE_HOME/jobs/<job_id>/`; no Docker, no model knowledge.

    jobs/<job_id>/         its paths named by `JobFolder` (job_folder.py), and by nothing else
        manifest.json      what copy_context copied: per context path its name, source, permission, and
                           per file its size, mode and sha256 (the diff base and apply's conflict check)
        base/<name>/       the pristine copy at job start (read-only by convention)
        start/<name>/      a follow-up's starting files: the earlier answer over base/ (carry.py)
        agents/<letter>/   each agent's working copy, made from base/ by copying: never shares an inode
                           with base/ or a snapshot, since agents write here (bind-mounted at /workspace)
        snapshots/<label>/ the author's workspace at each new_answer (`B2`), immutable
        checks/<label>-*/  a check's fresh, writable copy: base/ plus what apply would write of an
                           answer (check_copy.py; `base-*` for the caller's files alone), moved into
                           checks/slot-<n>/ (what a check container mounts: files/check_slots.py)
        final/             the winner's workspace after presentation, immutable
        diff.patch         the winner's git-style patch over every context path, written at the end
        meta/<tree>        when base/ or a snapshot was captured (for safe reuse of unchanged files)
        meta/<label>.held  files left out of that snapshot: they hold a secret (paths only, secrets.py)
        meta/<label>.sha256  each file's sha256 in that snapshot, as it was copied (a check's diff reads
                           no file whose digest is base/'s: check_copy.py)

The API (blocking work runs in a worker thread through `anyio.to_thread.run_sync`; the copies are
abandoned on cancel, so a cancelled job never waits for one; apply is not, it must finish or roll back):
    ContextPath(path, permission)        a caller's folder, validated (exists, is a directory), resolved
    Caps(max_files, max_bytes)           5,000 files and 50 MB for context paths by default
    await copy_context(paths, dest, caps) -> ContextManifest   into dest/<name>; refuses before copying
                                         (contexts.py; `copy_context_sync` is the blocking form)
    await diff(base, final) -> Patch     git-style unified diff + summary (diff.py)
    await apply(final, target, context) -> Changes   all or nothing (apply.py)
    Workspaces(folder)                   prepare, create, snapshot, peer_view, finalize, source, diffs, apply,
                                         remove_working_copies (agents/ and peers/ go when the job ends),
                                         restore (a resumed job's working copies, from its snapshots)
Every read of a tree an agent can change goes through safe.py (trees.py is built on it).

Choices: symlinks, FIFOs, sockets and devices are never copied or followed (listed in `skipped`); files
that cannot be read are skipped and listed; .gitignore files (root, nested, negations, info/exclude) are
honoured for context paths only, a workspace snapshot copies everything (under looser caps). Snapshots
and final/ hard-link files unchanged since the tree they derive from (the agent's previous snapshot, or
base/), judged by size, mode and mtime, and never for files modified within 2 s of that tree's capture
(git's racy-clean rule); immutable trees may share inodes, agents/ never does. Every tree is built under
a temporary name and renamed into place, so a crash never leaves half a snapshot.
Every file leaves a workspace through a snapshot (peers, checks, final/, diff, apply, read_workspace),
so a copied file that holds one of the job's secrets (`secrets`, secrets.py) is left out there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import anyio.to_thread

from conclave.config.models import LABEL, LETTER
from conclave.errors import ConclaveError, ContextTooLarge, InputError
from conclave.files.apply import Changes, apply_tree
from conclave.files.carry import carry
from conclave.files.check_copy import reviewed_copy
from conclave.files.contexts import Caps, ContextManifest, ContextPath, CopiedContext, copy_context_sync, mb
from conclave.files.diff import Patch, diff_trees
from conclave.files.job_folder import JobFolder
from conclave.files.peer_access import peer_readable
from conclave.files.removal import remove_tree
from conclave.files.review import Consent
from conclave.files.roots import run_pinned
from conclave.files.secrets import Secrets, withhold
from conclave.files.settling import settle
from conclave.files.trees import Listing, Reference, copy_tree, list_tree, tree_digest

__all__ = ["CheckCopy", "Restored", "Workspaces", "apply", "diff"]

KINDS = ("held", "sha256")  # meta/<label>.<kind>: what a snapshot records beside its capture time
ALWAYS = 2**63 - 1  # a capture time that makes every file of an immutable reference reusable
WORKSPACE_CAPS = Caps(max_files=20_000, max_bytes=200 * 1024 * 1024)


async def diff(base: Path, final: Path) -> Patch:
    """The git-style patch from `base` to `final` (diff.py), computed in a worker thread."""
    return await anyio.to_thread.run_sync(diff_trees, base, final, abandon_on_cancel=True)


async def apply(
    final: Path,
    target: Path,
    context: CopiedContext,
    base: Path | None = None,
    *,
    patch: Patch | None = None,
    consent: Consent = Consent(),
) -> Changes:
    """Apply `final` to `target` for a write context path as `patch` shows it: all or nothing for what
    is written, the rest held back (apply.py, review.py).

    `base` is the context's copy in base/ (the patch is made from it when not given).
    """
    if context.permission != "write":
        raise InputError(
            "apply",
            True,
            f"context path {context.source} was given read-only; give it with "
            f"permission 'write' to apply the team's changes to it",
        )
    if patch is None:
        if base is None:
            raise ValueError("apply needs the reviewed patch, or the base tree to make it from")
        patch = await diff(base, final)
    reviewed = patch
    # the folder is reached without following a link and must be the one admitted (files/roots.py)
    return await anyio.to_thread.run_sync(
        run_pinned,
        str(target),
        context.identity,
        lambda root: apply_tree(final, root, context.files, base, patch=reviewed, consent=consent),
    )


class Workspaces:
    """The workspace trees of one job (see the module docstring for the layout); `secrets`, the job's
    secret values, grow while it runs (coordination/job_files.py)."""

    def __init__(
        self,
        folder: JobFolder,
        *,
        agent_owner: tuple[int, int] | None = None,
        secrets: Secrets | None = None,
    ) -> None:
        self.folder = folder
        # the context's caps, and each agent's workspace's (WORKSPACE_CAPS read now, not at import)
        self.caps, self.workspace_caps, self.agent_owner = Caps(), WORKSPACE_CAPS, agent_owner
        self.secrets = secrets if secrets is not None else Secrets()
        self._own: dict[str, Secrets] = {}  # letter -> that member's (files/secrets.py `member`)
        self.base = folder.base
        self.start = folder.start  # only for a follow-up (carry.py); else agents start from base/
        self.final = folder.final
        self.patch = folder.patch  # the winner's patch, written when the job ends
        self._manifest: ContextManifest | None = None  # written once by prepare, then only read
        self._base_listings: dict[str, Listing] = {}  # base/<name>'s, listed once: base/ never changes

    # -- building the trees ---------------------------------------------------------------------

    async def prepare(self, sources: list[ContextPath]) -> ContextManifest:
        """Copy the context paths into base/ and record the manifest (an empty base/ without any)."""
        return await anyio.to_thread.run_sync(self._prepare, sources, abandon_on_cancel=True)

    def _prepare(self, sources: list[ContextPath]) -> ContextManifest:
        captured = time.time_ns()
        self.folder.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        with _building(self.base) as tmp:
            manifest = copy_context_sync(sources, tmp, self.caps)
        # base/'s digest, which a check's kept run is looked up by (coordination/baselines.py), taken now
        manifest = manifest.model_copy(update={"digest": self._tree_digest(manifest)})
        self._set_captured("base", captured)
        _write_atomic(self.folder.manifest, manifest.model_dump_json())
        self._manifest = manifest
        return manifest

    def manifest(self) -> ContextManifest:
        """The manifest recorded by `prepare` (readable from any process); read from disk once, since
        nothing changes it after `prepare` (peer views ask for it on every tool call)."""
        if self._manifest is None:
            self._manifest = ContextManifest.model_validate_json(self.folder.manifest.read_bytes())
        return self._manifest

    async def create(self, letters: list[str]) -> dict[str, Path]:
        """Give each agent its own working copy of base/ (copied, never linked); a copy left by a process
        that died before the job's first turns (jobs/upkeep/takeover.py) is replaced."""
        return await anyio.to_thread.run_sync(self._create, letters, abandon_on_cancel=True)

    def _create(self, letters: list[str]) -> dict[str, Path]:
        origin = self.start if self.start.is_dir() else self.base
        listing = list_tree(origin)
        for letter in letters:
            self._working_copy(letter, origin, listing)
        return {letter: self.agent(letter) for letter in letters}

    def _working_copy(self, letter: str, origin: Path, listing: Listing) -> int:
        """agents/<letter> made afresh from the immutable tree `origin`; its size in bytes."""
        with _building(self.agent(letter), replace=True) as tmp:
            copy_tree(origin, tmp, listing)
            if self.agent_owner is not None:
                settle(tmp, self.agent_owner)
        return listing.total_bytes

    async def restore(self, letters: list[str], posted: Sequence[str]) -> Restored:
        """A resumed job's working copies (jobs/upkeep/takeover.py), rebuilt from what its dead process left
        durable: each agent's from its latest answer's snapshot, else from start/ or base/. What a turn in
        flight had written is dropped (that turn runs again on the files it started with), and so is work
        an agent did after its latest answer that no answer holds.

        `posted`: the labels of the answers the job's journal kept (coordination/journal.py). A snapshot
        the dead process made of an answer its journal never recorded is removed (that turn runs again and
        posts it anew); an answer recorded before its snapshot was made is snapshotted now from its
        author's working copy, which no turn changed since. peers/ is emptied: the job's files publish
        each agent's latest snapshot again (coordination/job_files.py)."""
        return await anyio.to_thread.run_sync(self._restore, letters, list(posted), abandon_on_cancel=True)

    def _restore(self, letters: list[str], posted: list[str]) -> Restored:
        kept = set(posted)
        if self.folder.snapshots.is_dir():
            for entry in os.scandir(self.folder.snapshots):
                if LABEL.fullmatch(entry.name) and entry.name not in kept:
                    remove_tree(entry.path)
                    for name in (entry.name, *(f"{entry.name}.{kind}" for kind in KINDS)):
                        self.folder.record(name).unlink(missing_ok=True)
        last = {self.label_letter(label): label for label in posted}
        for letter, label in last.items():
            if not self.snapshot_dir(label).is_dir() and self.agent(letter).is_dir():
                with contextlib.suppress(OSError, ConclaveError):  # then it stays without files
                    self._snapshot(letter, label)
        remove_tree(self.folder.peers)
        latest, sizes = self.latest(), {}
        for letter in letters:
            newest = latest.get(letter)
            origin = self.snapshot_dir(newest) if newest else self.start if self.start.is_dir() else self.base
            sizes[letter] = self._working_copy(letter, origin, list_tree(origin))
        lost = [label for label in posted if not self.snapshot_dir(label).is_dir()]
        return Restored(sizes, lost)

    async def carry(self, earlier: Workspaces, tree: Path, earlier_id: str) -> dict[str, list[str]]:
        """A follow-up's start/: the earlier job's answer `tree` over base/ (carry.py); the paths taken."""

        def build() -> dict[str, list[str]]:
            taken = carry(earlier.manifest(), tree, self.base, self.manifest(), self.start, earlier_id)
            self._set_captured("start", time.time_ns())
            return taken

        return await anyio.to_thread.run_sync(build, abandon_on_cancel=True)

    def member_secrets(self, letter: str) -> Secrets:
        """Agent `letter`'s secrets: the job's and its own, which only its own snapshots withhold."""
        return self._own.setdefault(letter, self.secrets.member())

    async def snapshot(self, letter: str, label: str) -> Path:
        """Freeze agent `letter`'s workspace as snapshots/<label>; refused over the workspace caps."""
        return await anyio.to_thread.run_sync(self._snapshot, letter, label, abandon_on_cancel=True)

    def _snapshot(self, letter: str, label: str) -> Path:
        if self.label_letter(label) != letter:
            raise ValueError(f"snapshot label {label!r} does not belong to agent {letter}")
        source, captured = self.agent(letter), time.time_ns()
        listing = list_tree(source, max_files=self.workspace_caps.max_files)
        self._check_workspace(letter, listing)
        previous = self.latest().get(letter)
        reuse = self._reference(previous)
        # one a dead process left is not this one's
        self.folder.record(f"{label}.sha256").unlink(missing_ok=True)
        with _building(self.snapshot_dir(label)) as tmp:
            copied = copy_tree(source, tmp, listing, reuse=reuse, on_error=_leave_out)
            secrets = self._own.get(letter, self.secrets)
            held = withhold(tmp, [rel for rel, digest in copied.items() if digest is not None], secrets)
        self._set_captured(label, captured)
        _write_atomic(self.folder.record(f"{label}.held"), json.dumps(held))
        linked = self.digests(previous) if reuse.root != self.start else {}  # a linked file's is its origin's
        digests = {rel: digest or linked.get(rel) for rel, digest in copied.items() if rel not in held}
        _write_atomic(
            self.folder.record(f"{label}.sha256"), json.dumps({k: v for k, v in digests.items() if v})
        )
        return self.snapshot_dir(label)

    def digests(self, label: str | None) -> dict[str, str]:
        """Each file's sha256 in snapshot `label` as recorded when it was made, or in base/ (the manifest's)
        for None; keyed `<context>/<path>`. A file with none recorded is absent: read it."""
        if label is None:
            return {
                f"{context.name}/{rel}": digest
                for context in self.manifest().contexts
                for rel, digest in _known(context).items()
            }
        try:
            found = json.loads(self.folder.record(f"{label}.sha256").read_bytes())
        except (OSError, ValueError):  # made before digests were recorded, or by a process that died
            return {}
        return {str(rel): str(digest) for rel, digest in found.items()} if isinstance(found, dict) else {}

    def held(self, label: str) -> dict[str, str]:
        """The files left out of snapshot `label` because they hold a secret: path -> how (secrets.py)."""
        record = self.folder.record(f"{self.snapshot_dir(label).name}.held")
        return dict(json.loads(record.read_text())) if record.is_file() else {}

    async def finalize(self, label: str) -> Path:
        """Make final/ from an answer's snapshot (`B2`): exactly the files the team voted for."""
        return await anyio.to_thread.run_sync(self._finalize, label)

    def _finalize(self, label: str) -> Path:
        source = self.snapshot_dir(label)
        if not source.is_dir():
            raise InputError("source", label, "no snapshot by that label yet")
        listing = list_tree(source)
        reuse = Reference(source, listing.files, ALWAYS)
        with _building(self.final, replace=True) as tmp:
            copy_tree(source, tmp, listing, reuse=reuse, on_error=_leave_out)
        return self.final

    def _check_workspace(self, letter: str, listing: Listing) -> None:
        caps = self.workspace_caps
        fix = "delete generated files from the workspace (keep scratch files in /tmp) and try again"
        if listing.limit:
            raise ContextTooLarge(f"agent {letter}'s workspace", listing.limit, "the walk's caps", fix=fix)
        if listing.truncated or len(listing.files) > caps.max_files:
            found = f"more than {caps.max_files:,} files"
            raise ContextTooLarge(f"agent {letter}'s workspace", found, f"{caps.max_files:,} files", fix=fix)
        if listing.total_bytes > caps.max_bytes:
            found = mb(listing.total_bytes)
            raise ContextTooLarge(f"agent {letter}'s workspace", found, mb(caps.max_bytes), fix=fix)

    def _reference(self, label: str | None) -> Reference:
        """The immutable tree a new copy of an agent's workspace may reuse: its last snapshot, else base/."""
        first = (self.start, "start") if self.start.is_dir() else (self.base, "base")
        root, name = (self.snapshot_dir(label), label) if label else first
        return Reference(root, list_tree(root).files, self._captured(name))

    def _set_captured(self, name: str, ns: int) -> None:
        self.folder.meta.mkdir(exist_ok=True)
        _write_atomic(self.folder.record(name), str(ns))

    def _captured(self, name: str) -> int:
        try:
            return int(self.folder.record(name).read_text())
        except (OSError, ValueError):
            return 0  # unknown: no file counts as unchanged, everything is copied

    def check_copy(self, label: str | None) -> CheckCopy:
        """A fresh, writable check copy (check_copy.py): base/ plus what apply would write of answer
        `label` to each context path; base/ alone for None (the caller's files as they were). Blocking:
        coordination/verification.py makes it in the same worker thread trip that moves it into a check
        container's folder (under load each trip costs more than the copy of a small project)."""
        source = self.snapshot_dir(label) if label is not None else None
        if source is not None and not source.is_dir():
            raise InputError("source", label, "no snapshot by that label: the answer's files were not kept")
        dest = self.folder.check(f"{label or 'base'}-{time.monotonic_ns()}")
        held: list[str] = []
        written: dict[str, frozenset[str]] = {}
        recorded = self.digests(label) if label is not None else {}
        with _building(dest) as tmp:
            for context in self.manifest().contexts:
                answer = source / context.name if source is not None else None
                prefix = "" if self.root_name() else f"{context.name}/"
                known = _known(context)
                mine = f"{context.name}/"
                answer_known = {rel[len(mine) :]: d for rel, d in recorded.items() if rel.startswith(mine)}
                found = reviewed_copy(
                    self.base / context.name,
                    answer,
                    tmp / context.name,
                    listed=self.base_listing(context.name),
                    known=known,
                    answer_known=answer_known,
                )
                held += [f"{prefix}{entry.path} ({entry.reason})" for entry in found.held]
                written[context.name] = frozenset(found.added + found.modified + found.deleted)
            if self.agent_owner is not None:
                settle(tmp, self.agent_owner)
        return CheckCopy(dest, held, written)

    def base_digest(self) -> str:
        """A sha256 of what a check of the caller's files runs on (`check_copy(None)`), as the check sees
        it: one context is /workspace itself, its folder's name unseen; several are /workspace/<name>
        each. Recorded in the manifest by `prepare`; for a manifest from before that, a walk of base/
        (blocking)."""
        manifest = self.manifest()
        return manifest.digest if manifest.digest is not None else self._tree_digest(manifest)

    def base_listing(self, name: str) -> Listing:
        """base/<name>'s listing, made once per process (blocking): nothing changes base/ after `prepare`."""
        listing = self._base_listings.get(name)
        if listing is None:
            listing = self._base_listings[name] = list_tree(self.base / name)
        return listing

    def _tree_digest(self, manifest: ContextManifest) -> str:
        """`base_digest` from a walk of base/; each file's content digest is the manifest's, taken as it
        was copied into base/, so no file is read again (blocking)."""
        contexts = manifest.contexts

        def digest_of(context: CopiedContext) -> str:
            # the listing checks use (`base_listing`): this walk is base/'s only one in the process
            return tree_digest(self.base / context.name, _known(context), self.base_listing(context.name))

        if len(contexts) == 1:
            return digest_of(contexts[0])
        digest = hashlib.sha256()
        for context in contexts:
            digest.update(f"context {context.name} {digest_of(context)}\n".encode())
        return digest.hexdigest()

    # -- naming and reading ---------------------------------------------------------------------

    def agent(self, letter: str) -> Path:
        if not LETTER.fullmatch(letter):
            raise InputError("letter", letter, "an agent letter is one capital letter, A to P")
        return self.folder.agent(letter)

    def snapshot_dir(self, label: str) -> Path:
        self.label_letter(label)
        return self.folder.snapshot(label)

    @staticmethod
    def label_letter(label: str) -> str:
        match = LABEL.fullmatch(label)
        if not match:
            raise InputError("source", label, "an answer label is a letter and a revision, e.g. 'B2'")
        return match.group(1)

    def latest(self) -> dict[str, str]:
        """Each agent's latest snapshot label, read from disk (any process can answer)."""
        best: dict[str, tuple[int, str]] = {}
        if self.folder.snapshots.is_dir():
            for entry in os.scandir(self.folder.snapshots):
                match = LABEL.fullmatch(entry.name)
                if match and entry.is_dir(follow_symlinks=False):
                    letter, revision = match.group(1), int(match.group(2))
                    if revision > best.get(letter, (0, ""))[0]:
                        best[letter] = (revision, entry.name)
        return {letter: label for letter, (_, label) in sorted(best.items())}

    def root_name(self) -> str | None:
        """With exactly one context path, its folder name: that folder is then every agent's workspace
        root (what the agent edits, /workspace in its sandbox, what peers see); with several, None."""
        contexts = self.manifest().contexts
        return contexts[0].name if len(contexts) == 1 else None

    def rooted(self, tree: Path) -> Path:
        """The part of a tree (an agent's copy, a snapshot) that agents see as their workspace root."""
        name = self.root_name()
        return tree / name if name else tree

    def peer_view(self, letter: str) -> dict[str, Path]:
        """Every other agent's latest snapshot (mounted read-only at /peers/<letter> by the sandbox)."""
        self.agent(letter)
        latest = self.latest().items()
        return {peer: self.rooted(self.folder.snapshot(label)) for peer, label in latest if peer != letter}

    def source(self, name: str) -> Path:
        """The tree `read_workspace` reads: "final", "base", or an answer label like "B2"."""
        path = {"final": self.final, "base": self.base}.get(name) or self.snapshot_dir(name)
        if not path.is_dir():
            fix = "nothing there yet; use 'final' once the job is done, or the label of a posted answer"
            raise InputError("source", name, fix)
        return path

    def peer_mount(self, letter: str) -> Path:
        """The host folder mounted read-only at /peers/<letter> in the other agents' containers."""
        self.agent(letter)
        return self.folder.peer(letter)

    async def publish(self, letter: str, label: str) -> Path:
        """Make peer_mount(letter) show snapshot `label`, in place (a bind mount pins the folder's inode)."""
        return await anyio.to_thread.run_sync(self._publish, letter, label)

    def _publish(self, letter: str, label: str) -> Path:
        mount, source = self.peer_mount(letter), self.rooted(self.snapshot_dir(label))
        mount.mkdir(parents=True, exist_ok=True)
        for entry in os.scandir(mount):
            if entry.is_dir(follow_symlinks=False):
                remove_tree(entry.path)
            else:
                os.unlink(entry.path)
        for rel in list_tree(source).files:  # snapshots are immutable: linking their files is safe
            if not peer_readable(source, rel):
                continue  # private to its author: as a peer's container sees it (peer_access.py)
            target = mount / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(source / rel, target)
        return mount

    async def changes(self, label: str) -> str:
        """What answer `label` changed, as its peers may see it: its git-style patch over every context
        path, without the files private to its author (peer_access.py), in a worker thread."""
        return await anyio.to_thread.run_sync(self._changes, label, abandon_on_cancel=True)

    def _changes(self, label: str) -> str:
        snapshot, contexts = self.snapshot_dir(label), self.manifest().contexts
        texts = []
        for context in contexts:
            tree = snapshot / context.name
            patch = diff_trees(self.base / context.name, tree, keep=partial(peer_readable, tree))
            if patch.text and len(contexts) > 1:
                texts.append(f"# in {context.name}/\n")
            texts.append(patch.text)
        return "".join(texts)

    # -- results --------------------------------------------------------------------------------

    async def diffs(self) -> dict[str, Patch]:
        """Per context path name, the patch from its state at job start to final/."""
        return {c.name: await diff(self.base / c.name, self.final / c.name) for c in self.manifest().contexts}

    async def apply(self, name: str, *, consent: Consent = Consent(), patch: Patch | None = None) -> Changes:
        """Apply final/<name> to that context path's folder (permission write only), as its patch shows
        it: binary changes, artefacts, autorun files and VCS metadata are held back unless `consent`
        allows them (review.py), and listed in `Changes.held`."""
        context = self.manifest().get(name)
        patch = patch or await diff(self.base / name, self.final / name)
        return await apply(
            self.final / name, Path(context.source), context, self.base / name, patch=patch, consent=consent
        )

    async def remove_working_copies(self) -> None:
        """Delete agents/, peers/ and checks/ (the job is over): snapshots, final/ and the patch stay."""

        def remove() -> None:
            for folder in self.folder.working:
                remove_tree(folder)  # iterative, by fd: links are removed, not followed; any depth

        await anyio.to_thread.run_sync(remove)


@contextmanager
def _building(dest: Path, *, replace: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary sibling of `dest` to fill, then rename it into place (removed on error)."""
    if dest.exists() and not replace:
        raise FileExistsError(f"{dest} exists already; workspace trees are never overwritten")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}-{time.monotonic_ns()}")
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}-{time.monotonic_ns()}")
    try:
        yield tmp
        tmp.mkdir(exist_ok=True)  # nothing to copy still makes the tree
        if dest.exists():
            os.rename(dest, old)
        os.rename(tmp, dest)
    finally:
        remove_tree(tmp)
        remove_tree(old)


@dataclass(frozen=True)
class Restored:
    """A resumed job's working copies (`Workspaces.restore`): each agent's size in bytes, and the posted
    answers left without files (their snapshot was never made)."""

    sizes: dict[str, int]
    lost: list[str]


@dataclass(frozen=True)
class CheckCopy:
    """A check's copy of an answer (`path`, removed by its check) and what apply would hold back of it."""

    path: Path
    held: list[str]
    # per context folder, the paths the answer's patch wrote or deleted: every other file is base/'s
    written: dict[str, frozenset[str]]


def _leave_out(rel: str, exc: OSError | InputError) -> None:
    """A file of a live workspace that vanished or became unreadable mid-copy is left out of the copy."""


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _known(context: CopiedContext) -> dict[str, str]:
    """Each file's content sha256 in base/<context> as the copy into base/ recorded it (none: read it)."""
    return {rel: record.sha256 for rel, record in context.files.items() if record.sha256}
