"""Steering notes on their way to a running job, from whichever process the caller reached.

The store is the one source of truth: `steer_job` writes the note as an event of the job (any process
may); the process that runs the job hands each note it has not delivered yet to the job's
orchestrator, at once when it wrote the note itself, else from its watch loop (jobs/service.py), the
way a cancel from another process arrives. The orchestrator records a "steered" event when the
protocol takes the note.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conclave.errors import InputError
from conclave.jobs.store.sql import Store

if TYPE_CHECKING:
    from conclave.coordination.orchestrator import Orchestrator
    from conclave.jobs.store.async_store import AsyncStore


class Steering:
    """The orchestrators of the jobs this process runs, and the last note each was given. The notes are
    read in a reader thread and handed over on the event loop (an orchestrator's inbox is not thread-safe)."""

    def __init__(self, store: AsyncStore) -> None:
        self._store = store
        self._running: dict[str, Orchestrator] = {}
        self._delivered: dict[str, int] = {}

    async def attach(self, job_id: str, orchestrator: Orchestrator, taken: int = 0) -> None:
        """The job's orchestrator exists: notes left while it was queued reach it before its first turns.
        `taken`: how many notes a resumed job's protocol has already (its journal's), never given again."""
        self._running[job_id], self._delivered[job_id] = orchestrator, -1
        if taken:  # notes reach the protocol in order: the first `taken` are in its state
            self._delivered[job_id] = (await self._store.notes_after(job_id, -1))[:taken][-1][0]
        await self.deliver(job_id)

    def detach(self, job_id: str) -> None:
        self._running.pop(job_id, None)
        self._delivered.pop(job_id, None)

    async def deliver(self, job_id: str) -> None:
        """Hand the job's new notes to its orchestrator."""
        if job_id in self._running:  # else not ours, or not started yet (attach delivers)
            self._hand_over(await self._store.notes_after(job_id, self._delivered[job_id]), job_id)

    async def deliver_all(self) -> None:
        """Every running job's new notes, read in one reader-thread hop."""
        marks, sync = dict(self._delivered), self._store.sync
        pending = await self._store.read(
            lambda: {job: sync.notes_after(job, seq) for job, seq in marks.items()}
        )
        for job_id, notes in pending.items():
            self._hand_over(notes, job_id)

    def _hand_over(self, notes: list[tuple[int, str]], job_id: str) -> None:
        orchestrator = self._running.get(job_id)
        for seq, text in notes:
            # another deliver may have handed it over while this one read: each note is given once
            if orchestrator is None or seq <= self._delivered.get(job_id, seq):
                continue
            if not orchestrator.steer(text):
                return  # the job has ended; its view says the note was not seen
            self._delivered[job_id] = seq


def delivered(store: Store, job_id: str, count: int) -> bool:
    """Whether the job's first `count` notes have reached its protocol."""
    return len(store.events(job_id, "steered")) >= count


def checked_note(message: object, max_chars: int) -> str:
    """The note's text, or an InputError naming the fix."""
    text = message.strip() if isinstance(message, str) else ""
    if not text or len(text) > max_chars:
        fix = f"give a note of 1 to {max_chars} characters, e.g. 'keep the public API unchanged'"
        raise InputError(
            "message", message if len(str(message)) < 80 else f"<{len(str(message))} characters>", fix
        )
    return text
