"""What the server derived of a job and the store keeps beside its request and reports: what admission
derived from the request (the options, the estimate), and the files result."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from conclave.files.contexts import ContextPath
from conclave.files.diff import FileChange
from conclave.files.review import HeldBack


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


# What a job stored before its request was kept (jobs/request.py) held in its options; read from there
# for such a job's request (jobs/store/sql.py), dropped from its options.
REQUEST_FIELDS = ("apply", "force_binary", "allow_artifacts", "allow_autorun")


class Estimate(_Record):
    """What a job may use: a range from this team's past jobs here, priced at the team's prices now."""

    jobs: int = Field(description="past completed jobs of this team on this server the range is drawn from")
    tokens: list[int] | None = Field(default=None, description="[low, high] tokens in and out")
    cost_usd: list[float] | None = Field(default=None, description="[low, high] US dollars")
    typical_tokens: int | None = None
    typical_cost_usd: float | None = None
    note: str = ""


class JobOptions(_Record):
    """What admission derived from the job's request (the request itself is stored beside it)."""

    context_paths: list[ContextPath] = Field(default_factory=list)  # named and pinned (file_steps.admit)
    commands: bool = False  # agents get run_command in a sandbox
    estimate: Estimate | None = None  # made at submit, shown while the job runs

    @classmethod
    def stored(cls, options_json: str) -> JobOptions:
        """Options as stored; those stored before the request was kept also held apply and its consents,
        which are the request's now (jobs/request.py stored_request), not options."""
        data = json.loads(options_json)
        return cls.model_validate({key: value for key, value in data.items() if key not in REQUEST_FIELDS})


class ContextChanges(_Record):
    """What the winner changed in one context path, and whether it was applied."""

    name: str
    path: str
    permission: Literal["read", "write"]
    files: list[FileChange] = Field(default_factory=list)  # as the patch summarised them (files/diff.py)
    added_lines: int = 0
    removed_lines: int = 0
    applied: bool = False
    apply_error: str | None = None
    held_back: list[HeldBack] = Field(
        default_factory=list, description="changes apply did not write, each with why and what would allow it"
    )

    @field_validator("files", mode="before")
    @classmethod
    def _stored_before_change(cls, files: Any) -> Any:
        """A file stored before the summary kept `change` had only `status`: a binary one was modified."""
        if not isinstance(files, list):
            return files
        return [
            {**f, "change": "modified" if f.get("status") == "binary" else f.get("status")}
            if isinstance(f, dict) and "change" not in f
            else f
            for f in files
        ]


class FilesResult(_Record):
    """The job's diff summary; the patch itself is read page by page with read_workspace('@diff')."""

    contexts: list[ContextChanges] = Field(default_factory=list)
    patch_chars: int = 0
    outside: list[str] = Field(
        default_factory=list,
        description="files the winner left outside every project folder: not in the diff",
    )
    error: str | None = None
    read: str | None = Field(
        default=None, description="how to read the whole patch (the view says it, never stored)"
    )

    def file_notes(self) -> list[str]:
        """What a person must see about the files, one line each: every change apply held back (why, and
        what would allow it), then every file that runs code or widens an agent's permissions on its own
        and was not held back (applied with consent, or left for the caller to apply)."""
        held = [
            f"held back, not applied: {context.name}/{entry.path}: {entry.fix}"
            for context in self.contexts
            for entry in context.held_back
        ]
        autorun = [
            f"runs code on its own, read it before use: {context.name}/{change.path}: {change.autorun.why}"
            for context in self.contexts
            for change in context.files
            if change.autorun is not None and change.path not in {entry.path for entry in context.held_back}
        ]
        return held + autorun
