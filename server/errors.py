"""Every error Conclave raises on purpose, each message saying what to do next.

    ConclaveError
    ├── InputError            a caller's argument is wrong (names the field, the value, the fix)
    │   ├── JobNotFound       no job with that id in the store
    │   ├── PathOutsideRoot   a path leaves its root: absolute, `..` out, or through a symlink
    │   ├── NotAFile          a FIFO, socket or device where a regular file is needed: never opened
    │   ├── FileTooLarge      a file over a tool's size cap (checked with fstat before reading)
    │   ├── ContextTooLarge   context paths over the file-count or byte cap (names the biggest folders)
    │   ├── TreeTooLarge      a walk met folders nested too deep or too many entries: it stopped there
    │   ├── NotPermitted      a caller named a folder or team file outside what it may name
    │   └── QueueFull         too many jobs waiting already (CONCLAVE_MAX_QUEUED)
    ├── ConfigError           a team file or preset is wrong (names the file, the key, the fix)
    │   ├── TeamNotFound      no preset or file by that name
    │   └── MissingApiKey     a provider key is not in the environment
    ├── ProviderError         a model provider failed; the orchestrator catches these, never SDK classes
    │   ├── RateLimited       429: retried, honouring retry_after
    │   ├── ProviderUnavailable  5xx, timeouts, dropped connections, cut streams: retried
    │   ├── AuthFailed        401/403: fails at once
    │   ├── BadRequest        other 4xx: fails at once with the provider's message
    │   └── MalformedResponse the provider answered something we cannot read: retried
    ├── HostStepFailed        a host-side file step (a snapshot, the final tree) failed unexpectedly
    ├── SandboxError          the Docker sandbox failed (a container, an exec, an image build)
    │   └── SandboxUnavailable  no Docker engine reachable, or no sandbox image: refuse command teams
    └── ApplyError            the winner's changes could not be applied to a caller's folder
        ├── ApplyConflict     files there changed since the job started: nothing was written
        └── ApplyFailed       a write failed midway: everything written was rolled back

`app.py` translates these into MCP tool errors in one place; anything else is a bug.
"""

from __future__ import annotations


class ConclaveError(Exception):
    """Base of every deliberate Conclave error."""


class InputError(ConclaveError):
    """A caller's argument is wrong."""

    def __init__(self, field: str, value: object, fix: str) -> None:
        self.field, self.value, self.fix = field, value, fix
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"{field}={shown} is not valid: {fix}")


class JobNotFound(InputError):
    """No job with that id exists in the store."""

    def __init__(self, job_id: str) -> None:
        super().__init__("job_id", job_id, "no such job; list recent jobs with `conclave status`")


class PathOutsideRoot(InputError):
    """A path from a model or a caller leaves its root."""

    def __init__(self, field: str, value: str, reason: str) -> None:
        super().__init__(field, value, f"{reason}; give a path relative to the root, e.g. 'src/app.py'")


class NotAFile(InputError):
    """A FIFO, socket or device where a regular file is needed; it was not opened."""

    def __init__(self, field: str, value: str, kind: str) -> None:
        super().__init__(field, value, f"it is {kind}, not a regular file; only regular files are read or copied")


class FileTooLarge(InputError):
    """A file over a size cap; refused by its size before anything was read."""

    def __init__(self, field: str, value: str, size: int, cap: int) -> None:
        self.size, self.cap = size, cap
        super().__init__(
            field, value, f"it holds {size:,} bytes, over the cap of {cap:,} bytes; read a smaller file, or "
            "look into it with run_command (head, grep) where the team has commands"
        )


class NotPermitted(InputError):
    """A caller named something outside what its transport lets it name (a folder, a team file)."""


class QueueFull(InputError):
    """More jobs are waiting than CONCLAVE_MAX_QUEUED allows; nothing was queued."""

    def __init__(self, queued: int, cap: int) -> None:
        self.field, self.value = "task", f"<{queued} queued jobs>"
        self.fix = (
            f"{queued} jobs are already waiting for a slot (CONCLAVE_MAX_QUEUED={cap}); wait for one to "
            "finish, cancel one with cancel_job, or raise CONCLAVE_MAX_QUEUED"
        )
        ConclaveError.__init__(self, f"the job queue is full: {self.fix}")


class JobFinished(InputError):
    """A steering note for a job that is over: nothing reads it any more."""

    def __init__(self, job_id: str, state: str) -> None:
        super().__init__(
            "job_id", job_id, f"that job is {state}, so no agent would read the note; to go on from its answer, "
            f"call ask_team with follow_up={job_id!r} and the note as the task (CLI: conclave ask --follow-up "
            f"{job_id} \"...\")",
        )


class FollowUpConflict(InputError):
    """A follow-up's files: the caller changed a file since the earlier job that its answer changed too."""

    def __init__(self, earlier: str, folder: str, paths: list[str]) -> None:
        self.paths = list(paths)
        super().__init__(
            "follow_up", earlier, f"{', '.join(paths)} in {folder} changed both in your folder since job "
            f"{earlier} started and in that job's answer, differently; keep one version (apply the earlier "
            f"diff, read_workspace(job_id={earlier!r}, path='@diff'), or revert your edit) and follow up again, "
            "or start a fresh job without follow_up",
        )


class ContextTooLarge(InputError):
    """The context paths hold more files or bytes than the caps allow; nothing was copied."""

    def __init__(self, value: object, found: str, cap: str, biggest: str = "", fix: str | None = None) -> None:
        self.field, self.value = "context_paths", value
        self.fix = fix or (
            "narrow the path to the folder the task needs, or add a .gitignore entry for generated "
            "folders (e.g. node_modules/, build/, .venv/)"
        )
        hint = f"; the biggest folders: {biggest}" if biggest else ""
        ConclaveError.__init__(self, f"{value} holds {found}, over the cap of {cap}{hint}. {self.fix}")


class TreeTooLarge(InputError):
    """A tree walk stopped at its depth or entry cap, checked while walking (files/safe.py)."""

    def __init__(self, where: str, found: str, cap: str) -> None:
        self.where, self.found, self.cap = where, found, cap
        super().__init__(
            "path", where, f"{found}, over the cap of {cap}; the walk stopped there. Remove or flatten "
            "those folders (keep generated trees in /tmp)"
        )


class ConfigError(ConclaveError):
    """A team file or preset is wrong."""


class TeamNotFound(ConfigError):
    """No preset or file by that name."""


class MissingApiKey(ConfigError):
    """A provider key is not set in the environment."""

    def __init__(self, variable: str, model: str) -> None:
        self.variable = variable
        super().__init__(
            f"{model} needs an API key: set the {variable} environment variable "
            f"(or pick another team, e.g. team='local')"
        )


class ProviderError(ConclaveError):
    """A model provider call failed."""

    retryable = False

    def __init__(self, provider: str, message: str, *, status: int | None = None) -> None:
        self.provider, self.status = provider, status
        where = f"{provider} (HTTP {status})" if status else provider
        super().__init__(f"{where}: {message}")


class RateLimited(ProviderError):
    """The provider asked us to slow down (429)."""

    retryable = True

    def __init__(
        self, provider: str, message: str, *, status: int | None = 429, retry_after: float | None = None
    ) -> None:
        super().__init__(provider, message, status=status)
        self.retry_after = retry_after


class ProviderUnavailable(ProviderError):
    """5xx, a timeout, a dropped connection or a cut stream."""

    retryable = True


class AuthFailed(ProviderError):
    """The provider refused the key (401/403)."""


class BadRequest(ProviderError):
    """The provider refused the request (a 4xx other than 401/403/429)."""


class MalformedResponse(ProviderError):
    """The provider answered with something we could not parse."""

    retryable = True


class HostStepFailed(ConclaveError):
    """A host-side file step of a turn (a snapshot, the final tree) failed unexpectedly: that step
    fails with this message, never the job."""


class SandboxError(ConclaveError):
    """The Docker sandbox failed: a container would not start, an exec broke, an image build failed."""


class SandboxUnavailable(SandboxError):
    """No Docker engine is reachable, or the sandbox image is missing."""


class ApplyError(ConclaveError):
    """The winner's changes could not be applied to a caller's folder."""


class ApplyConflict(ApplyError):
    """Files the patch touches changed in the caller's folder since the job started; nothing was written."""

    def __init__(self, target: str, conflicts: dict[str, str]) -> None:
        self.target, self.conflicts = target, conflicts
        listed = ", ".join(f"{path} ({why})" for path, why in sorted(conflicts.items()))
        super().__init__(
            f"nothing was applied to {target}: {len(conflicts)} file(s) changed there since the job "
            f"started: {listed}. Review those changes, then apply the patch by hand (read it with "
            f"read_workspace path='@diff'; `git apply` reports each conflict) or run the task again"
        )


class ApplyFailed(ApplyError):
    """A write failed while applying; what had been written was rolled back."""

    def __init__(self, target: str, path: str, reason: str, unrestored: list[str] | None = None) -> None:
        self.target, self.path, self.unrestored = target, path, list(unrestored or [])
        state = (
            "every change was rolled back, the folder is as before"
            if not self.unrestored
            else f"these could not be restored, their backups (*.conclave-backup-*) are kept: "
            f"{', '.join(self.unrestored)}"
        )
        super().__init__(
            f"applying to {target} failed at {path}: {reason}; {state}. Fix the cause (disk space, "
            f"permissions) and apply again"
        )
