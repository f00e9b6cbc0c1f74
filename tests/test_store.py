"""The job store off the event loop: reads beside a held write lock, writes in the writer lane while the
loop goes on, waiters woken by writes, event numbers without counting, progress written in parts; each
store test on both databases (the `database` fixture: the SQLite file and a PostgreSQL schema)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import SecretStr

from conclave.backends.base import Usage
from conclave.coordination.limits import ProviderLimits
from conclave.coordination.reports import (
    AgentFailedEvent,
    AgentProgress,
    CheckedEvent,
    FinishedEvent,
    PresentingEvent,
    Progress,
    StartedEvent,
    UsageEvent,
)
from conclave.jobs.store.async_store import AsyncStore
from conclave.jobs.store.migrations import MIGRATIONS
from conclave.jobs.store.progress_patch import progress_patch
from conclave.jobs.store.sql import Store
from tests.fakes.new_jobs import new_job

pytestmark = pytest.mark.anyio
JOB = "cj-0123456789ab"


def progress(calls: int = 0, state: str = "working", phase: str = "working") -> Progress:
    agents = [
        AgentProgress(
            letter=letter,
            model=f"openai/m{letter}",
            state=state,  # type: ignore[arg-type]
            usage=Usage(calls=calls, input_tokens=10 * calls),
        )
        for letter in "AB"
    ]
    return Progress(phase=phase, agents=agents)


Database = Path | SecretStr


def new_store(database: Database) -> Store:
    store = Store(database)
    store.create_job(new_job(JOB, "task"), 1, "owner")
    return store


def raw(database: Database, sql: str, *params: Any) -> list[Any]:
    """`sql`'s rows, read on a connection of another store (another process)."""
    other = Store(database)
    try:
        with other.transaction() as db:
            return list(db.execute(sql, params).fetchall())
    finally:
        other.close()


def stored_progress(database: Database) -> str:
    return str(raw(database, "SELECT progress_json FROM jobs WHERE id = ?", JOB)[0][0])


def usage_event(letter: str = "A") -> UsageEvent:
    charge = Usage(input_tokens=10, output_tokens=1)
    return UsageEvent(letter=letter, model=f"openai/m{letter}", charge=charge, total=charge)


async def test_a_read_and_the_loop_go_on_while_another_process_holds_the_write_lock(
    database: Database,
) -> None:
    sync = new_store(database)
    other = Store(database)
    held = other.transaction()
    held.__enter__()  # another Conclave process in the middle of a write
    open_write = True
    ticks = 0
    wrote = anyio.Event()
    try:
        async with AsyncStore.open(sync) as store, anyio.create_task_group() as tg:

            async def write() -> None:
                await store.set_state(JOB, "running", "busy elsewhere")
                wrote.set()

            tg.start_soon(write)
            # under the writer's busy timeout (10 s, jobs/store/connections.py): a read that waited for the
            # pending write (a new reader thread once queued behind the writer's lock) fails here
            with anyio.fail_after(9):
                row = await store.job(JOB)  # WAL: a reader never waits for a writer
                while ticks < 5:  # the loop keeps running while the write waits for the lock
                    await anyio.sleep(0.01)
                    ticks += 1
            assert row is not None and row.state == "queued" and not wrote.is_set()
            held.__exit__(None, None, None)
            open_write = False
            with anyio.fail_after(10):
                await wrote.wait()
            assert (await store.job(JOB)).state == "running"  # type: ignore[union-attr]
    finally:
        if open_write:
            held.__exit__(None, None, None)
        other.close()
        sync.close()


async def test_a_write_wakes_the_waiters_on_that_job_only(database: Database) -> None:
    sync = new_store(database)
    sync.create_job(new_job("cj-00000000beef", "task"), 1, "owner")
    async with AsyncStore.open(sync) as store:
        mine, theirs = store.changed(JOB), store.changed("cj-00000000beef")
        await store.record(JOB, usage_event(), progress(1), None)  # no phase: rev stays, nobody wakes
        await store.write(None, lambda: None)  # after the record above
        assert not mine.is_set()
        await store.record(JOB, PresentingEvent(), progress(1), "presenting")  # queued, not waited
        with anyio.fail_after(5):
            await mine.wait()
        assert not theirs.is_set()
        assert store.changed(JOB) is not mine  # a new wait takes a fresh event
    sync.close()


async def test_queued_writes_keep_their_order_and_are_committed_by_the_end(database: Database) -> None:
    sync = new_store(database)
    async with AsyncStore.open(sync) as store:
        for calls in range(1, 21):  # a job's events, queued without waiting
            await store.record(JOB, usage_event(), progress(calls), None)
        await store.set_state(JOB, "completed", "done")  # waits: committed after every event before it
        row = await store.job(JOB)
        assert row is not None and row.state == "completed" and row.progress == progress(20)
        await store.record(JOB, PresentingEvent(), progress(21), None)
    assert len(sync.events(JOB)) == 21  # the last one, queued just before the end, was committed too
    sync.close()


async def test_event_numbers_follow_on_across_processes_without_gaps(database: Database) -> None:
    first = new_store(database)
    for calls in range(1, 4):
        first.record(JOB, usage_event(), progress(calls), None)
    first.close()
    second = Store(database)  # a new process: reads where the numbers stopped once
    second.record(JOB, PresentingEvent(), progress(3), "presenting")
    seqs = raw(database, "SELECT seq FROM events WHERE job_id = ? ORDER BY seq", JOB)
    assert [row[0] for row in seqs] == [0, 1, 2, 3]
    assert [event.kind for event in second.events(JOB)] == ["usage", "usage", "usage", "presenting"]
    second.close()


async def test_progress_is_written_in_parts_and_reads_back_whole(database: Database) -> None:
    store = new_store(database)
    store.record(JOB, StartedEvent(), progress(0), "working")
    whole = stored_progress(database)
    latest = progress(0)
    for calls in range(1, 6):  # usage reports change one agent's counters
        latest = progress(0)
        latest.agents[1].usage = Usage(calls=calls, input_tokens=7 * calls)
        store.record(JOB, usage_event("B"), latest, None)
    row = store.job(JOB)
    assert row is not None and row.progress == latest
    assert stored_progress(database) != whole  # the stored JSON changed in place
    latest = progress(9, state="voted", phase="voting")  # a change of shape and state: read back whole too
    latest.agents.append(AgentProgress(letter="C", model="openai/mC", state="failed", error="gone"))
    store.record(JOB, AgentFailedEvent(letter="C"), latest, "voting")
    row = store.job(JOB)
    assert row is not None and row.progress == latest and row.phase == "voting"
    store.close()


async def test_a_members_usage_is_recorded_from_its_usage_event(database: Database) -> None:
    """The usage table keeps what the event carries (the member's total after the charge), whatever the
    progress recorded beside it says: here it names no agent at all."""
    store = new_store(database)
    total = Usage(calls=2, input_tokens=3_000, output_tokens=40, cost_usd=0.25)
    event = UsageEvent(letter="A", model="openai/mA", charge=Usage(calls=1, input_tokens=1_000), total=total)
    store.record(JOB, event, Progress(phase="working"), None)
    store.set_state(JOB, "completed", "done")
    [[usage]] = store.team_usage("team")
    assert usage.model == "openai/mA" and usage.usage == total
    assert store.events(JOB) == [event]
    store.close()


async def test_events_stored_before_they_were_typed_read_back(database: Database) -> None:
    """Rows written when an event's payload was a flat dict: a check's fields beside its label (and a
    field since dropped), a usage charge's counters, a result's fields."""
    store = new_store(database)
    old = [
        (
            "checked",
            "A",
            {
                "label": "A1",
                "status": "failed",
                "exit_code": 1,
                "tail": ["1 failed"],
                "output": "E assert",
                "gone": True,
            },
        ),
        (
            "usage",
            "A",
            {
                "calls": 1,
                "input_tokens": 10,
                "output_tokens": 1,
                "cached_input_tokens": 0,
                "cost_usd": None,
                "uncosted_tokens": 0,
                "estimated_input_tokens": 0,
            },
        ),
        (
            "finished",
            None,
            {
                "winner": "A1",
                "votes": 2,
                "voters": 2,
                "consensus": True,
                "all_voted": True,
                "reason": "all voted",
                "answer": "x",
                "budget_reached": False,
            },
        ),
    ]
    with store.transaction() as db:
        for seq, (kind, letter, data) in enumerate(old):
            db.execute(
                "INSERT INTO events (job_id, seq, at, kind, letter, data_json) VALUES (?, ?, ?, ?, ?, ?)",
                (JOB, seq, 1.0, kind, letter, json.dumps(data)),
            )
    checked, usage, finished = store.events(JOB)
    assert isinstance(checked, CheckedEvent) and checked.label == "A1" and checked.output == "E assert"
    assert checked.check.status == "failed" and checked.check.tail == ["1 failed"]
    assert isinstance(usage, UsageEvent) and usage.charge == Usage(calls=1, input_tokens=10, output_tokens=1)
    assert (
        isinstance(finished, FinishedEvent) and finished.result.winner == "A1" and finished.result.consensus
    )
    store.close()


def test_a_usage_report_patches_one_agents_usage_only() -> None:
    before, after = progress(1), progress(1)
    after.agents[0].usage = Usage(calls=2, input_tokens=25)
    patch = progress_patch(before.model_dump(mode="json"), after.model_dump(mode="json"))
    assert patch is not None and [path for path, _ in patch] == ["$.agents[0].usage"]
    assert progress_patch(before.model_dump(mode="json"), before.model_dump(mode="json")) == []


async def test_reads_and_writes_run_in_worker_threads(database: Database) -> None:
    sync = new_store(database)
    loop_thread = threading.get_ident()
    seen: list[int] = []

    def job(job_id: str) -> object:
        seen.append(threading.get_ident())
        return sync.job(job_id)

    async with AsyncStore.open(sync) as store:
        assert await store.read(job, JOB) is not None
        await store.write(JOB, lambda: seen.append(threading.get_ident()))
    assert len(seen) == 2 and loop_thread not in seen
    sync.close()


async def test_one_limiter_per_provider_is_shared() -> None:
    limits = ProviderLimits(3)
    assert limits.of("openai") is limits.of("openai") and limits.of("openai").total_tokens == 3
    assert limits.of("openai") is not limits.of("anthropic")


async def test_a_migration_adding_a_column_the_database_has_already_is_skipped(database: Database) -> None:
    """A database a development build migrated in another order (the column there, the version lower)."""
    store = new_store(database)
    with store.transaction() as db:
        assert store.dialect.schema_version(db) == len(MIGRATIONS)
        store.dialect.set_schema_version(db, len(MIGRATIONS) - 1)  # the last one not yet recorded as run
    store.close()
    again = Store(database)
    try:
        assert again.job(JOB) is not None
        with again.transaction() as db:
            assert again.dialect.schema_version(db) == len(MIGRATIONS)
    finally:
        again.close()


async def test_a_column_a_counted_migration_missed_is_added(database: Database) -> None:
    """A database whose count says a migration ran, but whose table lacks that migration's column."""
    store = new_store(database)
    with store.transaction() as db:
        db.execute("DROP INDEX jobs_follow_up")
        db.execute("ALTER TABLE jobs DROP COLUMN follow_up")
    store.close()
    again = Store(database)
    try:
        row = again.job(JOB)
        assert row is not None and row.follow_up is None
    finally:
        again.close()


async def test_usage_an_older_database_recorded_reads_back_as_it_was(database: Database) -> None:
    """A database from before `usage.uncosted_tokens` (its rows' cost, when known, covered every token)
    and `usage.estimated_input_tokens` opens, gains the columns, and its rows read back whole; the
    progress it stored too."""
    store = new_store(database)
    store.set_state(JOB, "completed")
    old = {
        "calls": 2,
        "input_tokens": 1000,
        "output_tokens": 50,
        "cached_input_tokens": 200,
        "cost_usd": 0.25,
    }
    agents = [{"letter": "A", "model": "openai/mA", "state": "done", "usage": old}]
    with store.transaction() as db:
        db.execute("ALTER TABLE usage DROP COLUMN uncosted_tokens")
        db.execute("ALTER TABLE usage DROP COLUMN estimated_input_tokens")  # newer still
        store.dialect.set_schema_version(db, len(MIGRATIONS) - 1)
        db.execute("INSERT INTO usage VALUES (?, 'A', 'openai/mA', 2, 1000, 50, 200, 0.25)", (JOB,))
        db.execute("INSERT INTO usage VALUES (?, 'B', 'openai/mB', 1, 300, 5, 0, NULL)", (JOB,))
        db.execute(
            "UPDATE jobs SET progress_json = ? WHERE id = ?",
            (json.dumps({"phase": "done", "agents": agents}), JOB),
        )
    store.close()
    again = Store(database)
    try:
        past = again.team_usage("team")
        row = again.job(JOB)
    finally:
        again.close()
    assert [agent.usage for agent in past[0]] == [
        Usage(1000, 50, 200, cost_usd=0.25, calls=2),
        Usage(300, 5, 0, calls=1),
    ]
    assert not past[0][0].usage.cost_partial
    assert row is not None and row.progress is not None and row.progress.agents[0].usage == past[0][0].usage


async def test_each_awaited_twin_runs_its_store_method_in_its_lane(database: Database) -> None:
    """A write twin wakes the waiters on the job it names (positionally or by keyword; a heartbeat names
    none), a read twin wakes nobody, and each returns what its Store method returns."""
    sync = new_store(database)
    async with AsyncStore.open(sync) as store:
        woken = store.changed(JOB)
        assert await store.notes_after(JOB, -1) == [] and not woken.is_set()
        assert await store.add_note(JOB, "look at the tests") == 0  # the job's first event
        assert woken.is_set()
        woken = store.changed(JOB)
        await store.heartbeat("owner", 15.0)
        assert not woken.is_set()
        await store.set_state(job_id=JOB, state="running", phase="by keyword")
        assert woken.is_set()
        row = await store.job(JOB)
        assert row is not None and row.phase == "by keyword"
        assert await store.notes_after(JOB, -1) == [(0, "look at the tests")]
    sync.close()


def test_a_twin_has_its_store_methods_name() -> None:
    from conclave.jobs.store.async_store import StoreRead

    with pytest.raises(Exception) as caught:  # Python 3.11 wraps it in a RuntimeError, 3.12 does not

        class Misnamed:  # an AsyncStore whose twin hides under another name
            row = StoreRead(Store.job)

    error = caught.value.__cause__ or caught.value
    assert isinstance(error, TypeError) and "must be named job, not row" in str(error)


async def test_a_bad_write_in_a_batch_fails_alone(database: Database) -> None:
    """A write that breaks a key, queued with good ones: it fails, they are committed (on PostgreSQL the
    error comes back only when the batch's statements are answered, at its end)."""
    sync = new_store(database)
    async with AsyncStore.open(sync) as store, anyio.create_task_group() as tg:
        outcomes: dict[str, str] = {}

        async def attempt(name: str, call: Any) -> None:
            try:
                await call()
                outcomes[name] = "ok"
            except Exception as exc:
                outcomes[name] = type(exc).__name__

        tg.start_soon(attempt, "state", lambda: store.set_state(JOB, "running", "first"))
        tg.start_soon(attempt, "twice", lambda: store.create_job(new_job(JOB, "again"), 1, "owner"))
        tg.start_soon(attempt, "other", lambda: store.create_job(new_job("cj-00000000beef", "t"), 1, "o"))
    assert outcomes["state"] == outcomes["other"] == "ok" and outcomes["twice"] != "ok"
    row, other = sync.job(JOB), sync.job("cj-00000000beef")
    assert row is not None and row.state == "running" and row.task == "task" and other is not None
    sync.close()


def test_a_view_row_holds_the_follow_ups_the_notes_and_a_queued_jobs_place(database: Database) -> None:
    """What get_status shows beside the row comes with it in one statement (jobs/read/view_read.py)."""
    store = new_store(database)  # JOB: queued, the first in its caller's line
    try:
        later, other = "cj-0123456789ac", "cj-0123456789ad"
        store.create_job(new_job(later, "task"), 1, "owner")
        first = store.view_row(JOB)
        assert first is not None and first.row == store.job(JOB)
        assert (first.followed, first.notes) == (False, 0)
        assert first.place is not None and (first.place.position, first.place.running) == (1, 0)
        second = store.view_row(later)
        assert second is not None and second.place is not None and second.place.position == 2
        store.set_state(JOB, "running")
        store.add_note(JOB, "keep the API")
        store.create_job(new_job(other, "task", caller="bob", follow_up=JOB), 1, "owner")
        running = store.view_row(JOB)
        assert running is not None and running.place is None
        assert (running.row.state, running.followed, running.notes) == ("running", True, 1)
        second = store.view_row(later)
        assert second is not None and second.place is not None
        assert (second.place.position, second.place.caller_running, second.place.running) == (1, 1, 1)
        bobs = store.view_row(other)
        assert bobs is not None and bobs.place is not None
        assert (bobs.place.position, bobs.place.caller_running, bobs.followed) == (1, 0, False)
        assert store.view_row("cj-ffffffffffff") is None
    finally:
        store.close()
