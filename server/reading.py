"""What `read_workspace` can read of a job: a listing, the transcript, each answer, the final answer.

Text is paged by characters (`offset`, `limit`) so a client with a small tool-result budget can read
anything in pieces. Files and the diff come with workspaces.
"""

from __future__ import annotations

import json
import re

from conclave.errors import InputError
from conclave.store import JobRow, Store
from conclave.views import WorkspacePage

MAX_LIMIT = 100_000
LABEL = re.compile(r"^[A-P][0-9]{1,2}$")
PATH_HELP = "use '' to list, 'transcript', 'final' or 'answers/<label>' such as answers/B2"


def read_job(store: Store, row: JobRow, path: str, source: str | None, offset: int, limit: int) -> WorkspacePage:
    if not isinstance(offset, int) or offset < 0:
        raise InputError("offset", offset, "use 0 or a next_offset from an earlier page")
    if not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InputError("limit", limit, f"use a number of characters from 1 to {MAX_LIMIT}")
    path = (path or "").strip().strip("/")
    if source not in (None, "", "final"):
        if not isinstance(source, str) or not LABEL.match(source):
            raise InputError("source", source, "use 'final' or an answer label such as B2")
        if path:
            raise InputError("path", path, "with source set to an answer label, leave path empty to read that answer")
        path = f"answers/{source}"
    if not path:
        entries = listing(store, row)
        return _page(row.id, "", "\n".join(entries), offset, limit, entries)
    return _page(row.id, path, _text(store, row, path), offset, limit)


def listing(store: Store, row: JobRow) -> list[str]:
    entries = ["transcript"]
    if row.result is not None and row.result.answer is not None:
        entries.append("final")
    entries += [f"answers/{answer.label}" for answer in store.answers(row.id)]
    return entries


def _text(store: Store, row: JobRow, path: str) -> str:
    if path == "transcript":
        return transcript(store, row)
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
    raise InputError("path", path, PATH_HELP)


def transcript(store: Store, row: JobRow) -> str:
    """The job's events as readable lines; answers in full, votes with their reasons."""
    lines = [f"Job {row.id} - team {row.team_name}", f"Task: {row.task}", ""]
    for event in store.events(row.id):
        who = event.letter or "-"
        d = event.data
        stamp = f"[{event.at:8.2f}s] {who}"
        match event.kind:
            case "answer":
                lines.append(f"{stamp} posted {d['label']}:\n{d['content']}\n")
            case "vote" | "vote_discarded":
                status = "voted for" if event.kind == "vote" else "vote discarded:"
                lines.append(f"{stamp} {status} {d['label']}: {d.get('reason', '')}")
            case "usage":
                continue
            case "finished":
                lines.append(f"{stamp} finished: winner {d.get('winner')}, consensus {d.get('consensus')}; {d.get('reason')}")
            case _:
                details = json.dumps(d, ensure_ascii=False, default=str)
                lines.append(f"{stamp} {event.kind} {details if d else ''}".rstrip())
    return "\n".join(lines)


def _page(
    job_id: str, path: str, text: str, offset: int, limit: int, entries: list[str] | None = None
) -> WorkspacePage:
    chunk = text[offset : offset + limit]
    end = offset + len(chunk)
    return WorkspacePage(
        job_id=job_id, path=path, offset=offset, limit=limit, total=len(text), content=chunk, entries=entries,
        next_offset=end if end < len(text) else None,
    )
