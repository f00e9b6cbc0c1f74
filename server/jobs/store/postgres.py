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
from urllib.parse import unquote

from pydantic import SecretStr

from conclave.errors import StoreUnavailable
from conclave.jobs.store.dialect import Connection, Cursor, Dialect, PostgresDialect

SETTING = "CONCLAVE_DATABASE_URL"
CONNECT_TIMEOUT_S = 10
LOCK_TIMEOUT_MS = 10_000  # another writer's turn, waited in a worker thread: SQLite's busy timeout too
# A password given as a keyword (libpq's `password = 'x'`) or a query parameter (`?password=x`): quoted
# (with its escapes) or up to the next space (a keyword string) or `&` (a URL's query).
_KEYWORD = re.compile(r"(?i)\bpassword\s*=\s*('(?:[^'\\]|\\.)*'?|[^\s&#]*)")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/*")
MASK = "***"
MIN_PIECE = 3  # a password's pieces (between the `@` and `:` a driver may cut it at) this long are masked


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
        scheme = scheme_of(url)
        if scheme not in ("postgresql", "postgres"):
            named = f"it names a {scheme!r} database" if scheme else "it is not a URL (no scheme://)"
            raise StoreUnavailable(
                SETTING,
                shown_url(url),
                f"{named}; give a PostgreSQL URL,"
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
                f"PostgreSQL could not be reached there ({scrubbed(_first_line(exc), self._url)}); check that"
                " the server runs and"
                " that the URL's host, port, user, password and database are right"
                f" (postgresql://USER:PASSWORD@HOST:PORT/DATABASE), or unset {SETTING} to use the SQLite"
                " file under CONCLAVE_HOME",
            ) from None  # the driver's error may quote the password (a bad % escape): shown above, masked
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
    return scrubbed(url.get_secret_value(), url)


def scheme_of(url: SecretStr) -> str:
    """The URL's scheme (`postgresql`), or "" for a value that has none (`host=x password=y`)."""
    value = url.get_secret_value()
    return value.partition("://")[0] if "://" in value else ""


def scrubbed(text: str, url: SecretStr) -> str:
    """`text` (the URL itself, or a driver's error about it) with every password the URL holds masked:
    each as written, percent-decoded, and in the pieces a driver that read the URL otherwise (a stray
    `@`, a bad `%` escape) may show."""
    for secret in sorted(passwords(url.get_secret_value()), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def passwords(value: str) -> set[str]:
    """Whatever in a database or queue URL may be a password: keyword and query values (`password=`),
    and the userinfo's after its first `:` up to the authority's last `@`, with or without a scheme."""
    found: list[str] = []
    for match in _KEYWORD.finditer(value):
        given = match.group(1)
        found.append(given)
        if given.startswith("'"):
            found.append(re.sub(r"\\(.)", r"\1", given.strip("'")))
    scheme = _SCHEME.match(value)
    # without `://`, `name:` may be a scheme (`redis:/x`) or a user (`user:password@host`): read it both ways
    rests = [value[scheme.end() :]] if scheme else []
    if "://" not in value:
        rests.append(value)
    for rest in rests:
        authority = rest.split("?", 1)[0].split("#", 1)[0]
        if "@" in authority:
            _user, colon, secret = authority[: authority.rfind("@")].partition(":")
            found.append(secret if colon else "")
    secrets = set()
    for secret in found:
        for form in (secret, unquote(secret)):
            secrets.add(form)
            secrets.update(piece for piece in re.split(r"[@:'\s]", form) if len(piece) >= MIN_PIECE)
    return {secret for secret in secrets if secret}


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
