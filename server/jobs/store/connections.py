"""SQLite connections for the job store: one writer, used one transaction at a time, and one reader per
thread, so the store's methods may run in any worker thread (jobs/store/async_store.py puts them there).

WAL mode lets readers go on while a write is open, and never makes them wait for it; only writers
queue, on `BEGIN IMMEDIATE` across processes and on the lock here within one. `synchronous=NORMAL`
is WAL's recommended setting: a commit is not fsynced, so a power cut may lose the last transactions,
never corrupt the file (https://sqlite.org/pragma.html#pragma_synchronous); the store holds a job's
report, not the caller's files.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BUSY_TIMEOUT_MS = 10_000  # another process's write: in a worker thread, so the event loop never waits on it


class Connections:
    """The writer connection behind a lock, and a reader connection per thread (closed after its thread)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.RLock()  # the writer's: held for a whole write transaction
        self._readers_lock = threading.Lock()  # never the writer's, so a new reader never waits for a write
        self._local = threading.local()
        self._readers: list[tuple[threading.Thread, sqlite3.Connection]] = []
        self._writer = _connect(path)
        self._writer.execute("PRAGMA journal_mode=WAL")

    def current(self) -> sqlite3.Connection:
        """The writer inside a write on this thread (so a write reads its own changes), else this thread's
        reader."""
        if getattr(self._local, "writing", 0):
            return self._writer
        reader: sqlite3.Connection | None = getattr(self._local, "reader", None)
        if reader is None:
            reader = self._local.reader = _connect(self.path)
            with self._readers_lock:  # worker threads come and go: close the readers of those that ended
                for _, gone in [pair for pair in self._readers if not pair[0].is_alive()]:
                    gone.close()
                self._readers = [pair for pair in self._readers if pair[0].is_alive()]
                self._readers.append((threading.current_thread(), reader))
        return reader

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT on the writer, so processes and threads serialize their writes."""
        with self._lock:
            depth = getattr(self._local, "writing", 0)
            self._local.writing = depth + 1
            try:
                if depth:  # a write inside a write joins it
                    yield self._writer
                    return
                self._writer.execute("BEGIN IMMEDIATE")
                try:
                    yield self._writer
                    self._writer.execute("COMMIT")
                except BaseException:
                    if self._writer.in_transaction:  # the body or the COMMIT failed: leave nothing open
                        self._writer.execute("ROLLBACK")
                    raise
            finally:
                self._local.writing = depth

    def close(self) -> None:
        with self._lock, self._readers_lock:
            for _, reader in self._readers:
                reader.close()
            self._writer.close()


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
    db.row_factory = sqlite3.Row
    db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    db.execute("PRAGMA synchronous=NORMAL")
    return db


def private_dir(path: Path) -> None:
    """Make `path` (and missing parents) with mode 0700; an existing one of ours loses group/other access."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    tighten(path, 0o700)


def tighten(path: Path, mode: int) -> None:
    info = os.stat(path)
    if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, stat.S_IMODE(info.st_mode) & mode)
