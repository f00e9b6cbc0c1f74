"""The job store's connections: one writer, used one transaction at a time, and one reader per thread,
so the store's methods may run in any worker thread (jobs/store/async_store.py puts them there). The
database is the SQLite file under CONCLAVE_HOME, or PostgreSQL when CONCLAVE_DATABASE_URL names one
(jobs/store/postgres.py opens those connections); `open_connections` picks, and the rest is the same.

SQLite: WAL mode lets readers go on while a write is open, and never makes them wait for it; only
writers queue, on `BEGIN IMMEDIATE` across processes and on the lock here within one.
`synchronous=NORMAL` is WAL's recommended setting: a commit is not fsynced, so a power cut may lose the
last transactions, never corrupt the file (https://sqlite.org/pragma.html#pragma_synchronous); the store
holds a job's report, not the caller's files. PostgreSQL's readers never wait for a writer either
(MVCC), and its writers queue on one advisory lock, taken first in every write transaction: the same one
writer at a time as SQLite's, across every host that shares the database.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Protocol

from pydantic import SecretStr

from conclave.jobs.store.dialect import Connection, Dialect, SqliteDialect

BUSY_TIMEOUT_MS = 10_000  # another process's write: in a worker thread, so the event loop never waits on it


class Opener(Protocol):
    """How one database's connections are made and its write transactions begun."""

    dialect: Dialect
    begin: tuple[str, ...]  # the statements that open a write transaction, one writer at a time
    shown: str  # the database in words, its password masked (`conclave doctor`)

    def connect(self) -> Connection: ...

    def usable(self, db: Connection) -> bool:
        """False once the connection is lost (a restarted server): a new one is made in its place."""
        ...

    def batch(self, db: Connection) -> AbstractContextManager[object]:
        """Around a write transaction's statements and its COMMIT: PostgreSQL sends them without waiting
        for each answer (a batch of 16 jobs' events is one round trip, not 50)."""
        ...


class Connections:
    """The writer connection behind a lock, and a reader connection per thread (closed after its thread)."""

    def __init__(self, opener: Opener) -> None:
        self.opener = opener
        self.dialect = opener.dialect
        self._lock = threading.RLock()  # the writer's: held for a whole write transaction
        self._readers_lock = threading.Lock()  # never the writer's, so a new reader never waits for a write
        self._local = threading.local()
        self._readers: list[tuple[threading.Thread, Connection]] = []
        self._writer = opener.connect()

    def current(self) -> Connection:
        """The writer inside a write on this thread (so a write reads its own changes), else this thread's
        reader."""
        if getattr(self._local, "writing", 0):
            return self._writer
        reader: Connection | None = getattr(self._local, "reader", None)
        if reader is not None and not self.opener.usable(reader):
            reader = None
        if reader is None:
            reader = self._local.reader = self.opener.connect()
            with self._readers_lock:  # worker threads come and go: close the readers of those that ended
                for _, gone in [pair for pair in self._readers if not pair[0].is_alive()]:
                    gone.close()
                self._readers = [pair for pair in self._readers if pair[0].is_alive()]
                self._readers.append((threading.current_thread(), reader))
        return reader

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """BEGIN ... COMMIT on the writer, so processes and threads serialize their writes."""
        with self._lock:
            depth = getattr(self._local, "writing", 0)
            self._local.writing = depth + 1
            try:
                if depth:  # a write inside a write joins it
                    yield self._writer
                    return
                try:
                    self._begin()
                    with self.opener.batch(self._writer):
                        yield self._writer
                        self._writer.execute("COMMIT")
                except BaseException:
                    if self._writer.in_transaction:  # the body or the COMMIT failed: leave nothing open
                        self._writer.execute("ROLLBACK")
                    raise
            finally:
                self._local.writing = depth

    def _begin(self) -> None:
        """Open a write transaction; on a connection found lost (nothing sent yet), on a new one."""
        try:
            if self.opener.usable(self._writer):
                for statement in self.opener.begin:
                    self._writer.execute(statement)
                return
        except Exception:
            if self.opener.usable(self._writer):
                raise
        self._writer.close()
        self._writer = self.opener.connect()
        for statement in self.opener.begin:
            self._writer.execute(statement)

    def close(self) -> None:
        with self._lock, self._readers_lock:
            for _, reader in self._readers:
                reader.close()
            self._writer.close()


def open_connections(location: Path | SecretStr) -> Connections:
    """The store's connections: the SQLite file at `location`, or the PostgreSQL database its URL names."""
    if isinstance(location, Path):
        return Connections(SqliteOpener(location))
    from conclave.jobs.store.postgres import PostgresOpener  # psycopg only where PostgreSQL is asked for

    return Connections(PostgresOpener(location))


class SqliteOpener:
    """The SQLite file: made private (0600 in a 0700 folder with its jobs/ beside it), in WAL mode."""

    dialect: Dialect = SqliteDialect()
    begin: tuple[str, ...] = ("BEGIN IMMEDIATE",)

    def __init__(self, path: Path) -> None:
        private_dir(path.parent)
        private_dir(path.parent / "jobs")
        if not path.exists():  # created 0600; an open file is never opened and closed here, as closing any
            # descriptor of it would drop the POSIX locks SQLite's connections in this process hold on it
            with contextlib.suppress(FileExistsError):
                os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        tighten(path, 0o600)
        self.path = path
        self.shown = f"the SQLite file {path}"
        first = self.connect()
        try:
            first.execute("PRAGMA journal_mode=WAL")  # kept in the file: every later connection has it
        finally:
            first.close()

    def connect(self) -> Connection:
        db = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
        )
        db.row_factory = sqlite3.Row
        db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    def usable(self, db: Connection) -> bool:
        return True  # a file: nothing to lose

    def batch(self, db: Connection) -> AbstractContextManager[object]:
        return nullcontext()  # in-process: no round trips to save


def private_dir(path: Path) -> None:
    """Make `path` (and missing parents) with mode 0700; an existing one of ours loses group/other access."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    tighten(path, 0o700)


def tighten(path: Path, mode: int) -> None:
    info = os.stat(path)
    if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, stat.S_IMODE(info.st_mode) & mode)
