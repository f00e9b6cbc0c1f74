"""The store's rows for conversations: the jobs a follow-up chain holds, and steering notes.

A mixin of `Store` (sql.py), on its connection and its write transactions; migration 4 adds the `follow_up`
column, written with the job (new_job.py `NewJob.follow_up`). A note is an event of kind "note" that any
process may write; the job's owner reads the notes it has not delivered yet (`notes_after`) and records a
"steered" event when the protocol takes one (jobs/context/steering.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from conclave.coordination.reports import NoteEvent
from conclave.jobs.store.dialect import Connection

CONVERSATION_LIMIT = 100  # jobs in one conversation, at most: a longer one is shown from its recent jobs


class Linked(Protocol):
    """What the conversation walk reads of a stored job (sql.py's `JobRow`, which this module cannot import:
    sql.py imports it)."""

    @property
    def follow_up(self) -> str | None: ...


Row = TypeVar("Row", bound=Linked)


class ConversationRecords(Generic[Row]):
    """Follow-up links and steering notes (see the module docstring)."""

    @property
    def _db(self) -> Connection:  # the Store's: the writer in a write, else this thread's reader
        raise NotImplementedError

    _clock: Callable[[], float]
    _write: Callable[[], Any]
    job: Callable[[str], Row | None]

    def conversation(self, job_id: str) -> list[Row]:
        """Every job of `job_id`'s conversation, oldest first: its first job and each follow-up, chained."""
        root, seen = job_id, {job_id}
        while (row := self.job(root)) is not None and row.follow_up and row.follow_up not in seen:
            if self.job(row.follow_up) is None:
                break  # the earlier job was pruned: the conversation starts here
            root = row.follow_up
            seen.add(root)
        rows = self._db.execute(
            "WITH RECURSIVE chain(id) AS (SELECT ? UNION SELECT j.id FROM jobs j JOIN chain c ON "
            "j.follow_up = c.id)"
            " SELECT id FROM jobs WHERE id IN (SELECT id FROM chain) ORDER BY created_at LIMIT ?",
            (root, CONVERSATION_LIMIT),
        ).fetchall()
        return [found for r in rows if (found := self.job(r["id"])) is not None]

    def has_follow_ups(self, job_id: str) -> bool:
        return (
            self._db.execute("SELECT 1 FROM jobs WHERE follow_up = ? LIMIT 1", (job_id,)).fetchone()
            is not None
        )

    def add_note(self, job_id: str, text: str) -> int:
        """Store a steering note as an event of the job; its sequence number."""
        now = self._clock()
        with self._write():
            row = self._db.execute("SELECT started_at FROM jobs WHERE id = ?", (job_id,)).fetchone()
            at = round(now - row["started_at"], 3) if row is not None and row["started_at"] else 0.0
            seq = self._db.execute("SELECT COUNT(*) FROM events WHERE job_id = ?", (job_id,)).fetchone()[0]
            self._db.execute(
                "INSERT INTO events (job_id, seq, at, kind, letter, data_json) VALUES (?, ?, ?, 'note', "
                "NULL, ?)",
                (job_id, seq, at, NoteEvent(text=text, seq=seq).payload_json()),
            )
            self._db.execute("UPDATE jobs SET rev = rev + 1 WHERE id = ?", (job_id,))
        return int(seq)

    def notes_after(self, job_id: str, seq: int) -> list[tuple[int, str]]:
        """The job's steering notes after sequence number `seq`, oldest first: (seq, text)."""
        rows = self._db.execute(
            "SELECT seq, data_json FROM events WHERE job_id = ? AND kind = 'note' AND seq > ? ORDER BY seq",
            (job_id, seq),
        ).fetchall()
        return [(int(row["seq"]), json.loads(row["data_json"])["text"]) for row in rows]
