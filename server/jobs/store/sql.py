"""The job store: one SQLite file in WAL mode, shared by every Conclave process on the machine, or one
PostgreSQL database shared by every host (CONCLAVE_DATABASE_URL; the same SQL, schema and migrations:
jobs/store/dialect.py says what differs).

It is the single source of truth: any process answers `get_status` and `read_workspace` for any job.
Schema changes are numbered migrations applied in order (SQLite's `PRAGMA user_version`, PostgreSQL's
`schema_version` table, holds the last one). Calls are short transactions, safe from any thread
(jobs/store/connections.py): a server makes them in worker threads through jobs/store/async_store.py, so
the event loop never waits on the database; the CLI calls them directly. State is private: the state
folder and its jobs/ are made 0700 and the database 0600 (SQLite gives its -wal and -shm files the
database's mode), so other users of the machine read nothing of it.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, assert_never

from pydantic import BaseModel, ConfigDict, SecretStr

from conclave.backends.base import Usage
from conclave.coordination.reports import (
    AgentFailedEvent,
    AnswerEvent,
    AnswerRefusedEvent,
    BudgetReachedEvent,
    CheckedEvent,
    CheckStartedEvent,
    DeadlineEvent,
    EventKind,
    FinishedEvent,
    JobEvent,
    JobResult,
    NoDecisionEvent,
    NoteEvent,
    PresentingEvent,
    Progress,
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
    stored_event,
)
from conclave.coordination.tally import Posted
from conclave.jobs.derived import FilesResult, JobOptions
from conclave.jobs.request import JobRequest, stored_request
from conclave.jobs.store.connections import open_connections, private_dir
from conclave.jobs.store.conversations import ConversationRecords
from conclave.jobs.store.dialect import Connection
from conclave.jobs.store.migrations import MIGRATIONS
from conclave.jobs.store.new_job import NewJob
from conclave.jobs.store.owners import QUEUE_OWNER
from conclave.jobs.store.progress_patch import progress_patch
from conclave.jobs.store.shared_files import check_shared_folder
from conclave.settings import Settings

ADD_COLUMN = re.compile(r"\s*ALTER\s+TABLE\s+(\w+)\s+ADD\s+COLUMN\s+(\w+)", re.IGNORECASE)
ACTIVE_STATES = ("queued", "running", "presenting")
JobState = Literal["queued", "running", "presenting", "completed", "failed", "cancelled", "interrupted"]


class JobRow(BaseModel):
    """One job as stored."""

    model_config = ConfigDict(extra="forbid")

    id: str
    task: str
    team_name: str
    team_json: str
    state: JobState
    phase: str
    created_at: float
    started_at: float | None
    finished_at: float | None
    owner_pid: int
    owner_id: str
    heartbeat: float
    lease_until: float | None = None  # the owner holds the job until then (jobs/upkeep/takeover.py)
    owner_host: str | None = None  # the owner's machine: its process id is checked only there
    progress: Progress | None
    result: JobResult | None
    error: str | None
    cancel_requested: bool
    rev: int
    options: JobOptions = JobOptions()
    files: FilesResult | None = None
    follow_up: str | None = None  # the earlier job this one continues
    caller: str = "local"
    request: JobRequest  # as the caller asked (after what a follow-up carries over)


class LinePlace(BaseModel):
    """A queued job's place: its position in its caller's line (1: next), and the jobs running on its
    server, its caller's and all."""

    position: int
    caller_running: int
    running: int


@dataclass(frozen=True)
class ViewRow:
    """A job's row and what its view needs beside it (`Store.view_row`, jobs/read/view_read.py)."""

    row: JobRow
    followed: bool  # a later job continues it (ask_team's follow_up)
    notes: int  # its steering notes
    place: LinePlace | None  # a queued job's place in its caller's line


class StoreSummary(BaseModel):
    """The store at a glance: its jobs, the active ones per state, the callers' lines (queued jobs per
    caller) and the active jobs whose lease ran out."""

    total: int
    states: dict[str, int] = {}
    lines: dict[str, int] = {}
    lapsed: int = 0

    def text(self) -> str:
        active = (
            ", ".join(f"{count} {state}" for state, count in sorted(self.states.items())) or "none active"
        )
        lines = ", ".join(f"{caller} {count}" for caller, count in sorted(self.lines.items()))
        queue = f"; queued per caller: {lines}" if lines else ""
        lapsed = (
            f"; {self.lapsed} with a lease run out (the next server takes them over)" if self.lapsed else ""
        )
        return f"{self.total} jobs, {active}{queue}{lapsed}"


class AnswerRow(Posted):
    """A posted answer as stored (the protocol's `Answer` keeps its order and key instead)."""

    at: float


class AgentUsage(BaseModel):
    """One agent's usage in one finished job (for estimates and team history)."""

    job_id: str
    model: str
    usage: Usage


class Store(ConversationRecords[JobRow]):
    """Typed access to conclave.db, or to the PostgreSQL database in its place."""

    def __init__(self, location: Path | SecretStr) -> None:
        """`location`: the SQLite file (its folder and jobs/ made private), or a PostgreSQL URL."""
        self._clock: Callable[[], float] = time.time  # the times it writes: created, heartbeat, leases
        self.host = socket.gethostname()  # jobs' owners on this machine: their pids can be checked
        self._connections = open_connections(location)
        self.dialect = self._connections.dialect
        self.shown = self._connections.opener.shown  # where it is, in words (password masked)
        # What this process last wrote of each job it runs: the next event's seq and the stored progress,
        # so recording an event neither counts rows nor rewrites the whole progress (only the owner
        # process records a job's events; `record` runs one at a time, inside the write lock).
        self._next_seq: dict[str, int] = {}
        self._stored_progress: dict[str, dict[str, Any]] = {}
        self._migrate()

    @classmethod
    def of(cls, settings: Settings) -> Store:
        """The store the settings name (blocking): CONCLAVE_DATABASE_URL's database, else the SQLite file
        under CONCLAVE_HOME; the state folder and the jobs' folder exist either way, and a database's
        hosts share that folder (jobs/store/shared_files.py)."""
        private_dir(settings.home)
        private_dir(settings.jobs_root)
        store = cls(settings.database)
        if not isinstance(settings.database, Path):
            try:
                check_shared_folder(store.transaction(), settings.jobs_root)
            except BaseException:
                store.close()
                raise
        return store

    @property
    def _db(self) -> Connection:
        """The writer inside a write on this thread, else this thread's own reader."""
        return self._connections.current()

    def close(self) -> None:
        self._connections.close()

    def _migrate(self) -> None:
        with self._write():
            version = self.dialect.schema_version(self._db)
            for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
                for statement in filter(str.strip, script.split(";")):
                    if not self._has_column(statement):
                        self._db.execute(self.dialect.ddl(statement))
                self.dialect.set_schema_version(self._db, number)
            # A column a counted migration should have added but did not (a development build numbered
            # them otherwise): its migration runs again, its other statements being idempotent.
            for script in MIGRATIONS[:version]:
                statements = list(filter(str.strip, script.split(";")))
                if any(ADD_COLUMN.match(s) and not self._has_column(s) for s in statements):
                    for statement in statements:
                        if not self._has_column(statement):
                            self._db.execute(self.dialect.ddl(statement))

    def _has_column(self, statement: str) -> bool:
        """Whether `statement` adds a column the table has already: a database written by a development
        build numbered its migrations differently."""
        found = ADD_COLUMN.match(statement)
        if found is None:
            return False
        table, column = found.groups()
        return column.lower() in {name.lower() for name in self.dialect.columns(self._db, table)}

    def _write(self) -> AbstractContextManager[Connection]:
        return self._connections.write()

    def transaction(self) -> AbstractContextManager[Connection]:
        """One write transaction around several calls (they join it): jobs/store/async_store.py's batches."""
        return self._connections.write()

    def forget(self, job_id: str) -> None:
        """Drop what this process remembers of a job's writes (after a rolled-back batch: read it anew)."""
        self._next_seq.pop(job_id, None)
        self._stored_progress.pop(job_id, None)

    # Jobs ----------------------------------------------------------------------------------------
    def create_job(
        self,
        job: NewJob,
        owner_pid: int,
        owner_id: str,
        *,
        admit: Callable[[dict[str, int]], None] | None = None,
    ) -> None:
        """Store `job`, queued, `owner_id`'s (process `owner_pid`) until a slot or a worker takes it.

        `admit` is called in the write transaction with `owner_id`'s queued jobs per caller, and refuses
        the job by raising: writers take turns (one lock, on every host), so asks sent together, to any
        front, are counted one after the other, never all against the same count."""
        now = self._clock()
        with self._write():
            if admit is not None:
                admit(self.queued_by_caller(owner_id))
            self._db.execute(
                "INSERT INTO jobs (id, task, team_name, team_json, state, phase, created_at, owner_pid, "
                "owner_id, heartbeat, options_json, caller, request_json, follow_up, owner_host)"
                " VALUES (?, ?, ?, ?, 'queued', 'waiting for a free slot', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    job.id,
                    job.task,
                    job.team.name,
                    job.team.model_dump_json(),
                    now,
                    owner_pid,
                    owner_id,
                    now,
                    job.options.model_dump_json(),
                    job.caller,
                    job.request.model_dump_json(),
                    job.follow_up,
                    self.host,
                ),
            )

    def summary(self, now: float) -> StoreSummary:
        """The active jobs as `conclave doctor` shows them: per state, the queued ones per caller, and
        those whose lease ran out at `now` (jobs/upkeep/takeover.py takes them over)."""
        rows = self._db.execute(
            "SELECT state, caller, COALESCE(lease_until, heartbeat) < ? AND owner_id != ? AS lapsed FROM jobs"
            " WHERE state IN (?, ?, ?)",
            (now, QUEUE_OWNER, *ACTIVE_STATES),
        ).fetchall()
        summary = StoreSummary(total=self._db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0])
        for row in rows:
            summary.states[row["state"]] = summary.states.get(row["state"], 0) + 1
            if row["state"] == "queued":
                summary.lines[row["caller"]] = summary.lines.get(row["caller"], 0) + 1
            summary.lapsed += int(row["lapsed"])
        return summary

    def ping(self) -> None:
        """One read of the jobs table: the store answers (jobs/upkeep/readiness.py)."""
        self._db.execute("SELECT COUNT(*) FROM jobs WHERE state = 'queued'").fetchone()

    def set_files(self, job_id: str, files: FilesResult) -> None:
        with self._write():
            self._db.execute(
                "UPDATE jobs SET files_json = ?, rev = rev + 1 WHERE id = ?",
                (files.model_dump_json(), job_id),
            )

    def job(self, job_id: str) -> JobRow | None:
        row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else _job_row(row)

    def recent_jobs(self, limit: int = 20) -> list[JobRow]:
        rows = self._db.execute("SELECT * FROM jobs ORDER BY created_at DESC LIMIT ?", (limit,)).fetchall()
        return [_job_row(row) for row in rows]

    def rev(self, job_id: str) -> int | None:
        row = self._db.execute("SELECT rev FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else int(row[0])

    def changes(self, job_id: str) -> tuple[int, int, str] | None:
        """(rev, events, state): what a watcher compares to see that anything happened; None: no such job."""
        row = self._db.execute(
            "SELECT rev, state, (SELECT COUNT(*) FROM events WHERE job_id = ?) AS events FROM jobs WHERE id "
            "= ?",
            (job_id, job_id),
        ).fetchone()
        return None if row is None else (int(row["rev"]), int(row["events"]), str(row["state"]))

    def set_state(self, job_id: str, state: str, phase: str | None = None, error: str | None = None) -> None:
        now = self._clock()
        final = state not in ACTIVE_STATES
        with self._write():
            self._db.execute(
                "UPDATE jobs SET state = ?, phase = COALESCE(?, phase), error = COALESCE(?, error), rev = "
                "rev + 1,"
                " started_at = CASE WHEN ? = 'running' AND started_at IS NULL THEN ? ELSE started_at END,"
                " finished_at = CASE WHEN ? THEN ? ELSE finished_at END WHERE id = ?",
                (state, phase, error, state, now, final, now, job_id),
            )
        if final:
            self.forget(job_id)

    def request_cancel(self, job_id: str) -> None:
        with self._write():
            self._db.execute("UPDATE jobs SET cancel_requested = 1, rev = rev + 1 WHERE id = ?", (job_id,))

    def cancel_requests(self, owner_id: str) -> list[str]:
        rows = self._db.execute(
            "SELECT id FROM jobs WHERE owner_id = ? AND cancel_requested = 1 AND state IN (?, ?, ?)",
            (owner_id, *ACTIVE_STATES),
        ).fetchall()
        return [row[0] for row in rows]

    def queued_by_caller(self, owner_id: str) -> dict[str, int]:
        """How many of this server's jobs wait for a slot, per caller."""
        rows = self._db.execute(
            "SELECT caller, COUNT(*) FROM jobs WHERE owner_id = ? AND state = 'queued' GROUP BY caller",
            (owner_id,),
        ).fetchall()
        return {str(row[0]): int(row[1]) for row in rows}

    def view_row(self, job_id: str) -> ViewRow | None:
        """The job's row and what its view needs beside it, in one statement (get_status reads it most,
        often on a busy machine, where every round trip to the database waits for a CPU); None: no such
        job. A queued job's place is where it stands in its caller's line on its server
        (jobs/run/fair_share.py), or on the queue, counting what runs on every worker (jobs/queue.py)."""
        row = self._db.execute(
            "SELECT j.*, EXISTS (SELECT 1 FROM jobs f WHERE f.follow_up = j.id) AS followed,"
            " (SELECT COUNT(*) FROM events e WHERE e.job_id = j.id AND e.kind = 'note') AS notes,"
            # CASE: the line is counted for a queued job only
            " CASE WHEN j.state = 'queued' THEN (SELECT COUNT(*) FROM jobs q WHERE q.owner_id = j.owner_id"
            "  AND q.caller = j.caller AND q.state = 'queued' AND (q.created_at < j.created_at"
            "  OR (q.created_at = j.created_at AND q.id <= j.id))) END AS position,"
            " CASE WHEN j.state = 'queued' THEN (SELECT COUNT(*) FROM jobs r WHERE (r.owner_id = j.owner_id"
            "  OR j.owner_id = ?) AND r.caller = j.caller AND r.state IN ('running', 'presenting'))"
            "  END AS caller_running,"
            " CASE WHEN j.state = 'queued' THEN (SELECT COUNT(*) FROM jobs r WHERE (r.owner_id = j.owner_id"
            "  OR j.owner_id = ?) AND r.state IN ('running', 'presenting')) END AS running"
            " FROM jobs j WHERE j.id = ?",
            (QUEUE_OWNER, QUEUE_OWNER, job_id),
        ).fetchone()
        if row is None:
            return None
        values = dict(row)
        followed, notes = bool(values.pop("followed")), int(values.pop("notes"))
        line = {key: values.pop(key) for key in ("position", "caller_running", "running")}
        place = LinePlace(**line) if values["state"] == "queued" else None
        return ViewRow(row=_job_row(values), followed=followed, notes=notes, place=place)

    def finished_jobs(self) -> list[tuple[str, float]]:
        """Every job that is over (not queued, running or presenting), oldest first: (id, finished_at)."""
        rows = self._db.execute(
            "SELECT id, COALESCE(finished_at, created_at) AS at FROM jobs WHERE state NOT IN (?, ?, ?) "
            "ORDER BY at",
            ACTIVE_STATES,
        ).fetchall()
        return [(row["id"], float(row["at"])) for row in rows]

    def delete_job(self, job_id: str) -> None:
        """Forget a finished job: its rows in every table (its folder is the caller's to remove)."""
        with self._write():
            for table in ("events", "answers", "votes", "usage", "protocol_events"):
                self._db.execute(f"DELETE FROM {table} WHERE job_id = ?", (job_id,))
            self._db.execute(
                "DELETE FROM jobs WHERE id = ? AND state NOT IN (?, ?, ?)", (job_id, *ACTIVE_STATES)
            )

    def heartbeat(self, owner_id: str, lease_s: float) -> None:
        """Renew the lease on every active job `owner_id` holds, to `lease_s` from now."""
        now = self._clock()
        with self._write():
            self._db.execute(
                "UPDATE jobs SET heartbeat = ?, lease_until = ? WHERE owner_id = ? AND state IN (?, ?, ?)",
                (now, now + lease_s, owner_id, *ACTIVE_STATES),
            )

    def orphans(self, is_alive: Callable[[int], bool], stale_after_s: float) -> list[tuple[str, str]]:
        """Active jobs whose owner is gone, as (job id, owner id): a lease run out (a row without one:
        its heartbeat older than stale_after_s), or, for an owner on this machine, a dead process."""
        now = self._clock()
        rows = self._db.execute(
            "SELECT id, owner_id, owner_pid, COALESCE(owner_host, ?) AS host,"
            " COALESCE(lease_until, heartbeat + ?) AS until FROM jobs WHERE state IN (?, ?, ?)"
            " AND owner_id != ?",  # a job waiting on the queue has no owner to lose (jobs/queue.py)
            (self.host, stale_after_s, *ACTIVE_STATES, QUEUE_OWNER),
        ).fetchall()
        return [
            (row["id"], row["owner_id"])
            for row in rows
            if row["until"] < now or (row["host"] == self.host and not is_alive(row["owner_pid"]))
        ]

    def lost(self, owner_id: str, job_ids: list[str]) -> list[str]:
        """Which of `job_ids` (jobs `owner_id` runs) another server has claimed since
        (jobs/upkeep/takeover.py)."""
        if not job_ids:  # `IN ()` is no SQL
            return []
        marks = ", ".join("?" * len(job_ids))
        rows = self._db.execute(
            f"SELECT id FROM jobs WHERE id IN ({marks}) AND owner_id != ?", (*job_ids, owner_id)
        ).fetchall()
        return [str(row[0]) for row in rows]

    def claim(self, job_id: str, old_owner: str, owner_id: str, owner_pid: int, lease_s: float) -> bool:
        """Take over an orphaned job: whether this owner got it (another process may have first)."""
        now = self._clock()
        with self._write():
            taken = self._db.execute(
                "UPDATE jobs SET owner_id = ?, owner_pid = ?, owner_host = ?, heartbeat = ?, lease_until = ?,"
                " rev = rev + 1 WHERE id = ? AND owner_id = ? AND state IN (?, ?, ?) RETURNING id",
                (owner_id, owner_pid, self.host, now, now + lease_s, job_id, old_owner, *ACTIVE_STATES),
            ).fetchall()  # the rows it changed: a count PostgreSQL's pipelined writes also give back
        self.forget(job_id)
        return len(taken) == 1

    def take_queued(
        self, owner_id: str, owner_pid: int, lease_s: float, busy: dict[str, int], per_caller: int
    ) -> str | None:
        """Take the next job waiting on the queue for the worker `owner_id` (jobs/worker.py), fairly: the
        oldest job of the caller that runs the fewest jobs on every worker (among equals, the caller
        whose oldest job waits longest), skipping callers that run `per_caller` jobs on this worker
        (`busy`). None when no job waits that this worker may take. One write transaction, so two
        workers never take the same job."""
        now = self._clock()
        with self._write():
            waiting = self._db.execute(
                "SELECT id, caller FROM jobs WHERE owner_id = ? AND state = 'queued' ORDER BY created_at, id",
                (QUEUE_OWNER,),
            ).fetchall()
            oldest: dict[str, str] = {}
            for row in waiting:
                if busy.get(row["caller"], 0) < per_caller:
                    oldest.setdefault(row["caller"], row["id"])
            if not oldest:
                return None
            running = self.running_by_caller()
            order = list(oldest)  # callers by their oldest job's age
            caller = min(order, key=lambda c: (running.get(c, 0), order.index(c)))
            self._db.execute(
                "UPDATE jobs SET owner_id = ?, owner_pid = ?, owner_host = ?, heartbeat = ?, lease_until = ?,"
                " rev = rev + 1 WHERE id = ? AND owner_id = ? AND state = 'queued'",
                (owner_id, owner_pid, self.host, now, now + lease_s, oldest[caller], QUEUE_OWNER),
            )
        return oldest[caller]

    def running_by_caller(self) -> dict[str, int]:
        """How many jobs each caller has started and not finished, on every worker."""
        rows = self._db.execute(
            "SELECT caller, COUNT(*) FROM jobs WHERE owner_id != ? AND state IN (?, ?, ?) GROUP BY caller",
            (QUEUE_OWNER, *ACTIVE_STATES),
        ).fetchall()
        return {str(row[0]): int(row[1]) for row in rows}

    def running_by_owner(self) -> dict[str, int]:
        """How many active jobs each owner (a server, a worker) holds: `conclave doctor`'s workers."""
        rows = self._db.execute(
            "SELECT owner_id, COUNT(*) FROM jobs WHERE state IN (?, ?, ?) GROUP BY owner_id", ACTIVE_STATES
        ).fetchall()
        return {str(row[0]): int(row[1]) for row in rows}

    def cancel_queued(self, job_id: str, phase: str = "cancelled by the caller") -> bool:
        """End a job still waiting on the queue `cancelled`: whether it was (no worker had taken it)."""
        now = self._clock()
        with self._write():
            ended = self._db.execute(
                "UPDATE jobs SET state = 'cancelled', phase = ?, rev = rev + 1,"
                " finished_at = ? WHERE id = ? AND owner_id = ? AND state = 'queued' RETURNING id",
                (phase, now, job_id, QUEUE_OWNER),
            ).fetchall()
        self.forget(job_id)
        return len(ended) == 1

    def journal(self, job_id: str, event_json: str) -> None:
        """Append one protocol event to the job's journal (coordination/journal.py)."""
        with self._write():
            self._db.execute(
                "INSERT INTO protocol_events (job_id, seq, event_json) VALUES (?,"
                " (SELECT COALESCE(MAX(seq) + 1, 0) FROM protocol_events WHERE job_id = ?), ?)",
                (job_id, job_id, event_json),
            )

    def journaled(self, job_id: str) -> list[str]:
        """The job's journal, oldest first."""
        rows = self._db.execute(
            "SELECT event_json FROM protocol_events WHERE job_id = ? ORDER BY seq", (job_id,)
        ).fetchall()
        return [str(row[0]) for row in rows]

    # What a running job reports ------------------------------------------------------------------
    def record(self, job_id: str, event: JobEvent, progress: Progress, phase: str | None) -> None:
        """Store one event with the progress right after it, and what it adds to the other tables."""
        now = self._clock()
        result: str | None = None
        with self._write():
            seq = self._seq(job_id)
            self._db.execute(
                "INSERT INTO events (job_id, seq, at, kind, letter, data_json) VALUES (?, ?, ?, ?, ?, ?)",
                (job_id, seq, event.at, event.kind, event.letter, event.payload_json()),
            )
            match event:
                case AnswerEvent():
                    self._db.execute(
                        "INSERT INTO answers (job_id, label, letter, revision, content, at) VALUES (?, ?, ?,"
                        " ?, ?, ?)",
                        (job_id, event.label, event.letter, event.revision, event.content, now),
                    )
                case VoteEvent() | VoteDiscardedEvent():
                    self._db.execute(
                        "INSERT INTO votes (job_id, seq, voter, label, reason, valid, at) VALUES (?, ?, ?, ?,"
                        " ?, ?, ?)",
                        # valid: an INTEGER column, as PostgreSQL takes no bool there
                        (
                            job_id,
                            seq,
                            event.letter,
                            event.label,
                            event.reason,
                            int(event.kind == "vote"),
                            now,
                        ),
                    )
                case UsageEvent():
                    self._usage(job_id, event)
                case FinishedEvent():
                    result = event.result.model_dump_json()
                case (
                    StartedEvent()
                    | ResumedEvent()
                    | TurnStartedEvent()
                    | TurnCancelledEvent()
                    | ToolCallEvent()
                    | SnapshotFailedEvent()
                    | NoDecisionEvent()
                    | TurnFailedEvent()
                    | AnswerRefusedEvent()
                    | AgentFailedEvent()
                    | CheckStartedEvent()
                    | CheckedEvent()
                    | VerifyBlockedEvent()
                    | BudgetReachedEvent()
                    | DeadlineEvent()
                    | PresentingEvent()
                    | NoteEvent()
                    | SteeredEvent()
                ):
                    pass  # the events table alone holds them
                case _:
                    assert_never(event)
            stored = progress.model_dump(mode="json")
            column, values = self._progress_sql(job_id, stored)
            self._db.execute(
                f"UPDATE jobs SET progress_json = {column}, phase = COALESCE(?, phase),"
                " result_json = COALESCE(?, result_json), rev = rev + CASE WHEN ? IS NULL THEN 0 ELSE 1 END"
                " WHERE id = ?",
                (*values, phase, result, phase, job_id),
            )
        self._next_seq[job_id], self._stored_progress[job_id] = seq + 1, stored
        if event.kind == "finished":
            self.forget(job_id)

    def _usage(self, job_id: str, event: UsageEvent) -> None:
        """The member's usage so far, as its latest charge's event says it (one row per member)."""
        u = event.total
        self._db.execute(
            "INSERT INTO usage (job_id, letter, model, calls, input_tokens, output_tokens,"
            " cached_input_tokens, cost_usd, uncosted_tokens, estimated_input_tokens)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (job_id, letter) DO UPDATE SET model = excluded.model,"
            " calls = excluded.calls, input_tokens = excluded.input_tokens,"
            " output_tokens = excluded.output_tokens,"
            " cached_input_tokens = excluded.cached_input_tokens,"
            " cost_usd = excluded.cost_usd, uncosted_tokens = excluded.uncosted_tokens,"
            " estimated_input_tokens = excluded.estimated_input_tokens",
            (
                job_id,
                event.letter,
                event.model,
                u.calls,
                u.input_tokens,
                u.output_tokens,
                u.cached_input_tokens,
                u.cost_usd,
                u.uncosted_tokens,
                u.estimated_input_tokens,
            ),
        )

    def _seq(self, job_id: str) -> int:
        """The job's next event number: remembered, or read once from the primary key's index."""
        if job_id not in self._next_seq:
            row = self._db.execute("SELECT MAX(seq) FROM events WHERE job_id = ?", (job_id,)).fetchone()
            self._next_seq[job_id] = 0 if row[0] is None else int(row[0]) + 1
        return self._next_seq[job_id]

    def _progress_sql(self, job_id: str, new: dict[str, Any]) -> tuple[str, list[str]]:
        """SQL for the new progress: only what changed since this process last stored it, else all of it."""
        old = self._stored_progress.get(job_id)
        patch = None if old is None else progress_patch(old, new)
        if patch is None:
            return "?", [json.dumps(new)]
        if not patch:
            return "progress_json", []
        return self.dialect.json_set("progress_json", patch)

    # Reading -------------------------------------------------------------------------------------
    def events(self, job_id: str, kind: EventKind | None = None) -> list[JobEvent]:
        """The job's events in order; with `kind`, only those."""
        rows = self._db.execute(
            "SELECT at, kind, letter, data_json FROM events WHERE job_id = ? AND (? IS NULL OR kind = ?) "
            "ORDER BY seq",
            (job_id, kind, kind),
        ).fetchall()
        return [stored_event(r["kind"], r["letter"], r["at"], json.loads(r["data_json"])) for r in rows]

    def team_usage(self, team_name: str, limit: int = 20) -> list[list[AgentUsage]]:
        """Per agent, the usage of the last `limit` completed jobs of team `team_name`, newest job first."""
        rows = self._db.execute(
            "SELECT u.job_id, u.model, u.calls, u.input_tokens, u.output_tokens, u.cached_input_tokens,"
            " u.cost_usd, u.uncosted_tokens, u.estimated_input_tokens"
            " FROM usage u JOIN jobs j ON j.id = u.job_id"
            " WHERE u.job_id IN (SELECT id FROM jobs"
            " WHERE team_name = ? AND state = 'completed' ORDER BY created_at DESC LIMIT ?)"
            " ORDER BY j.created_at DESC, u.letter",
            (team_name, limit),
        ).fetchall()
        jobs: dict[str, list[AgentUsage]] = {}
        for row in rows:
            fields = dict(row)
            job_id, model = fields.pop("job_id"), fields.pop("model")
            jobs.setdefault(job_id, []).append(AgentUsage(job_id=job_id, model=model, usage=Usage(**fields)))
        return list(jobs.values())

    def answers(self, job_id: str) -> list[AnswerRow]:
        rows = self._db.execute(
            "SELECT label, letter, revision, content, at FROM answers WHERE job_id = ? ORDER BY at, label",
            (job_id,),
        ).fetchall()
        return [AnswerRow(**dict(row)) for row in rows]


def _job_row(row: Any) -> JobRow:
    values = dict(row)
    progress, result = values.pop("progress_json"), values.pop("result_json")
    options, files = values.pop("options_json"), values.pop("files_json")
    request = values.pop("request_json")
    return JobRow(
        **values,
        request=JobRequest.model_validate_json(request)
        if request
        else stored_request(values["task"], options, values["follow_up"]),
        progress=Progress.model_validate_json(progress) if progress else None,
        result=JobResult.model_validate_json(result) if result else None,
        options=JobOptions.stored(options),
        files=FilesResult.model_validate_json(files) if files else None,
    )
