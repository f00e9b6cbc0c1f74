"""Where a job's files are when hosts share one PostgreSQL store: in one folder every host mounts.

The files a caller reads back (answers' snapshots, the final tree, the diff) are trees, read through the
one safe walk (files/safe.py), mounted into containers and pruned by folder; a database would hold a
second copy of each tree and serve it through code of its own. So they stay files, and the hosts share
the folder (CONCLAVE_JOBS_DIR, else CONCLAVE_HOME/jobs: NFS, a Kubernetes ReadWriteMany volume, a bind
mount), each mounting it wherever it likes: a job's folder is found by its id under that root.

A host that opened the database without the folder would answer `read_workspace` from an empty folder,
or write a job's files where no other host finds them. So the database and the folder name each other:
the first host writes a random id to both (the `store_identity` table and `<jobs>/.store-id`); a host
whose folder lacks the id or holds another database's is refused, with the fix. The SQLite file is one
host's by nature and needs no such check.
"""

from __future__ import annotations

import os
import secrets
from contextlib import AbstractContextManager
from pathlib import Path

from conclave.errors import StoreUnavailable
from conclave.jobs.store.dialect import Connection

MARKER = ".store-id"
SETTING = "CONCLAVE_JOBS_DIR"


def check_shared_folder(transaction: AbstractContextManager[Connection], folder: Path) -> None:
    """Refuse `folder` unless it is the one the database's other hosts use (blocking; the first host's
    folder becomes that one)."""
    marker = folder / MARKER
    held = _read(marker)
    with transaction as db:
        db.execute("CREATE TABLE IF NOT EXISTS store_identity (id TEXT NOT NULL)")
        row = db.execute("SELECT id FROM store_identity").fetchone()
        if row is None and held is None:
            identity = secrets.token_hex(16)
            db.execute("INSERT INTO store_identity (id) VALUES (?)", (identity,))
            _write(marker, identity)  # inside the transaction: a failed write leaves the table empty too
            return
    if row is None:
        raise StoreUnavailable(
            SETTING,
            str(folder),
            f"its {MARKER} ({held}) names another database, and this one has none yet; give this database"
            f" a folder of its own, or remove {marker} if that database's jobs there are no longer needed",
        )
    identity = str(row[0])
    if held != identity:
        why = f"it lacks {MARKER}" if held is None else f"its {MARKER} ({held}) names another database"
        raise StoreUnavailable(
            SETTING,
            str(folder),
            f"{why}: the other hosts of this database keep their jobs' files elsewhere; mount there the"
            f" folder they share (its {MARKER} reads {identity}), or, if this is that folder emptied on"
            f" purpose, write {identity} to {marker}",
        )


def _read(marker: Path) -> str | None:
    try:
        return marker.read_text().strip() or None
    except FileNotFoundError:
        return None


def _write(marker: Path, identity: str) -> None:
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(identity + "\n")
