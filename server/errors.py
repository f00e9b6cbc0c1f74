"""Every error Conclave raises on purpose, each message saying what to do next.

    ConclaveError
    ├── InputError            a caller's argument is wrong (names the field, the value, the fix)
    │   ├── JobNotFound       no job with that id in the store
    │   ├── PathOutsideRoot   a path leaves its root: absolute, `..` out, or through a symlink
    │   ├── NotAFile          a FIFO, socket or device where a regular file is needed: never opened
    │   ├── FileTooLarge      a file over a tool's size cap (checked with fstat before reading)
    │   ├── ContextTooLarge   context paths over the file-count or byte cap (names the biggest)
    │   ├── TreeTooLarge      a walk met folders nested too deep or too many entries: it stopped there
    │   ├── NotPermitted      a caller named a folder or team file outside what it may name
    │   │   └── ServerState   a folder that is, holds or lies inside what the server keeps
    │   ├── OverLimit         a budget above the team's own limit or the server's ceiling
    │   └── QueueFull         too many jobs waiting already (CONCLAVE_MAX_QUEUED[_PER_CALLER])
    ├── ConfigError           a team file or preset is wrong (names the file, the key, the fix)
    │   ├── TeamNotFound      no preset or file by that name
    │   ├── UntrustedDestination  a file not in the user's team folder sends a variable or members elsewhere
    │   └── MissingApiKey     a provider key is not in the environment
    ├── ProviderError         a model provider failed; the orchestrator catches these, never SDK classes
    │   ├── RateLimited       429: retried, honouring retry_after
    │   ├── ProviderUnavailable  5xx, timeouts, dropped connections: retried
    │   │   └── StreamCut      the response began, then its connection was cut: retried
    │   ├── AuthFailed        401/403: fails at once
    │   ├── BadRequest        other 4xx: fails at once with the provider's message
    │   └── MalformedResponse the provider answered something we cannot read: retried
    ├── HostStepFailed        a host-side file step (a snapshot, the final tree) failed unexpectedly
    ├── StoreUnavailable      the job store's database cannot be used (names the setting, its value, the fix)
    ├── QueueUnavailable      the job queue's Redis cannot be used (names the setting, its value, the fix)
    ├── SandboxError          the Docker sandbox failed (a container, an exec, an image build)
    │   ├── SandboxUnavailable  no Docker engine reachable, or no sandbox image: refuse command teams
    │   └── BaseUnavailable   the engine can neither pull the Dockerfile route's base nor has a copy
    └── ApplyError            the winner's changes could not be applied to a caller's folder
        ├── ApplyConflict     files there changed since the job started: nothing was written
        └── ApplyFailed       a write failed midway: everything written was rolled back

`app/server.py` translates these into MCP tool errors in one place; anything else is a bug.

One error, two surfaces: a message names arguments and commands through `term("...")` markers, and
`render("mcp")` (what `str()` gives, so MCP tool errors keep the MCP names) or `render("cli")` (what
the `conclave` command prints) spells them the way that surface's user types them: `context_paths`
or `--context`, `read_workspace(job_id, path='@diff')` or `conclave show JOB --diff`.
"""

from __future__ import annotations

import re
from typing import Literal

Surface = Literal["mcp", "cli"]
# What a message may name, as the MCP caller and as the CLI user would type it.
TERMS: dict[str, tuple[str, str]] = {
    "task": ("task", "TASK"),
    "team": ("team", "--team"),
    "team_local": ("team='local'", "--team local"),
    "context_paths": ("context_paths", "--context"),
    "context_example": ("context_paths=[{path: '/abs/project'}]", "--context ./project"),
    "context_write": ("a context path with permission 'write'", "a --context PATH:write folder"),
    "apply": ("apply", "--apply"),
    "apply_force": ('apply: "force"', "--force-apply"),
    "force_binary": ("force_binary=true", "--force-binary"),
    "verify": ("verify", "--verify"),
    "max_cost_usd": ("max_cost_usd", "--max-cost"),
    "max_tokens": ("max_tokens", "--max-tokens"),
    "max_tokens_per_member": ("max_tokens_per_member", "--max-tokens-per-member"),
    "job_id": ("job_id", "JOB"),
    "source": ("source", "--source"),
    "offset": ("offset", "offset"),
    "limit": ("limit", "limit"),
    "insist_secrets": ('"allow_secrets": true on that context path', "--allow-secret-folders"),
    "list_teams": ("list_teams", "`conclave teams`"),
    "list_jobs": ("a job_id from ask_team's result", "`conclave status`"),
    "demo_fix": (
        "ask the user for a provider key (see list_teams) or a subscription member instead",
        "set a provider key for a real team (see `conclave teams`)",
    ),
    "ask_again": ("call ask_team again", "run `conclave ask` again"),
    "cancel": ("cancel one with cancel_job", "stop one with Ctrl-C in its `conclave ask`"),
    "read_diff": ("read_workspace(job_id, path='@diff')", "`conclave show JOB --diff`"),
    "read_transcript": ("read_workspace(job_id, path='transcript')", "`conclave show JOB --transcript`"),
    "read_answers": ("read_workspace(job_id)", "`conclave show JOB --answers`"),
    "list_files": ("read_workspace with path='' and the same source", "`conclave show JOB`"),
    "wait": ("call get_status with job_id and wait_seconds=45", "run `conclave status JOB`"),
    "follow_up": (
        "call ask_team with follow_up=JOB and your next message",
        'run `conclave ask --follow-up JOB "..."`',
    ),
    "steer": (
        "steer_job adds a note the agents see from their next turn",
        '`conclave steer JOB "..."` adds a note',
    ),
}
_MARK = re.compile(r"\x1e(\w+)\x1e")
# CLI `conclave show` options by what read_workspace's `path` names.
_SHOW_FLAGS = {"@diff": "--diff", "transcript": "--transcript", "final": "(the final answer)"}


def term(name: str) -> str:
    """A marker for TERMS[name], spelled per surface when the message is rendered."""
    if name not in TERMS:
        raise KeyError(f"unknown term {name!r}: add it to conclave.errors.TERMS")
    return f"\x1e{name}\x1e"


def say(text: str, surface: Surface = "mcp") -> str:
    """`text` with its terms spelled for `surface`."""
    index = 0 if surface == "mcp" else 1
    return _MARK.sub(lambda m: TERMS.get(m.group(1), (m.group(1), m.group(1)))[index], text)


def cli_field(field: str, value: object) -> str:
    """An MCP argument path (`context_paths[0].path`) as the CLI flag that set it (`--context`)."""
    head = re.split(r"[.\[]", field, maxsplit=1)[0]
    if head == "path":
        return _SHOW_FLAGS.get(str(value), "--file")
    return TERMS[head][1] if head in TERMS else field


class ConclaveError(Exception):
    """Base of every deliberate Conclave error."""

    def __str__(self) -> str:
        return self.render("mcp")

    def render(self, surface: Surface) -> str:
        """The message as that surface's user names things."""
        return say(str(self.args[0]) if self.args else "", surface)


class InputError(ConclaveError):
    """A caller's argument is wrong."""

    def __init__(self, field: str, value: object, fix: str) -> None:
        self.field, self.value, self.fix = field, value, fix
        self._by_field = True  # subclasses with a message of their own render that instead
        super().__init__(f"{field}={_shown(value)} is not valid: {fix}")

    def render(self, surface: Surface) -> str:
        """MCP: `field=value is not valid: fix`; CLI: the flag that set the value, then the fix."""
        if surface == "mcp" or not getattr(self, "_by_field", False):
            return super().render(surface)
        flag = cli_field(self.field, self.value)
        if (
            flag.startswith("(")
            or isinstance(self.value, bool)
            or not isinstance(self.value, (str, int, float))
        ):
            return f"{flag}: {say(self.fix, 'cli')}"
        return f"{flag} {_shown(self.value)}: {say(self.fix, 'cli')}"


def _shown(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


class JobNotFound(InputError):
    """No job with that id exists in the store."""

    def __init__(self, job_id: str) -> None:
        super().__init__("job_id", job_id, f"no such job; list recent jobs with {term('list_jobs')}")

    def render(self, surface: Surface) -> str:
        if surface == "mcp":
            return super().render(surface)
        return f"no job {_shown(self.value)} here; list recent jobs with {say(term('list_jobs'), surface)}"


class PathOutsideRoot(InputError):
    """A path from a model or a caller leaves its root."""

    def __init__(self, field: str, value: str, reason: str) -> None:
        super().__init__(field, value, f"{reason}; give a path relative to the root, e.g. 'src/app.py'")


class NotAFile(InputError):
    """A FIFO, socket or device where a regular file is needed; it was not opened."""

    def __init__(self, field: str, value: str, kind: str) -> None:
        super().__init__(
            field, value, f"it is {kind}, not a regular file; only regular files are read or copied"
        )


class FileTooLarge(InputError):
    """A file over a size cap; refused by its size before anything was read."""

    def __init__(self, field: str, value: str, size: int, cap: int) -> None:
        self.size, self.cap = size, cap
        super().__init__(
            field,
            value,
            f"it holds {size:,} bytes, over the cap of {cap:,} bytes; read a smaller file, or "
            "look into it with run_command (head, grep) where the team has commands",
        )


class NotPermitted(InputError):
    """A caller named something outside what its transport lets it name (a folder, a team file)."""


class OverLimit(InputError):
    """A caller asked for more than the team's own limit or the server's ceiling allows (a budget):
    a call may lower a team's limits, never raise them."""


class ServerState(NotPermitted):
    """A context path that is, holds or lies inside something the server keeps (its home, jobs folder,
    team folders): nothing there is read or written for a caller, whatever the allowed roots say."""


class QueueFull(InputError):
    """More jobs are waiting than CONCLAVE_MAX_QUEUED (or, for one caller, CONCLAVE_MAX_QUEUED_PER_CALLER)
    allows; nothing was queued."""

    def __init__(self, queued: int, cap: int, caller: str | None = None) -> None:
        self.field, self.value = "task", f"<{queued} queued jobs>"
        setting = "CONCLAVE_MAX_QUEUED" if caller is None else "CONCLAVE_MAX_QUEUED_PER_CALLER"
        whose = "jobs are" if caller is None else f"jobs of caller {caller!r} are"
        self.fix = (
            f"{queued} {whose} already waiting for a slot ({setting}={cap}); wait for one to "
            f"finish, {term('cancel')}, or raise {setting}"
        )
        line = "the job queue" if caller is None else f"caller {caller!r}'s line"
        ConclaveError.__init__(self, f"{line} is full: {self.fix}")


class JobFinished(InputError):
    """A steering note for a job that is over: nothing reads it any more."""

    def __init__(self, job_id: str, state: str) -> None:
        super().__init__(
            "job_id",
            job_id,
            f"that job is {state}, so no agent would read the note; to go on from its answer, "
            f"call ask_team with follow_up={job_id!r} and the note as the task "
            f'(CLI: conclave ask --follow-up {job_id} "...")',
        )


class FollowUpConflict(InputError):
    """A follow-up's files: the caller changed a file since the earlier job that its answer changed too."""

    def __init__(self, earlier: str, folder: str, paths: list[str]) -> None:
        self.paths = list(paths)
        super().__init__(
            "follow_up",
            earlier,
            f"{', '.join(paths)} in {folder} changed both in your folder since job "
            f"{earlier} started and in that job's answer, differently; keep one version (apply the earlier "
            f"diff, read_workspace(job_id={earlier!r}, path='@diff'), or revert your edit) "
            "and follow up again, "
            "or start a fresh job without follow_up",
        )


class ContextTooLarge(InputError):
    """The context paths hold more files or bytes than the caps allow; nothing was copied."""

    def __init__(
        self, value: object, found: str, cap: str, biggest: str = "", fix: str | None = None
    ) -> None:
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
            "path",
            where,
            f"{found}, over the cap of {cap}; the walk stopped there. Remove or flatten "
            "those folders (keep generated trees in /tmp)",
        )


class ConfigError(ConclaveError):
    """A team file or preset is wrong."""


class TeamNotFound(ConfigError):
    """No preset or file by that name."""


class UntrustedDestination(ConfigError):
    """A team file the user did not write (not in their team folder) names where data goes: a variable
    sent to a URL of its own, or a host its members may reach, that the user's settings do not allow."""


class MissingApiKey(ConfigError):
    """A provider key is not set in the environment."""

    def __init__(self, variable: str, model: str) -> None:
        self.variable = variable
        super().__init__(
            f"{model} needs an API key: set the {variable} environment variable "
            f"where the server runs (or pick a team that is ready: {term('list_teams')}; "
            f"{term('team_local')} runs the offline demo, not for real work)"
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


class StreamCut(ProviderUnavailable):
    """The provider answered and its stream began, then the connection was cut before the answer ended."""


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


class StoreUnavailable(ConclaveError):
    """The job store's database cannot be opened: a wrong or unreachable CONCLAVE_DATABASE_URL."""

    def __init__(self, setting: str, value: str, fix: str) -> None:
        self.setting, self.value, self.fix = setting, value, fix
        super().__init__(f"{setting}={value}: {fix}")


class QueueUnavailable(ConclaveError):
    """The job queue cannot be used: a wrong or unreachable CONCLAVE_QUEUE_URL, or no `queue` extra."""

    def __init__(self, setting: str, value: str, fix: str) -> None:
        self.setting, self.value, self.fix = setting, value, fix
        super().__init__(f"{setting}={value}: {fix}")


class SandboxError(ConclaveError):
    """The Docker sandbox failed: a container would not start, an exec broke, an image build failed."""


class SandboxStopped(SandboxError):
    """The sandbox stopped (its job ended or was cancelled) before the command ran."""

    def __init__(self) -> None:
        super().__init__("the sandbox stopped before the command ran")


class SandboxUnavailable(SandboxError):
    """No Docker engine is reachable, or the sandbox image is missing."""


class BaseUnavailable(SandboxError):
    """The engine can neither pull the Dockerfile route's base image nor has a copy of it; the route
    choice (sandbox/image_route.py) turns this into the fix."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"the engine could not pull {name} ({reason}) and has no copy of it")


class ApplyError(ConclaveError):
    """The winner's changes could not be applied to a caller's folder."""


class ApplyConflict(ApplyError):
    """Files the patch touches changed in the caller's folder since the job started; nothing was written."""

    def __init__(self, target: str, conflicts: dict[str, str]) -> None:
        self.target, self.conflicts = target, conflicts
        listed = ", ".join(f"{path} ({why})" for path, why in sorted(conflicts.items()))
        super().__init__(
            f"nothing was applied to {target}: {len(conflicts)} "
            f"file{'s' if len(conflicts) != 1 else ''} changed there since the job "
            f"started: {listed}. Review those changes, then apply the patch by hand (read it with "
            f"{term('read_diff')}; `git apply` reports each conflict) or run the task again"
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
