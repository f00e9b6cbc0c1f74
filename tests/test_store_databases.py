"""The store on either database (the `database` fixture: SQLite, and a schema of a real PostgreSQL):
the same values back, writers taking turns across processes, the setting's errors, a lost connection
made again, a whole job through the service on PostgreSQL, and hosts sharing the jobs' folder."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import anyio
import pytest
from pydantic import SecretStr

from conclave.backends.base import Usage
from conclave.cli.doctor import run_checks
from conclave.coordination.reports import AgentProgress, Progress, UsageEvent
from conclave.errors import StoreUnavailable
from conclave.jobs.lookup import JobLookup
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.jobs.store.dialect import PostgresDialect
from conclave.jobs.store.sql import Store
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.new_jobs import new_job
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import (
    KEY_ENV,
    TRIO,
    decide,
    install,
    is_presentation,
    own_letter,
    vote_labels,
    voter,
    write_team,
)
from tests.postgres import Cluster

pytestmark = pytest.mark.anyio
JOB = "cj-0123456789ab"
Database = Path | SecretStr


async def test_times_and_large_counts_read_back_as_written(database: Database) -> None:
    """A Unix time to the microsecond and a token count past 2**31 (PostgreSQL's REAL keeps about 7
    digits and its INTEGER 4 bytes: the migrations' types are respelled, jobs/store/dialect.py)."""
    at = 1795759499.123456
    store = Store(database)
    store._clock = lambda: at
    try:
        store.create_job(new_job(JOB, "task"), 1, "owner")
        big = Usage(calls=1, input_tokens=3_000_000_000, cost_usd=0.1234567)
        agents = [AgentProgress(letter="A", model="openai/mA", state="working", usage=big)]
        event = UsageEvent(letter="A", model="openai/mA", charge=big, total=big)
        store.record(JOB, event, Progress(phase="w", agents=agents), None)
        store.set_state(JOB, "completed", "done")
        row = store.job(JOB)
        assert row is not None and row.created_at == at and row.finished_at == at and row.heartbeat == at
        assert store.team_usage("team")[0][0].usage == big
    finally:
        store.close()


async def test_writers_of_several_processes_take_turns(database: Database) -> None:
    """Steering notes from eight processes at once: each is numbered after the last one committed (two
    writers in one turn would read the same count and collide on the events' key)."""
    first = Store(database)
    first.create_job(new_job(JOB, "task"), 1, "owner")
    stores = [Store(database) for _ in range(8)]
    start = threading.Barrier(len(stores))
    seqs: list[int] = []
    errors: list[BaseException] = []

    def note(store: Store, index: int) -> None:
        start.wait()
        try:
            for turn in range(5):
                seqs.append(store.add_note(JOB, f"note {index}.{turn}"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=note, args=(store, i)) for i, store in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    try:
        assert not errors and sorted(seqs) == list(range(40))
        assert len(first.notes_after(JOB, -1)) == 40
    finally:
        for store in [first, *stores]:
            store.close()


def test_a_url_of_another_database_is_refused_naming_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONCLAVE_DATABASE_URL", "mysql://user:pw@db/conclave")
    settings = Settings(home=tmp_path)
    with pytest.raises(StoreUnavailable) as caught:
        Store.of(settings)
    message = str(caught.value)
    assert message.startswith(
        "CONCLAVE_DATABASE_URL=mysql://user:***@db/conclave: it names a 'mysql' database"
    )
    assert "postgresql://USER:PASSWORD@HOST:PORT/DATABASE" in message and "pw" not in message
    monkeypatch.setenv("CONCLAVE_DATABASE_URL", " ")
    assert Settings(home=tmp_path).database == tmp_path / "conclave.db"  # blank is unset: SQLite


def test_an_unreachable_database_names_the_setting_the_value_and_the_fix(tmp_path: Path) -> None:
    url = f"postgresql://conclave:s3cret@/conclave?host={tmp_path}&port=7799"  # no server on that socket
    with pytest.raises(StoreUnavailable) as caught:
        Store(SecretStr(url))
    message = str(caught.value)
    assert message.startswith("CONCLAVE_DATABASE_URL=postgresql://conclave:***@/conclave")
    assert "s3cret" not in message and "unset CONCLAVE_DATABASE_URL" in message
    assert "host, port, user, password and database" in message


async def test_a_lost_connection_is_made_again(postgres_cluster: Cluster) -> None:
    """A PostgreSQL restart or a terminated session: the next read and write open new connections."""
    with postgres_cluster.schema() as url:
        store = Store(url)
        try:
            store.create_job(new_job(JOB, "task"), 1, "owner")
            assert store.job(JOB) is not None  # this thread's reader exists now
            postgres_cluster.sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE pid <> pg_backend_pid() AND datname = 'postgres' AND backend_type = 'client backend'"
            )
            with pytest.raises(Exception):  # noqa: B017 - psycopg's OperationalError: the call in flight fails
                store.job(JOB)
            assert store.job(JOB) is not None
            store.set_state(JOB, "running")
            row = store.job(JOB)
            assert row is not None and row.state == "running"
        finally:
            store.close()


def test_statements_are_respelled_for_postgresql() -> None:
    statement = PostgresDialect.statement
    assert statement("SELECT * FROM t WHERE a = ? AND b = '?' AND c LIKE 'x%'") == (
        "SELECT * FROM t WHERE a = %s AND b = '?' AND c LIKE 'x%%'"
    )
    assert (
        statement("INSERT OR IGNORE INTO t (a) VALUES (?)")
        == "INSERT INTO t (a) VALUES (%s) ON CONFLICT DO NOTHING"
    )
    with pytest.raises(ValueError, match="ON CONFLICT"):
        statement("INSERT OR REPLACE INTO t (a) VALUES (?)")
    ddl = PostgresDialect().ddl("CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, n INTEGER, at REAL)")
    assert ddl == (
        "CREATE TABLE t (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, n BIGINT,"
        " at DOUBLE PRECISION)"
    )


async def test_a_job_runs_to_the_end_with_its_store_in_postgresql(
    tmp_path: Path, fakes: FakeProviders, postgres_cluster: Cluster
) -> None:
    """The service on CONCLAVE_DATABASE_URL: the job's rows are in PostgreSQL, none in an SQLite file."""
    install(fakes.script, TRIO, voter())
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    with postgres_cluster.schema() as url:
        settings = Settings(home=tmp_path / "state", database_url=url)
        async with JobService.serve(environment_of(settings, {KEY_ENV: "test-key-0123456789"})) as service:
            queued = await service.submit(JobRequest(task="What is 6 times 7?", team=team))
            with anyio.fail_after(60):
                view = await service.wait(queued.job_id, 50)
                while not view.done:
                    view = await service.wait(queued.job_id, 5)
            assert view.state == "completed" and view.result is not None and view.result.consensus
            transcript = await service.lookup.read(view.job_id, "transcript", None, 0, 100_000)
            assert "What is 6 times 7?" in transcript.content and "voted for" in transcript.content
        assert not (tmp_path / "state" / "conclave.db").exists()  # nothing went to SQLite
        assert (tmp_path / "state" / "jobs").is_dir()  # where a job's files go, made private with home
        store = Store(url)
        try:
            row = store.job(queued.job_id)
            assert row is not None and row.state == "completed" and len(store.answers(queued.job_id)) >= 1
        finally:
            store.close()


def shared(tmp_path: Path, host: str, url: SecretStr, jobs: str = "shared") -> Settings:
    """One host's settings: a home of its own, the database and the jobs' folder all hosts share."""
    return Settings(home=tmp_path / host, database_url=url, jobs_dir=tmp_path / jobs)


def editor(fixed: threading.Event) -> Callable[[RecordedRequest], Reply]:
    """ann: fixes calc.py with edit_file, answers (setting `fixed`), then votes."""

    def reply(request: RecordedRequest) -> Reply:
        if is_presentation(request):
            return Reply(text="FINAL: add() now adds.")
        labels = vote_labels(request)
        if not any(label.startswith(own_letter(request) or "?") for label in labels):
            if "replaced 1 occurrence in calc.py" in request.text():
                fixed.set()
                return decide("new_answer", {"content": "Fixed add(): it subtracted."}, request)
            edit = {"path": "calc.py", "old_text": "return a - b", "new_text": "return a + b"}
            return Reply(tool_calls=[("edit_file", edit)])
        return decide("vote", {"answer": labels[0], "reason": "the fix"}, request)

    return reply


def follower(fixed: threading.Event) -> Callable[[RecordedRequest], Reply]:
    """bob and cy: a first answer held until the fix is posted, then a vote for the fix."""

    def reply(request: RecordedRequest) -> Reply:
        labels = vote_labels(request)
        if not labels:
            words = {"content": f"{request.agent} thinks the bug is in calc.py"}
            return replace(decide("new_answer", words, request), gate=fixed)
        sections = {
            label: request.text().split(f"## Answer {label}", 1)[-1].split("## Answer", 1)[0]
            for label in labels
        }
        # the gate opens as ann's fix is sent, which may be posted after this turn starts: a vote then
        # goes to the first answer shown, and the fix, when posted, resets it
        fix = next((label for label, section in sections.items() if "Fixed add()" in section), labels[0])
        return decide("vote", {"answer": fix, "reason": "agreed"}, request)

    return reply


async def test_a_job_run_on_one_host_is_read_back_on_another(
    tmp_path: Path, fakes: FakeProviders, postgres_cluster: Cluster
) -> None:
    """Two hosts (homes of their own) share the database and the jobs' folder: the diff and the final
    files of a job run on one are read on the other; a third host with another folder is refused."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    fixed = threading.Event()
    fakes.script.set_default("ann", editor(fixed))
    fakes.script.set_default("bob", follower(fixed))
    fakes.script.set_default("cy", follower(fixed))
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    with postgres_cluster.schema() as url:
        async with JobService.serve(
            environment_of(shared(tmp_path, "a", url), {KEY_ENV: "k-0123456789"})
        ) as service:
            view = await service.submit(
                JobRequest(task="Fix add()", team=team, context_paths=[{"path": str(project)}])
            )
            with anyio.fail_after(60):
                while not view.done:
                    view = await service.wait(view.job_id, 10)
            assert view.state == "completed", view.text()
        async with JobLookup.open(shared(tmp_path, "b", url), {}) as other:
            patch = (await other.read(view.job_id, "@diff", None, 0, 100_000)).content
            final = (await other.read(view.job_id, "proj/calc.py", "final", 0, 1000)).content
        assert "-    return a - b\n+    return a + b" in patch and final.endswith("return a + b\n"), (
            view.text()
        )
        assert not (tmp_path / "a" / "jobs" / view.job_id).exists()  # the files went to the shared folder
        with pytest.raises(StoreUnavailable) as caught:
            async with JobLookup.open(shared(tmp_path, "c", url, jobs="elsewhere"), {}):
                pass
        message = str(caught.value)
        identity = (tmp_path / "shared" / ".store-id").read_text().strip()
        assert message.startswith(f"CONCLAVE_JOBS_DIR={tmp_path / 'elsewhere'}: it lacks .store-id")
        assert f"write {identity} to {tmp_path / 'elsewhere' / '.store-id'}" in message
        (tmp_path / "elsewhere" / ".store-id").write_text(identity)  # the fix the message gives
        async with JobLookup.open(shared(tmp_path, "c", url, jobs="elsewhere"), {}) as third:
            assert (await third.row(view.job_id)).state == "completed"


def test_doctor_says_where_the_store_is_or_why_it_cannot_open(
    tmp_path: Path, postgres_cluster: Cluster
) -> None:
    with postgres_cluster.schema() as url:
        probes = {p.name: p for p in run_checks(Settings(home=tmp_path, database_url=url), {})}
        store = probes["job store"]
        assert store.ok and store.detail.startswith("PostgreSQL at postgresql://postgres@/postgres?host=")
        assert store.detail.endswith(f"; jobs' files in {tmp_path / 'jobs'}")
    bad = SecretStr("postgresql://conclave:s3cret@/conclave?host=/nowhere&port=7799")
    store = {p.name: p for p in run_checks(Settings(home=tmp_path, database_url=bad), {})}["job store"]
    assert not store.ok and store.essential
    assert store.detail == "CONCLAVE_DATABASE_URL=postgresql://conclave:***@/conclave?host=/nowhere&port=7799"
    assert store.fix.startswith("PostgreSQL could not be reached there (") and "s3cret" not in store.line()
    sqlite = {p.name: p for p in run_checks(Settings(home=tmp_path, database_url=None), {})}["job store"]
    assert sqlite.ok and sqlite.detail.startswith(f"the SQLite file {tmp_path / 'conclave.db'};")
