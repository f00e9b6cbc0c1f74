"""PostgreSQL connections for the job store, when CONCLAVE_DATABASE_URL names a database (psycopg 3, the
`postgres` extra): the same shape as the SQLite ones (jobs/store/connections.py), so the Store's SQL runs
on either.

Every statement goes through `PostgresDialect.statement` (jobs/store/dialect.py) on its way in, and rows
come back readable by index and by column name, as sqlite3's do. Connections are in autocommit mode: a
read is its own snapshot, as an SQLite reader outside a transaction; a write transaction is opened by
`BEGIN` and one advisory lock per schema, so writers take turns as they do on SQLite's file, and its
statements are sent in pipeline mode (one round trip for a batch, not one per statement). psycopg's
client-side binding puts the values into the statement's text, so a parameter is typed by where it
stands (`? IS NULL`, a CASE), as SQLite does, not by what the server would infer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from pydantic import SecretStr

from conclave.errors import StoreUnavailable
from conclave.jobs.store.dialect import Connection, Cursor, Dialect, PostgresDialect

SETTING = "CONCLAVE_DATABASE_URL"
CONNECT_TIMEOUT_S = 10
LOCK_TIMEOUT_MS = 10_000  # another writer's turn, waited in a worker thread: SQLite's busy timeout too
_PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*@|(password=)[^&\s]*")


class Row(tuple[Any, ...]):
    """A row read by index (`row[0]`) or by column name (`row["id"]`), and `dict(row)`, like sqlite3.Row."""

    _names: dict[str, int]

    def __new__(cls, values: Sequence[Any], names: dict[str, int]) -> Row:
        row = super().__new__(cls, values)
        row._names = names
        return row

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._names[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


class PostgresConnection:
    """A psycopg connection that speaks the store's SQL (`?` placeholders, SQLite's words)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def execute(self, sql: str, parameters: Any = (), /) -> Cursor:
        cursor: Cursor = self.raw.execute(PostgresDialect.statement(sql), tuple(parameters))
        return cursor

    @property
    def in_transaction(self) -> bool:
        # in one, or in a failed one; not IDLE, nor UNKNOWN (a lost connection: nothing to roll back)
        return str(self.raw.info.transaction_status.name) in ("ACTIVE", "INTRANS", "INERROR")

    def close(self) -> None:
        self.raw.close()


class PostgresOpener:
    """The database a URL names; refuses at once, naming the setting, when it cannot be reached."""

    dialect: Dialect = PostgresDialect()
    # hashtext(current_schema()): one writer at a time per schema, so stores in other schemas of the same
    # database (a test's, another deployment's) do not wait for each other
    # (one statement string, one round trip: client-side binding sends it as a simple query)
    begin: tuple[str, ...] = ("BEGIN; SELECT pg_advisory_xact_lock(hashtext(current_schema()))",)

    def __init__(self, url: SecretStr) -> None:
        self._url = url
        self.shown = f"PostgreSQL at {shown_url(url)}"
        scheme = url.get_secret_value().partition("://")[0]
        if scheme not in ("postgresql", "postgres"):
            raise StoreUnavailable(
                SETTING,
                shown_url(url),
                f"it names a {scheme!r} database; give a PostgreSQL URL,"
                " postgresql://USER:PASSWORD@HOST:PORT/DATABASE, or unset it to keep the store in the SQLite"
                " file under CONCLAVE_HOME",
            )
        try:
            import psycopg
        except ImportError as exc:
            raise StoreUnavailable(
                SETTING,
                shown_url(url),
                "it names PostgreSQL, whose driver is not installed: pip install 'conclave-mcp[postgres]'"
                f" (psycopg 3), or unset {SETTING} to keep the store in the SQLite file under CONCLAVE_HOME",
            ) from exc
        self._psycopg = psycopg
        self.connect().close()  # reachable now, or a clear error now rather than at the first job

    def connect(self) -> Connection:
        psycopg = self._psycopg
        try:
            raw = psycopg.connect(
                self._url.get_secret_value(),
                autocommit=True,
                cursor_factory=psycopg.ClientCursor,
                row_factory=_rows,
                connect_timeout=CONNECT_TIMEOUT_S,
            )
        except psycopg.Error as exc:
            raise StoreUnavailable(
                SETTING,
                shown_url(self._url),
                f"PostgreSQL could not be reached there ({_first_line(exc)}); check that the server runs and"
                " that the URL's host, port, user, password and database are right"
                f" (postgresql://USER:PASSWORD@HOST:PORT/DATABASE), or unset {SETTING} to use the SQLite"
                " file under CONCLAVE_HOME",
            ) from exc
        raw.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")
        # SQLite's synchronous=NORMAL (connections.py): a crash may lose the last commits, never corrupt
        raw.execute("SET synchronous_commit = off")
        return PostgresConnection(raw)

    def batch(self, db: Connection) -> AbstractContextManager[object]:
        """psycopg's pipeline mode: statements go out at once, a read (`fetchone`) or the end waits for
        the answers, and an error is raised there, failing the transaction as it would have at once."""
        assert isinstance(db, PostgresConnection)
        pipeline: AbstractContextManager[object] = db.raw.pipeline()
        return pipeline

    def usable(self, db: Connection) -> bool:
        raw = db.raw if isinstance(db, PostgresConnection) else None
        return raw is not None and not raw.closed and not raw.broken


def _rows(cursor: Any) -> Callable[[Sequence[Any]], Row]:
    """psycopg's row factory: each row as a `Row` over the statement's column names."""
    names = {column.name: index for index, column in enumerate(cursor.description or ())}
    return lambda values: Row(values, names)


def shown_url(url: SecretStr) -> str:
    """The URL with its password masked, for messages."""
    return _PASSWORD.sub(_masked, url.get_secret_value())


def _masked(found: re.Match[str]) -> str:
    if found.group(1):
        return f"{found.group(1)}***@"
    return f"{found.group(2)}***"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
