"""Context paths: the caller's folders, validated, and copied at job start honouring .gitignore and caps.

`copy_context(paths, dest, caps)` lists every path first (stat only, .gitignore applied), refuses with
`ContextTooLarge` before anything is copied when the file count or the bytes exceed the caps, then copies
each path into `dest/<name>` (a stable unique name: the folder's basename, de-duplicated with -2, -3...),
hashing while it copies. The returned `ContextManifest` records per file its size, mode and sha256: the
diff base and apply's conflict check. Symlinks, FIFOs, sockets, devices and unreadable files are not
copied and are listed in `skipped` with the reason; `.git` is skipped at any depth.
"""

from __future__ import annotations

import os
from collections import Counter
from contextlib import ExitStack
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal

import anyio.to_thread
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from conclave.errors import ContextTooLarge, InputError, term
from conclave.files.kept import Kept
from conclave.files.roots import pinned
from conclave.files.trees import IgnoreRules, Listing, copy_tree, list_tree

CALLER = {"caller": True}  # validation context of a caller's request: the folder must exist now
# Kernel and device filesystems: their files report a size of 0 (or block, or change on every read).
PSEUDO = frozenset(
    {
        "proc",
        "sysfs",
        "devtmpfs",
        "devpts",
        "debugfs",
        "tracefs",
        "securityfs",
        "cgroup",
        "cgroup2",
        "pstore",
        "bpf",
        "configfs",
        "fusectl",
        "mqueue",
        "binfmt_misc",
        "efivarfs",
        "hugetlbfs",
        "autofs",
        "rpc_pipefs",
        "nsfs",
        "selinuxfs",
    }
)
PSEUDO_ROOTS = (Path("/proc"), Path("/sys"), Path("/dev"))
# Folders that hold credentials: a context path inside one, or holding one (a home folder), would send
# the keys to every provider of the team; refused unless the caller insists (docs/SECURITY.md).
SECRET_FOLDERS = frozenset({".ssh", ".aws", ".gnupg", ".kube", ".docker", ".password-store", ".azure"})


def pseudo_filesystem(path: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> str | None:
    """The pseudo filesystem type `path` (resolved) lies on, else None (from the mount table)."""
    if any(path == root or path.is_relative_to(root) for root in PSEUDO_ROOTS):
        return path.parts[1]
    best, kind = -1, None
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        point = Path(fields[4].replace("\\040", " "))
        if (path == point or path.is_relative_to(point)) and len(point.parts) > best:
            best, kind = len(point.parts), right.split()[0]
    return kind if kind in PSEUDO else None


# One model from the MCP input (ask_team's context_paths) to the stored job record. Validated with the
# context CALLER (as parse_context_paths does when a job is submitted), `path` must be an existing
# directory and is made absolute; otherwise (a stored record read back, whose folder may be gone by
# now) it is taken as it is. `name` is the folder's name in every workspace, set when the job is
# admitted. The docstring and the descriptions are what a calling model reads, so they name no
# internals.
class ContextPath(BaseModel):
    """A project folder on this machine for the team to work on, read-only unless `permission` is
    "write". Its files are sent to every model provider in the team."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(description="an absolute folder path on the machine running the server")
    permission: Literal["read", "write"] = Field(
        default="read", description="write: the winning changes may be applied back with apply=true"
    )
    allow_secrets: bool = Field(
        default=False,
        description="true only if the user explicitly asked to send a folder of credentials "
        "(~/.ssh, ~/.aws, ~/.gnupg, or a folder holding one) to the team's providers",
    )
    name: SkipJsonSchema[str | None] = None
    # (st_dev, st_ino) of the folder when the job was admitted; copy and apply refuse any other (roots.py)
    identity: SkipJsonSchema[tuple[int, int] | None] = None

    @field_validator("path")
    @classmethod
    def _existing_directory(cls, value: str, info: ValidationInfo) -> str:
        if not (info.context and info.context.get("caller")):
            return value
        if not value.strip():
            raise ValueError("it is empty; give the directory the team should work on")
        path = Path(value).expanduser()
        if not path.exists():
            raise ValueError(
                "it does not exist; give an existing directory (an absolute path is safest; "
                f"relative paths resolve against {Path.cwd()})"
            )
        if not path.is_dir():
            raise ValueError("it is a file, not a directory; give the folder that holds it")
        real = Path(os.path.realpath(path))
        pseudo = pseudo_filesystem(real)
        if pseudo:
            raise ValueError(
                f"it is on the {pseudo} pseudo filesystem (kernel or device files), which is never "
                "copied; give a project folder"
            )
        return str(real)

    @model_validator(mode="after")
    def _no_secrets(self, info: ValidationInfo) -> ContextPath:
        if not (info.context and info.context.get("caller")) or self.allow_secrets:
            return self
        found = secret_folder(Path(self.path))
        if found:
            raise ValueError(
                f"{found} holds credentials, and a context folder is sent to every provider of the team; "
                f"give the project folder instead (or, only if the user insists, {term('insist_secrets')})"
            )
        return self


def secret_folder(path: Path) -> str | None:
    """The credentials folder `path` is in or holds at its top (a home folder holds ~/.ssh), else None."""
    inside = next((part for part in path.parts if part in SECRET_FOLDERS), None)
    if inside:
        return str(Path(*path.parts[: path.parts.index(inside) + 1]))
    for name in sorted(SECRET_FOLDERS):
        try:
            if (path / name).is_dir():
                return str(path / name)
        except OSError:
            continue
    return None


def parse_context_paths(value: object, kept: Kept | None = None) -> list[ContextPath]:
    """A caller's context_paths as validated models; errors name the item, the value and the fix.
    With `kept`, a path that touches what the server keeps is refused first, file or folder alike."""
    if not isinstance(value, list):
        raise InputError(
            "context_paths", value, 'give a list like [{"path": "/abs/project", "permission": "read"}]'
        )
    parsed: list[ContextPath] = []
    for index, item in enumerate(value):
        try:
            data = item.model_dump(exclude={"name", "identity"}) if isinstance(item, ContextPath) else item
            if isinstance(data, dict) and (
                "name" in data or "identity" in data
            ):  # set by us, never by a caller
                data = {key: value for key, value in data.items() if key not in ("name", "identity")}
            if kept is not None and isinstance(data, dict):
                _refuse_kept(kept, f"context_paths[{index}].path", data.get("path"))
            parsed.append(ContextPath.model_validate(data, context=CALLER))
        except ValidationError as exc:
            raise item_error(index, item, exc) from exc
    return parsed


def _refuse_kept(kept: Kept, field: str, given: object) -> None:
    if isinstance(given, str) and given.strip() and os.path.lexists(Path(given).expanduser()):
        kept.refuse(field, given, Path(given).expanduser())


def item_error(index: int, item: object, exc: ValidationError) -> InputError:
    """One context path's problems in words, without pydantic's phrasing ("Value error, ...")."""
    problems = [(".".join(map(str, e["loc"])), e["msg"].removeprefix("Value error, ")) for e in exc.errors()]
    path = item.get("path") if isinstance(item, dict) else getattr(item, "path", None)
    if len(problems) == 1 and problems[0][0] in ("path", "") and isinstance(path, str):
        return InputError(f"context_paths[{index}].path", path, problems[0][1])
    fix = "; ".join(f"{where} {message}" if where else message for where, message in problems)
    return InputError(f"context_paths[{index}]", item, fix)


class Caps(BaseModel):
    """Limits on the files copied; exceeding one refuses the copy before anything is written."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_files: Annotated[int, Field(ge=1)] = 5_000
    max_bytes: Annotated[int, Field(ge=1)] = 50 * 1024 * 1024


class FileRecord(BaseModel):
    """One copied file at job start."""

    size: int
    mode: int
    sha256: str


class CopiedContext(BaseModel):
    """One context path as copied: `base/<name>` holds it, `files` records it, `skipped` says what not."""

    name: str
    source: str
    permission: Literal["read", "write"]
    files: dict[str, FileRecord]
    skipped: dict[str, str] = {}
    identity: tuple[int, int] | None = None  # the source folder's, as admitted (roots.py)


class ContextManifest(BaseModel):
    """Every context path of a job as copied at job start."""

    contexts: list[CopiedContext] = []
    # base/'s tree digest as a check sees it (Workspaces.base_digest), taken when base/ was made; None in a
    # manifest written before it was recorded, where it is taken from a walk of base/
    digest: str | None = None

    def get(self, name: str) -> CopiedContext:
        for context in self.contexts:
            if context.name == name:
                return context
        names = ", ".join(c.name for c in self.contexts) or "none"
        raise InputError("context", name, f"no context path by that name; the job has: {names}")


def named(sources: list[ContextPath]) -> list[ContextPath]:
    """The sources with their workspace folder names set; a folder given twice is refused."""
    paths = [Path(source.path) for source in sources]
    if len(set(paths)) != len(paths):
        shown = [source.path for source in sources]
        raise InputError("context_paths", shown, "a folder is listed twice; give each folder once")
    return [
        source.model_copy(update={"name": name})
        for source, name in zip(sources, _names(sources), strict=True)
    ]


def _names(sources: list[ContextPath]) -> list[str]:
    """A stable, unique folder name per context path: its basename, de-duplicated with -2, -3..."""
    seen: set[str] = set()
    names = []
    for source in sources:
        stem = Path(source.path).name or "root"
        name, n = stem, 1
        while name in seen:
            n += 1
            name = f"{stem}-{n}"
        seen.add(name)
        names.append(name)
    return names


def _scan(sources: list[ContextPath], caps: Caps, roots: list[Path] | None = None) -> list[Listing]:
    """List every source (read at `roots`, the pinned folders) honouring .gitignore; raise ContextTooLarge
    over a cap, before any copy."""
    paths = [Path(source.path) for source in sources]
    if len(set(paths)) != len(paths):
        given = [source.path for source in sources]
        raise InputError("context_paths", given, "a folder is listed twice; give each folder once")
    listings = [
        list_tree(root, rules=IgnoreRules(root), max_files=caps.max_files * 2) for root in roots or paths
    ]
    limited = next((listing.limit for listing in listings if listing.limit), None)
    if limited:
        raise ContextTooLarge(
            ", ".join(str(path) for path in paths),
            limited,
            "the walk's caps",
            fix="remove those folders or add them to a .gitignore",
        )
    count = sum(len(listing.files) for listing in listings)
    size = sum(listing.total_bytes for listing in listings)
    shown = ", ".join(str(path) for path in paths)
    if count > caps.max_files:
        at_least = "at least " if any(listing.truncated for listing in listings) else ""
        found = f"{at_least}{count:,} files after .gitignore"
        raise ContextTooLarge(shown, found, f"{caps.max_files:,} files", _biggest(paths, listings, "files"))
    if size > caps.max_bytes:
        found = f"{mb(size)} after .gitignore"
        raise ContextTooLarge(shown, found, mb(caps.max_bytes), _biggest(paths, listings, "bytes"))
    return listings


def _biggest(paths: list[Path], listings: list[Listing], by: str) -> str:
    """The three top-level folders (or files) holding the most files or bytes, for the error message."""
    weight: Counter[Path] = Counter()
    files: Counter[Path] = Counter()
    for root, listing in zip(paths, listings, strict=True):
        for rel, entry in listing.files.items():
            top = root / PurePosixPath(rel).parts[0]
            weight[top] += 1 if by == "files" else entry.size
            files[top] += 1
    return ", ".join(
        f"{top} ({files[top]:,} files)" if by == "files" else f"{top} ({mb(amount)})"
        for top, amount in weight.most_common(3)
    )


def mb(size: int) -> str:
    return f"{size / 1024 / 1024:,.1f} MB"


def copy_context_sync(sources: list[ContextPath], dest: Path, caps: Caps = Caps()) -> ContextManifest:
    """Copy each context path into `dest/<name>`; blocking (see `copy_context`).

    Each folder is pinned first: reached without following a link and, when it was admitted with one,
    checked to be the same directory (roots.py); everything is then read through that directory.
    """
    with ExitStack() as stack:
        roots = [stack.enter_context(pinned(source.path, source.identity)) for source in sources]
        return _copy_pinned(sources, roots, dest, caps)


def _copy_pinned(sources: list[ContextPath], roots: list[Path], dest: Path, caps: Caps) -> ContextManifest:
    listings = _scan(sources, caps, roots)
    contexts = []
    for source, root, name, listing in zip(sources, roots, _names(sources), listings, strict=True):
        skipped = dict(listing.skipped)

        def unreadable(rel: str, exc: OSError | InputError, skipped: dict[str, str] = skipped) -> None:
            skipped[rel] = f"unreadable, not copied: {getattr(exc, 'strerror', None) or exc}"

        hashes = copy_tree(root, dest / name, listing, on_error=unreadable)
        files = {
            rel: FileRecord(size=entry.size, mode=entry.mode, sha256=hashes[rel] or "")
            for rel, entry in listing.files.items()
            if rel in hashes
        }
        contexts.append(
            CopiedContext(
                name=name,
                source=source.path,
                permission=source.permission,
                files=files,
                skipped=skipped,
                identity=source.identity,
            )
        )
    return ContextManifest(contexts=contexts)


async def copy_context(sources: list[ContextPath], dest: Path, caps: Caps = Caps()) -> ContextManifest:
    """Copy each context path into `dest/<name>` honouring .gitignore; ContextTooLarge before any copy."""
    return await anyio.to_thread.run_sync(copy_context_sync, sources, dest, caps)
