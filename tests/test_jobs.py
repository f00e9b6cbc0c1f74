"""The job service and its store: background runs, the queue, cancellation, recovery, paging."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from conclave.backends.retry import RetryPolicy
from conclave.config.loading import load_team_file
from conclave.errors import ConfigError, InputError, JobNotFound, MissingApiKey, TeamNotFound
from conclave.files.job_folder import JobFolder
from conclave.jobs.context.files import prepare
from conclave.jobs.read.views import JobView
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.jobs.store.sql import Store
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.new_jobs import new_job, unreadable_teams
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, install, voter, write_team
from tests.fakes.waits import until_state

pytestmark = pytest.mark.anyio
ENV = {KEY_ENV: "test-key-0123456789"}
FAST = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.02)


def settings(tmp_path: Path, **overrides: object) -> Settings:
    return Settings(home=tmp_path / "state", heartbeat_s=0.2, **overrides)  # type: ignore[arg-type]


def team_file(tmp_path: Path, fakes: FakeProviders, delay: float = 0.0, **options: object) -> str:
    install(fakes.script, TRIO, voter(delay=delay))
    return str(write_team(tmp_path / "team.yaml", fakes, TRIO, **options))


async def finish(service: JobService, job_id: str) -> JobView:
    view = await service.lookup.view(job_id)
    with anyio.fail_after(60):
        while not view.done:
            view = await service.wait(job_id, 5)
    return view


async def test_a_job_runs_in_the_background_and_is_stored(tmp_path: Path, fakes: FakeProviders) -> None:
    team = team_file(tmp_path, fakes)
    seen: list[JobView] = []

    async def on_progress(view: JobView) -> None:
        seen.append(view)

    async with JobService.serve(environment_of(settings(tmp_path), ENV, FAST)) as service:
        queued = await service.submit(JobRequest(task="What is 6 times 7?", team=team))
        assert queued.state in ("queued", "running") and queued.job_id.startswith("cj-")
        view = await service.wait(queued.job_id, 50, on_progress)
        assert view.state == "completed" and view.result.consensus and view.result.winner
        assert view.answer and view.answer.startswith("FINAL")
        assert sum(view.result.tally.values()) == 3 and view.usage.input_tokens > 0
        assert [agent.letter for agent in view.agents] == ["A", "B", "C"]  # the view lists agents by letter
        assert sorted(agent.model for agent in view.agents) == sorted(
            a.model for a in load_team_file(Path(team)).agents
        )
        # reported on change only, ending with the done view (phases between polls may merge)
        assert seen and seen[-1].done
        assert all(
            a.model_dump(exclude={"elapsed_s"}) != b.model_dump(exclude={"elapsed_s"})
            for a, b in itertools.pairwise(seen)
        )
        listing = await service.lookup.read(view.job_id, "", None, 0, 1000)
        assert "transcript" in listing.entries and "final" in listing.entries
        assert any(entry.startswith("answers/") for entry in listing.entries)
    store = Store.of(settings(tmp_path))  # the database the settings name: the SQLite file, or PostgreSQL
    with store.transaction() as db:
        if store.dialect.name == "sqlite":
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("SELECT COUNT(*) FROM answers").fetchone()[0] == 3
        assert db.execute("SELECT COUNT(*) FROM votes WHERE valid = 1").fetchone()[0] >= 3
        # every call is billed from its start: one its provider reported as the fake billed it, and one cut
        # off by a stale-turn cancellation its estimate, marked, whether its request had reached the fake
        # or not (a slow machine cancels some before they are sent)
        billed, estimated = db.execute("SELECT SUM(calls), SUM(estimated_input_tokens) FROM usage").fetchone()
        cancelled = db.execute("SELECT COUNT(*) FROM events WHERE kind = 'turn_cancelled'").fetchone()[0]
    store.close()
    assert billed - cancelled <= len(fakes.script.requests) <= billed
    assert billed == len(fakes.script.requests) or estimated > 0  # a charge the fake never billed is marked


async def test_jobs_beyond_the_limit_wait_in_the_queue(tmp_path: Path, fakes: FakeProviders) -> None:
    team = team_file(tmp_path, fakes, delay=30)  # the first job holds the only slot until it is cancelled
    async with JobService.serve(environment_of(settings(tmp_path, max_jobs=1), ENV, FAST)) as service:
        first = await service.submit(JobRequest(task="task one", team=team))
        second = await service.submit(JobRequest(task="task two", team=team))
        await until_state(service, first.job_id, "running")
        assert (await service.lookup.view(second.job_id)).state == "queued"
        assert (await service.cancel(first.job_id)).state == "cancelled"
        await until_state(service, second.job_id, "running")  # the freed slot goes to the queued job
        assert (await service.cancel(second.job_id)).state == "cancelled"


async def test_cancel_stops_a_running_job_and_keeps_its_answers(tmp_path: Path, fakes: FakeProviders) -> None:
    install(fakes.script, TRIO[:2], voter())
    fakes.script.set_default("cy", voter(delay=30))
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    async with JobService.serve(environment_of(settings(tmp_path), ENV, FAST)) as service:
        job = await service.submit(JobRequest(task="task", team=team))
        with anyio.fail_after(20):
            while len((await service.lookup.read(job.job_id, "", None, 0, 1000)).entries or []) < 3:
                await anyio.sleep(0.1)
        view = await service.cancel(job.job_id)
        assert view.state == "cancelled" and "cancel" in view.next
        answers = (await service.lookup.read(job.job_id, "", None, 0, 1000)).entries or []
        assert any(entry.startswith("answers/") for entry in answers)
        assert (await service.cancel(job.job_id)).state == "cancelled"  # idempotent


async def test_cancel_reaches_a_job_run_by_another_server(tmp_path: Path, fakes: FakeProviders) -> None:
    team = team_file(tmp_path, fakes, delay=30)
    async with (
        JobService.serve(environment_of(settings(tmp_path), ENV, FAST)) as owner,
        JobService.serve(environment_of(settings(tmp_path), ENV, FAST)) as other,
    ):
        job = await owner.submit(JobRequest(task="task", team=team))
        await until_state(owner, job.job_id, "running")
        with anyio.fail_after(15):
            view = await other.cancel(job.job_id)
        assert view.state == "cancelled"


async def test_stopping_the_server_interrupts_its_jobs(tmp_path: Path, fakes: FakeProviders) -> None:
    team = team_file(tmp_path, fakes, delay=30)
    async with JobService.serve(environment_of(settings(tmp_path), ENV, FAST)) as service:
        job = await service.submit(JobRequest(task="task", team=team))
        await until_state(service, job.job_id, "running")
    async with JobService.serve(environment_of(settings(tmp_path), ENV)) as service:
        view = await service.lookup.view(job.job_id)
        assert view.state == "interrupted" and "ask_team again" in view.next


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


async def test_start_up_marks_only_jobs_of_dead_owners_interrupted(tmp_path: Path) -> None:
    config = settings(tmp_path)
    store = Store.of(config)
    store.create_job(new_job("cj-00000000dead", "t"), dead_pid(), "gone")
    store.create_job(new_job("cj-0000000a11fe", "t"), 1, "init-is-alive")  # pid 1: alive, fresh heartbeat
    store.close()
    unreadable_teams(config.db_path)
    async with JobService.serve(environment_of(config, ENV)) as service:
        assert (await service.lookup.view("cj-00000000dead")).state == "interrupted"
        assert (await service.lookup.view("cj-0000000a11fe")).state == "queued"


async def test_a_stale_heartbeat_counts_as_a_dead_owner(tmp_path: Path) -> None:
    config = settings(tmp_path, stale_after_s=0.5)
    clock = iter([0.0] * 3)
    store = Store.of(config)
    store._clock = lambda: next(clock, 0.0)  # its heartbeat written at 0: long stale
    store.create_job(new_job("cj-0000000a11fe", "t"), 1, "hung")
    store.close()
    unreadable_teams(config.db_path)
    async with JobService.serve(environment_of(config, ENV)) as service:
        assert (await service.lookup.view("cj-0000000a11fe")).state == "interrupted"


async def test_bad_input_names_the_field_and_the_fix(tmp_path: Path, fakes: FakeProviders) -> None:
    team = team_file(tmp_path, fakes)
    async with JobService.serve(environment_of(settings(tmp_path, max_task_chars=100), ENV)) as service:
        with pytest.raises(InputError, match=r"task.*non-empty"):
            await service.submit(JobRequest(task="   ", team=team))
        with pytest.raises(InputError, match="under 100 characters"):
            await service.submit(JobRequest(task="x" * 101, team=team))
        with pytest.raises(TeamNotFound, match="presets"):
            await service.submit(JobRequest(task="task", team="no-such-team"))
        with pytest.raises(InputError, match="cj-"):
            await service.lookup.view("job-1")
        with pytest.raises(JobNotFound):
            await service.lookup.view("cj-000000000000")
        job = await service.submit(JobRequest(task="task", team=team))
        for bad in (-1, 51):
            with pytest.raises(InputError, match="wait_seconds"):
                await service.wait(job.job_id, bad)
        with pytest.raises(InputError, match="answers/B2"):
            await service.lookup.read(job.job_id, "nonsense", None, 0, 100)
        with pytest.raises(InputError, match="limit"):
            await service.lookup.read(job.job_id, "", None, 0, 0)
    async with JobService.serve(environment_of(settings(tmp_path), {})) as service:
        with pytest.raises(MissingApiKey, match=KEY_ENV):
            await service.submit(JobRequest(task="task", team=team))


async def test_reading_pages_through_the_transcript(tmp_path: Path, fakes: FakeProviders) -> None:
    team = team_file(tmp_path, fakes)
    async with JobService.serve(environment_of(settings(tmp_path), ENV, FAST)) as service:
        job = await finish(
            service, (await service.submit(JobRequest(task="What is 6 times 7?", team=team))).job_id
        )
        whole = await service.lookup.read(job.job_id, "transcript", None, 0, 100_000)
        assert "What is 6 times 7?" in whole.content and "voted for" in whole.content
        assert whole.next_offset is None
        pieces, offset = [], 0
        while offset is not None:
            page = await service.lookup.read(job.job_id, "transcript", None, offset, 500)
            pieces.append(page.content)
            offset = page.next_offset
        assert "".join(pieces) == whole.content
        winner = job.result.winner
        assert winner is not None
        by_path = await service.lookup.read(job.job_id, f"answers/{winner}", None, 0, 1000)
        assert by_path.content.startswith("Answer from")
        with pytest.raises(InputError, match="no files"):
            # a job without context paths has no trees
            await service.lookup.read(job.job_id, "", winner, 0, 1000)
        final = await service.lookup.read(job.job_id, "final", None, 0, 1000)
        assert final.content == job.answer


async def test_a_local_model_that_is_missing_is_refused_at_submit(tmp_path: Path) -> None:
    team = tmp_path / "mine.yaml"
    team.write_text(
        "agents:\n  - model: local/mine\n    model_path: /no/such/model.gguf\n    tool_mode: json\n"
    )
    async with JobService.serve(environment_of(settings(tmp_path), ENV)) as service:
        with pytest.raises(ConfigError, match=re.escape("model_path '/no/such/model.gguf' is not a file")):
            await service.submit(JobRequest(task="task", team=str(team)))
        assert await service.store.recent_jobs() == []  # nothing was queued


async def test_the_timeout_covers_copying_the_context_paths(
    tmp_path: Path, fakes: FakeProviders, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conclave.jobs.context import files as file_steps

    real_prepare = prepare

    async def slow_prepare(folder: JobFolder, options: object) -> None:
        await real_prepare(folder, options)  # type: ignore[arg-type]
        await anyio.sleep(30)  # sleep-ok: a copy that takes long (a big folder on a slow disk)

    monkeypatch.setattr(file_steps, "prepare", slow_prepare)  # the job's files copy through it
    team = team_file(tmp_path, fakes, coordination={"timeout_s": 1.0}, sandbox="none")
    project = tmp_path / "proj"
    project.mkdir()
    async with JobService.serve(environment_of(settings(tmp_path), ENV, FAST)) as service:
        view = await service.submit(
            JobRequest(task="task", team=team, context_paths=[{"path": str(project)}])
        )
        with anyio.fail_after(20):  # a hang guard: the copy alone would take 30 s
            view = await finish(service, view.job_id)
    assert view.state == "failed" and "while copying the context paths" in (
        view.result.errors.get("job") or ""
    ), view
    assert fakes.script.requests == []  # no agent started
