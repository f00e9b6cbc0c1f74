"""What `read_workspace` can read of a job: the transcript, each answer, the final answer, the patch
(`@diff`), each answer's check output (`verify/<label>`, with verify), and, for jobs with context
paths, every file of the final tree or of any answer's snapshot.

Text is paged by characters (`offset`, `limit`) so a client with a small tool-result budget can read
anything in pieces; a listing is paged by entries. A file path with no `source` reads the final tree.
File paths are confined to their tree like every path a caller gives. The store is read in worker
threads (its methods are thread-safe, jobs/store/connections.py), never on the event loop.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import assert_never

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field

from conclave.config.models import LABEL
from conclave.coordination.reports import (
    AgentFailedEvent,
    AnswerEvent,
    AnswerRefusedEvent,
    BudgetReachedEvent,
    CheckedEvent,
    CheckStartedEvent,
    DeadlineEvent,
    FinishedEvent,
    JobEvent,
    NoDecisionEvent,
    NoteEvent,
    PresentingEvent,
    ResumedEvent,
    SnapshotFailedEvent,
    StartedEvent,
    SteeredEvent,
    ToolCallEvent,
    TurnCancelledEvent,
    TurnFailedEvent,
    TurnStartedEvent,
    UsageEvent,
    VerifyBlockedEvent,
    VoteDiscardedEvent,
    VoteEvent,
)
from conclave.errors import InputError, term
from conclave.files.job_folder import JobFolder
from conclave.files.trees import list_tree, read_bytes
from conclave.files.workspaces import Workspaces
from conclave.jobs.read.views import majority_text, winner_check
from conclave.jobs.store.sql import JobRow, Store

MAX_LIMIT = 100_000
PATH_HELP = (
    "use '' to list, 'transcript', 'final', 'thread', 'answers/<label>' such as answers/B2, "
    "or 'verify/<label>'"
)
JOB_TEXTS = ("transcript", "final", "thread")
MAX_LISTED = 2000
MAX_FILE_BYTES = 16 * 1024 * 1024  # a larger file is refused by its size, not read


class WorkspacePage(BaseModel):
    """A page of a job's readable material (an answer, the transcript, or a listing)."""

    model_config = ConfigDict(extra="forbid")

    job_id: str
    path: str
    offset: int
    limit: int
    total: int = Field(description="characters in all (entries, for a listing)")
    content: str
    entries: list[str] | None = Field(default=None, description="for a listing: the readable paths")
    next_offset: int | None = Field(default=None, description="pass as offset to read on; null at the end")

    def text(self) -> str:
        more = f"\n[more: call again with offset={self.next_offset}]" if self.next_offset is not None else ""
        if self.entries is not None:
            span = f"entries {self.offset}-{self.offset + len(self.entries)} of {self.total}"
            return f"{self.path or 'listing'} [{span}]\n{self.content}{more}"
        span = f"{self.offset}:{self.offset + len(self.content)} of {self.total}"
        return f"{self.path} [{span}]\n{self.content}{more}"


async def read_job(
    store: Store,
    row: JobRow,
    workspaces: Workspaces | None,
    path: str,
    source: str | None,
    offset: int,
    limit: int,
) -> WorkspacePage:
    if not isinstance(offset, int) or offset < 0:
        raise InputError("offset", offset, "use 0 or a next_offset from an earlier page")
    if not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InputError("limit", limit, f"use a number of characters from 1 to {MAX_LIMIT}")
    path = (path or "").strip()
    if source in (None, ""):
        if not path:
            return _listing(row.id, await listing(store, row, workspaces), offset, limit)
        if path == "@diff":
            return _page(row.id, path, await _patch(row, workspaces), offset, limit)
        if path in JOB_TEXTS or path.startswith(("answers/", "verify/")) or workspaces is None:
            text = await anyio.to_thread.run_sync(_text, store, row, path.strip("/"), abandon_on_cancel=True)
            return _page(row.id, path, text, offset, limit)
        source = "final"  # a file path on its own reads the final tree, as the tool says
    if workspaces is None:
        no_files = f"this job has no files (it was given no {term('context_paths')}); leave source empty"
        raise InputError("source", source, no_files)
    if not isinstance(source, str) or not (source == "final" or LABEL.fullmatch(source)):
        raise InputError("source", source, "use 'final' or an answer label such as B2")
    tree = workspaces.source(source)
    if not path.strip("/"):
        return _listing(row.id, await _files(tree), offset, limit)
    text = await anyio.to_thread.run_sync(_file_text, tree, path)
    return _page(row.id, path, text, offset, limit)


async def read_whole(
    store: Store, row: JobRow, workspaces: Workspaces | None, path: str, source: str | None
) -> WorkspacePage:
    """Every page of one read as a single page (for resources, which are not paged, and `conclave show`)."""
    first = page = await read_job(store, row, workspaces, path, source, 0, MAX_LIMIT)
    parts, entries = [page.content], list(page.entries or [])
    while page.next_offset is not None:
        page = await read_job(store, row, workspaces, path, source, page.next_offset, MAX_LIMIT)
        parts.append(page.content)
        entries += page.entries or []
    content = "\n".join(parts) if first.entries is not None else "".join(parts)
    return first.model_copy(
        update={
            "content": content,
            "entries": first.entries and entries,
            "limit": max(first.total, 1),
            "next_offset": None,
        }
    )


def job_workspaces(row: JobRow, jobs_root: Path) -> Workspaces | None:
    """The job's files, for a job that was given context paths."""
    return Workspaces(JobFolder(jobs_root, row.id)) if row.options.context_paths else None


async def listing(store: Store, row: JobRow, workspaces: Workspaces | None = None) -> list[str]:
    """What a job offers: its texts, then (with files) the patch and every file of the final tree."""
    entries = ["transcript"]
    if row.result is not None and row.result.answer is not None:
        entries.append("final")
    entries += await anyio.to_thread.run_sync(_stored_entries, store, row, abandon_on_cancel=True)
    if workspaces is not None and workspaces.patch.exists():
        entries.append("@diff")
    if workspaces is not None and workspaces.final.is_dir():
        entries += [name for name in await _files(workspaces.final) if name not in entries]
    return entries


def _stored_entries(store: Store, row: JobRow) -> list[str]:
    """The listing's entries that come from the store (blocking: one reader-thread hop)."""
    conversation = ["thread"] if row.follow_up or store.has_follow_ups(row.id) else []
    answers = [f"answers/{answer.label}" for answer in store.answers(row.id)]
    return conversation + answers + [f"verify/{label}" for label in check_outputs(store, row)]


async def _files(tree: Path) -> list[str]:
    # the walk stops at the cap (files/trees.py): a huge tree is never listed whole to show its start
    found = await anyio.to_thread.run_sync(lambda: list_tree(tree, max_files=MAX_LISTED))
    return sorted(found.files)[:MAX_LISTED]


async def _patch(row: JobRow, workspaces: Workspaces | None) -> str:
    if workspaces is None:
        no_files = f"this job has no files (it was given no {term('context_paths')}), so no diff"
        raise InputError("path", "@diff", no_files)
    patch = workspaces.patch
    if not patch.exists():
        raise InputError(
            "path", "@diff", f"the diff is written when the job ends (state: {row.state}); try later"
        )
    return await anyio.to_thread.run_sync(patch.read_text)


def _file_text(tree: Path, path: str) -> str:
    try:
        data = read_bytes(tree, path, MAX_FILE_BYTES)  # fd-relative, no link followed, size checked first
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise InputError(
            "path", path, f"no such file in that tree; list it with {term('list_files')}"
        ) from None
    if b"\x00" in data[:8192]:
        return f"[binary file, {len(data)} bytes: not shown]"
    return data.decode("utf-8", errors="replace")


def _text(store: Store, row: JobRow, path: str) -> str:
    if path == "transcript":
        return transcript(store, row)
    if path == "thread":
        return conversation_text(store, row)
    if path == "final":
        if row.result is None or row.result.answer is None:
            raise InputError("path", path, f"the job has no final answer yet (state: {row.state}); try later")
        return row.result.answer
    if path.startswith("answers/"):
        label = path.removeprefix("answers/")
        for answer in store.answers(row.id):
            if answer.label == label:
                return answer.content
        known = ", ".join(a.label for a in store.answers(row.id)) or "none yet"
        raise InputError("path", path, f"no answer {label!r} in this job (answers: {known})")
    if path.startswith("verify/"):
        label, outputs = path.removeprefix("verify/"), check_outputs(store, row)
        if label in outputs:
            return outputs[label]
        known = (
            ", ".join(outputs) or "none yet (with verify, each answer's check comes back after it is posted)"
        )
        raise InputError("path", path, f"no check output for {label!r} in this job (checked: {known})")
    raise InputError("path", path, PATH_HELP)


def check_outputs(store: Store, row: JobRow) -> dict[str, str]:
    """Each checked answer's whole check output (capped as every command's is), by label."""
    return {e.label: e.output for e in store.events(row.id, "checked") if isinstance(e, CheckedEvent)}


def transcript(store: Store, row: JobRow) -> str:
    """The job's events as sentences: answers in full, votes with their reasons, one line for the rest."""
    lines = [f"Job {row.id} - team {row.team_name}", f"Task: {row.task}", ""]
    for event in store.events(row.id):
        said = _sentence(event)
        if said is not None:
            lines.append(f"[{event.at:8.2f}s] {said}")
    return "\n".join(lines)


def _sentence(event: JobEvent) -> str | None:
    """One event in words; None for bookkeeping a reader does not need (usage reports, check starts)."""
    who = event.letter or "the job"
    match event:
        case StartedEvent():
            models = ", ".join(f"{seat.letter} ({seat.model})" for seat in event.agents)
            return f"The job started with agents {models}."
        case ResumedEvent():
            turns = ", ".join(event.turns) or "none"
            checks = ", ".join(event.checks)
            again = f"; checks run again: {checks}" if checks else ""
            return f"The job resumed after its server stopped; turns run again: {turns}{again}."
        case TurnStartedEvent():
            return f"{who} started a turn (round {event.round})."
        case TurnCancelledEvent():
            return f"{who}'s turn was cancelled: the answers changed while it ran."
        case ToolCallEvent():
            return f"{who} called {event.name} {json.dumps(event.arguments, ensure_ascii=False)[:200]}."
        case AnswerEvent():
            return f"{who} posted {event.label}:\n{event.content}\n"
        case VoteEvent():
            return f"{who} voted for {event.label}" + (f": {event.reason}" if event.reason else ".")
        case VoteDiscardedEvent():
            why = f" ({event.reason})" if event.reason else ""
            return f"{who}'s vote for {event.label} was discarded: the answers changed or it named none{why}."
        case NoDecisionEvent():
            return f"{who} neither answered nor voted; it said: {event.text[:300]}"
        case TurnFailedEvent():
            return f"{who}'s turn failed: {event.error}."
        case AgentFailedEvent():
            return f"{who} dropped out: {event.error}."
        case AnswerRefusedEvent():
            return f"{who}'s answer was refused: {event.error}."
        case SnapshotFailedEvent():
            return f"{who}'s files could not be saved: {event.error}."
        case UsageEvent() | CheckStartedEvent():
            return None
        case CheckedEvent():
            check = event.check
            tail = "\n    ".join(check.tail)
            status = f"{check.status} (exit {check.exit_code}, {check.duration_s} s)"
            return f"The check of {event.label} {status}; its whole output is verify/{event.label}." + (
                f"\n    {tail}" if tail else ""
            )
        case VerifyBlockedEvent():
            return f"Verification cannot decide: {event.reason}."
        case NoteEvent():
            return f"A note from the person who asked: {event.text}"
        case SteeredEvent():
            late = " (after the vote: it changed nothing)" if event.late else ""
            return f"The note reached the agents in round {event.round}; the votes were cleared{late}."
        case BudgetReachedEvent() | DeadlineEvent():
            return f"The job stopped: {event.reason}."
        case PresentingEvent():
            return f"{who} is writing the final answer ({event.winner} won the vote)."
        case FinishedEvent():
            result = event.result
            consensus = "with consensus" if result.consensus else "without consensus"
            winner = f"{result.winner} won {consensus}" if result.winner else "no answer won"
            return f"The job finished: {winner}; {result.reason}."
        case _:
            assert_never(event)


def conversation_text(store: Store, row: JobRow) -> str:
    """The conversation `row` belongs to: each job, oldest first, with its task, answer and verdict."""
    jobs = store.conversation(row.id)
    lines = [f"Thread of {len(jobs)} job(s); {row.id} is marked with *", ""]
    for number, job in enumerate(jobs, 1):
        mark = "*" if job.id == row.id else " "
        after = f", a follow-up of {job.follow_up}" if job.follow_up else ""
        changed = ""
        if job.files is not None:
            names = [f"{c.name}/{f.path}" for c in job.files.contexts for f in c.files]
            changed = f"\nFiles changed: {', '.join(names) or 'none'}"
        _, answer = best_answer(store, job)
        lines += [
            f"{mark}{number}. {job.id} ({job.state}{after})",
            f"Task: {job.task}",
            f"Verdict: {verdict(store, job)}{changed}",
            f"Answer:\n{answer or '(none)'}",
            "",
        ]
    return "\n".join(lines)


def _page(job_id: str, path: str, text: str, offset: int, limit: int) -> WorkspacePage:
    chunk = text[offset : offset + limit]
    end = offset + len(chunk)
    return WorkspacePage(
        job_id=job_id,
        path=path,
        offset=offset,
        limit=limit,
        total=len(text),
        content=chunk,
        next_offset=end if end < len(text) else None,
    )


def _listing(job_id: str, entries: list[str], offset: int, limit: int) -> WorkspacePage:
    """A page of a listing: `offset` and `limit` count entries."""
    shown = entries[offset : offset + limit]
    end = offset + len(shown)
    return WorkspacePage(
        job_id=job_id,
        path="",
        offset=offset,
        limit=limit,
        total=len(entries),
        content="\n".join(shown),
        entries=shown,
        next_offset=end if end < len(entries) else None,
    )


def best_answer(store: Store, row: JobRow) -> tuple[str | None, str | None]:
    """The job's answer to carry on from: (label, text); the final answer when it has one."""
    result = row.result
    if result is not None and result.answer:
        return result.winner, result.answer
    leading = row.progress.leading.label if row.progress and row.progress.leading else None
    label = (result.winner if result else None) or leading
    answers = store.answers(row.id)
    found = next((a for a in answers if a.label == label), answers[-1] if answers else None)
    return (found.label, found.content) if found else (None, None)


def verdict(store: Store, row: JobRow) -> str:
    """How the earlier answer was chosen, in words, for the history."""
    label, _ = best_answer(store, row)
    result = row.result
    parts = [f"answer {label}" if label else "no answer"]
    if row.state != "completed":
        parts.append(f"the job was {row.state} before the vote ended: its last best answer")
    elif result is not None and result.winner:
        parts.append(majority_text(result))
    checks = {k: v.text() for k, v in row.progress.checks.items()} if row.progress else {}
    blocked = row.progress.verify_blocked if row.progress else None
    check = winner_check(result, checks, blocked) if result else (checks.get(label or "") if label else None)
    if check:
        parts.append(f"verify {check}")
    return "; ".join(parts)
