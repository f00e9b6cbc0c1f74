"""A real PostgreSQL for the store's tests: Debian's server binaries (.ci/test-env.sh installs
`postgresql`), a throwaway cluster per test session in a folder of its own under /tmp, reached only
through a unix socket there (no port shared with anything else on the machine), and a fresh schema per
test, so every test starts from an empty store as it does with its own SQLite file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

PORT = 7790  # only names the socket file in the cluster's own folder: no TCP listener
SUPERUSER = "postgres"


def binaries() -> Path | None:
    """The newest installed server's bin folder, or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    return found[-1].parent if found else None


def missing() -> str | None:
    """Why no PostgreSQL can run here, or None."""
    if binaries() is None:
        return "PostgreSQL's server is not installed: apt-get install -y postgresql (.ci/test-env.sh does it)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "initdb refuses root and runuser is missing to run it as the postgres user"
    return None


@dataclass(frozen=True)
class Cluster:
    """A running throwaway cluster: its socket folder."""

    socket_dir: Path

    def url(self, schema: str | None = None) -> SecretStr:
        """A URL to its `postgres` database; with `schema`, every connection's search_path is that schema."""
        options = f"&options=-csearch_path%3D{schema}" if schema else ""
        return SecretStr(f"postgresql://{SUPERUSER}@/postgres?host={self.socket_dir}&port={PORT}{options}")

    def sql(self, statement: str) -> None:
        import psycopg

        with psycopg.connect(self.url().get_secret_value(), autocommit=True) as db:
            db.execute(statement)

    @contextmanager
    def schema(self) -> Iterator[SecretStr]:
        """A fresh schema for one test, dropped after it."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        self.sql(f"CREATE SCHEMA {name}")
        try:
            yield self.url(name)
        finally:
            self.sql(f"DROP SCHEMA {name} CASCADE")


@contextmanager
def cluster(fsync: bool = False) -> Iterator[Cluster]:
    """initdb (about half a second), start, yield, stop, remove. As root, it runs as the postgres user.
    Without `fsync` (tests) nothing waits for the disk; a bench keeps it, as a real server does."""
    bin_dir = binaries()
    assert bin_dir is not None, missing()
    folder = Path(tempfile.mkdtemp(prefix="pg-test-", dir="/tmp"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(folder, SUPERUSER)
        as_user = ["runuser", "-u", SUPERUSER, "--"]
    data = folder / "data"
    options = f"-p {PORT} -k {folder} -c listen_addresses='' -c fsync={'on' if fsync else 'off'}"
    options += " -c max_connections=200"
    run = [*as_user, str(bin_dir / "pg_ctl"), "-D", str(data)]
    try:
        subprocess.run(
            [*as_user, str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", SUPERUSER, "--no-sync"],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [*run, "-o", options, "-l", str(folder / "log"), "-w", "start"], check=True, capture_output=True
        )
        yield Cluster(folder)
    finally:
        subprocess.run([*run, "-m", "immediate", "-w", "stop"], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
