"""A database or queue URL's password is in no error message, whatever shape the URL has: a libpq
keyword string (`host=x password=secret`, spaces around `=` or not, a quoted value), a bad `%` escape, a
stray `@` in the password, a Redis URL without its scheme. Before: each of these showed the password, or
part of it, in the error that names the setting (jobs/store/postgres.py, jobs/queue.py)."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from conclave.errors import QueueUnavailable, StoreUnavailable
from conclave.jobs.queue import JobQueue
from conclave.jobs.store.postgres import PostgresOpener

pytestmark = pytest.mark.anyio
SECRET = "hunter2secret"  # every password below holds it, or pieces of it
PIECES = ("hunter2", "2secret", "hunter", "secret")

DATABASE_URLS = [
    f"host=127.0.0.1 port=1 user=conclave password={SECRET} dbname=jobs",
    f"host=127.0.0.1 port=1 user=conclave password = {SECRET} dbname=jobs",
    f"host=127.0.0.1 port=1 password= {SECRET}",
    "password='hunter2 secret' host=127.0.0.1 port=1",
    "password = 'hunter2 \\' secret' host=127.0.0.1",
    f"postgresql://conclave:{SECRET}@127.0.0.1:1/jobs",
    "postgresql://conclave:hunter2%zzsecret@127.0.0.1:1/jobs",
    "postgresql://conclave:hunter2%2secret@127.0.0.1:1/jobs",
    "postgresql://conclave:hunt@er2secret@127.0.0.1:1/jobs",
    "postgresql://conclave:hunter2@secret@127.0.0.1:1/jobs",
    "postgresql://127.0.0.1:1/jobs?user=conclave&password=hunter2secret",
    "postgresql://127.0.0.1:1/jobs?password=hunter2%zzsecret&user=x",
    "postgres:/conclave:hunter2secret@127.0.0.1:1/jobs",
    "conclave:hunter2secret@127.0.0.1:1/jobs",
]
QUEUE_URLS = [
    f":{SECRET}@127.0.0.1:1/0",
    f"default:{SECRET}@127.0.0.1:1",
    f"127.0.0.1:1?password={SECRET}",
    f"redis://:{SECRET}@127.0.0.1:1/0",
    "redis://:hunter2%zzsecret@127.0.0.1:1/0",
    "redis://default:hunt@er2secret@127.0.0.1:1/0",
    f"redis://127.0.0.1:1/0?password={SECRET}",
    f"redis:/default:{SECRET}@127.0.0.1:1/0",
    f"host=127.0.0.1 password = {SECRET}",
]


def shows_a_piece(message: str) -> list[str]:
    return [piece for piece in PIECES if piece in message]


@pytest.mark.parametrize("url", DATABASE_URLS)
def test_no_database_error_shows_the_password(url: str) -> None:
    with pytest.raises(StoreUnavailable) as raised:
        PostgresOpener(SecretStr(url))
    message = str(raised.value)
    assert "CONCLAVE_DATABASE_URL" in message and "***" in message, message
    assert shows_a_piece(message) == [], message


@pytest.mark.parametrize("url", QUEUE_URLS)
async def test_no_queue_error_shows_the_password(url: str) -> None:
    with pytest.raises(QueueUnavailable) as raised:
        async with JobQueue.open(SecretStr(url)):
            pass
    message = str(raised.value)
    assert "CONCLAVE_QUEUE_URL" in message and "***" in message, message
    assert shows_a_piece(message) == [], message
