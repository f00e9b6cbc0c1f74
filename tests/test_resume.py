"""A job survives its server's `kill -9`: the next server takes it over (its owner's process is gone),
replays its protocol journal and runs again only the turns in flight (jobs/upkeep/takeover.py,
coordination/journal.py). Real `conclave serve --http` processes, the real SDKs, scripted fakes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import Client

from conclave.backends.base import Usage
from conclave.config.loading import load_team_file
from conclave.config.models import Team
from conclave.coordination.journal import decode, encode
from conclave.coordination.members import endpoint_factory
from conclave.coordination.orchestrator import Orchestrator, Resume, Shared
from conclave.coordination.protocol_events import (
    AnswerPosted,
    ProtocolEvent,
    Start,
    Steer,
    Stop,
    TurnFailed,
    VoteCast,
)
from conclave.coordination.tally import StopReason
from conclave.jobs.derived import JobOptions
from conclave.jobs.read.views import JobView
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.jobs.store.sql import AnswerRow, Store
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.new_jobs import new_job, unreadable_teams
from tests.fakes.processes import HTTP_TOKEN, http_process
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, install, team_data, voter, write_team
from tests.fakes.waits import answered_through, done_through, until_done, until_state
from tests.test_orchestrator import JOB, MemorySink, letters_of

pytestmark = pytest.mark.anyio
ASK = {"task": "What is 6 * 7?", "team": "fake-trio", "wait_seconds": 0}


def test_the_journal_keeps_every_event_as_it_was() -> None:
    events: list[ProtocolEvent] = [
        Start(),
        AnswerPosted("A", 0, "Answer: 42", key="42"),
        VoteCast("B", 3, "A1", reason="right"),
        TurnFailed("C", 2, "boom", fatal=True),
        Steer("be brief"),
        Stop("the budget", StopReason.DEADLINE),
    ]
    assert [decode(encode(event)) for event in events] == events
    with pytest.raises(ValueError, match="not a protocol event"):
        decode(json.dumps({"event": "Finish"}))


def _stored(home: Path, job_id: str) -> tuple[list[AnswerRow], int, int]:
    """The job's answers, the calls its usage counts and its protocol journal's length, as stored."""
    store = Store.of(Settings(home=home))
    try:
        row = store.job(job_id)
        assert row is not None
        calls = sum(agent.usage.calls for agent in row.progress.agents) if row.progress else 0
        return store.answers(job_id), calls, len(store.journaled(job_id))
    finally:
        store.close()


def _trio_server(tmp_path: Path, fakes: FakeProviders, delay: float) -> dict[str, str]:
    """A server's environment for the fake trio, whose every reply waits `delay` s: its home is
    tmp_path/home."""
    install(fakes.script, TRIO, voter(delay=delay))
    config = tmp_path / "config"
    write_team(config / "conclave" / "teams" / "fake-trio.yaml", fakes, TRIO, name="fake-trio")
    env = {"CONCLAVE_HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(config), KEY_ENV: "test-key"}
    return env | {"CONCLAVE_CHECK_POOL": "0"}


async def test_kill_9_mid_job_then_a_restart_resumes_it_with_every_answer_and_call_kept(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with FakeProviders() as fakes:
        env = _trio_server(tmp_path, fakes, delay=1.0)
        with http_process(tmp_path, env) as (base, process):
            async with Client(f"{base}/mcp", auth=HTTP_TOKEN) as client:
                asked = JobView.model_validate((await client.call_tool("ask_team", ASK)).structured_content)
                view = await answered_through(client, asked.job_id, 3)
                note = {"job_id": asked.job_id, "message": "keep it short"}
                steered = JobView.model_validate(
                    (await client.call_tool("steer_job", note)).structured_content
                )
                assert [n.seen for n in steered.notes] == [True]  # the protocol took it before the kill
            process.send_signal(signal.SIGKILL)  # mid-job: the agents are in their voting turns
            process.wait()
            fakes.settle()  # what the killed process had sent is recorded before the count
            requests_before = len(fakes.script.requests)
        answers_before, calls_before, journal_before = _stored(home, asked.job_id)
        assert len(answers_before) == 3 and not view.done
        with http_process(tmp_path, env) as (base, process):
            async with Client(f"{base}/mcp", auth=HTTP_TOKEN) as client:
                resumed = await done_through(client, asked.job_id)
                requests_after = len(fakes.script.requests) - requests_before  # the resumed job's alone
                # the same transcript, never interrupted, on the same server
                again = JobView.model_validate((await client.call_tool("ask_team", ASK)).structured_content)
                whole = await done_through(client, again.job_id)
            process.terminate()
            assert process.wait(timeout=60) == 0
    assert resumed.state == "completed", resumed.phase
    answers_after, calls_after, journal_after = _stored(home, asked.job_id)
    # every answer posted before the kill is kept as it was, and no agent answered again
    assert answers_after[: len(answers_before)] == answers_before
    assert [a.label for a in answers_after] == [a.label for a in answers_before]
    assert journal_after > journal_before
    # the note was kept, and given to the agents once: the journal's Steer, not a second delivery
    assert [n.seen for n in resumed.notes] == [True]
    store = Store.of(Settings(home=home))
    try:
        assert len(store.events(asked.job_id, "steered")) == 1
    finally:
        store.close()
    # each call counted once: the calls charged before the kill, plus every request made after it
    assert calls_after == resumed.usage.calls == calls_before + requests_after
    # the same result as the uninterrupted run of the transcript
    assert resumed.result is not None and whole.result is not None
    same = ("winner", "consensus", "tally", "votes", "voters", "fallback", "failed")
    assert resumed.result.model_dump(include=set(same)) == whole.result.model_dump(include=set(same))
    assert resumed.result.consensus and resumed.answer and "FINAL: the team's answer, 42" in resumed.answer


async def test_a_follow_up_killed_mid_job_resumes_with_its_thread(tmp_path: Path) -> None:
    """A follow-up's history (the earlier job's task and answer) is rebuilt from the store on resume, so the
    turns run again after the restart still see it, and the thread stays linked."""
    with FakeProviders() as fakes:
        env = _trio_server(tmp_path, fakes, delay=0.5)
        with http_process(tmp_path, env) as (base, process):
            async with Client(f"{base}/mcp", auth=HTTP_TOKEN) as client:
                asked = JobView.model_validate((await client.call_tool("ask_team", ASK)).structured_content)
                first = await done_through(client, asked.job_id)
                more = {"task": "Say it in words.", "follow_up": first.job_id, "wait_seconds": 0}
                follow = JobView.model_validate((await client.call_tool("ask_team", more)).structured_content)
                view = await answered_through(client, follow.job_id, 3)
            process.send_signal(signal.SIGKILL)  # mid-job: the agents are in their voting turns
            process.wait()
            fakes.settle()  # what the killed process had sent is recorded before the count
            requests_before = len(fakes.script.requests)
        assert not view.done
        with http_process(tmp_path, env) as (base, process):
            async with Client(f"{base}/mcp", auth=HTTP_TOKEN) as client:
                resumed = await done_through(client, follow.job_id)
            process.terminate()
            assert process.wait(timeout=60) == 0
        after = [request.text() for request in fakes.script.requests[requests_before:]]
    assert first.state == "completed" and first.answer is not None
    assert resumed.state == "completed", resumed.phase
    assert resumed.follow_up == first.job_id and resumed.thread == [first.job_id, follow.job_id]
    # every turn run again after the restart was given the follow-up with the earlier job's exchange
    assert after and all(
        "The task now: their follow-up" in text and "Say it in words." in text for text in after
    )
    assert all(ASK["task"] in text for text in after)


async def test_a_running_server_takes_over_a_job_whose_owner_died_and_runs_it(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    install(fakes.script, TRIO, voter())
    team = load_team_file(write_team(tmp_path / "team.yaml", fakes, TRIO))
    settings = Settings(home=tmp_path / "state", heartbeat_s=0.2)
    async with JobService.serve(environment_of(settings, {KEY_ENV: "test-key-0123456789"})) as service:
        store = Store.of(settings)  # another server's, which dies with its job queued
        try:
            store.create_job(new_job("cj-0000000dead1", "What is 6 * 7?", team=team), dead_pid(), "x")
        finally:
            store.close()
        view = await until_done(service, await service.lookup.view("cj-0000000dead1"))
    assert view.state == "completed" and view.result is not None and view.result.consensus


async def test_a_job_whose_team_no_longer_reads_is_not_resumed_but_says_why(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "state", heartbeat_s=0.2)
    store = Store.of(settings)
    try:
        options = JobOptions(commands=True)
        store.create_job(new_job("cj-0000000dead2", "t", team="gone", options=options), dead_pid(), "x")
    finally:
        store.close()
    unreadable_teams(settings.db_path, '{"agents": 3}')
    async with JobService.serve(environment_of(settings, {KEY_ENV: "test-key-0123456789"})) as service:
        view = await service.lookup.view("cj-0000000dead2")
    assert view.state == "interrupted" and "its stored team no longer reads" in view.phase


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


async def test_a_server_whose_job_was_taken_over_stops_running_it_and_writes_nothing_more(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    install(fakes.script, TRIO, voter(delay=0.5))
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    settings = Settings(home=tmp_path / "state", heartbeat_s=0.2)
    async with JobService.serve(environment_of(settings, {KEY_ENV: "test-key-0123456789"})) as service:
        job = await service.submit(JobRequest(task="What is 6 * 7?", team=team))
        await until_state(service, job.job_id, "running")
        with anyio.fail_after(60):
            while not await service.store.events(job.job_id, "turn_started"):
                await anyio.sleep(0.05)  # sleep-ok: until the agents' first turns are under way
        row = await service.store.job(job.job_id)
        assert row is not None
        # another server claims it, as if our lease had run out while we were stalled
        assert await service.store.claim(job.job_id, row.owner_id, "another-server", 1, 15.0)
        await anyio.sleep(1.0)  # sleep-ok: five heartbeats: ours notices the claim and drops the job
        events = len(await service.store.events(job.job_id))
        await anyio.sleep(1.5)  # sleep-ok: longer than a turn: nothing more is written of it
        assert len(await service.store.events(job.job_id)) == events
        taken = await service.store.job(job.job_id)
    assert taken is not None and taken.owner_id == "another-server" and taken.state == "running"


async def test_a_server_whose_job_with_files_was_taken_over_leaves_its_folder_to_the_new_owner(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    install(fakes.script, TRIO, voter(delay=0.5))
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    project = tmp_path / "proj"
    project.mkdir()
    (project / "notes.md").write_text("notes\n")
    settings = Settings(home=tmp_path / "state", heartbeat_s=0.2)
    async with JobService.serve(environment_of(settings, {KEY_ENV: "test-key-0123456789"})) as service:
        request = JobRequest(task="What is 6 * 7?", team=team, context_paths=[{"path": str(project)}])
        job = await service.submit(request)
        with anyio.fail_after(60):
            while not await service.store.events(job.job_id, "turn_started"):
                await anyio.sleep(0.05)  # sleep-ok: until the agents' first turns are under way
        row = await service.store.job(job.job_id)
        assert row is not None
        assert await service.store.claim(job.job_id, row.owner_id, "another-server", 1, 15.0)
        with anyio.fail_after(30):
            while job.job_id in service._jobs.scopes:  # until ours dropped the job, its files closed
                await anyio.sleep(0.05)  # sleep-ok: its heartbeat notices the claim
        agents = service.job_folder(job.job_id).agents
    # the new owner rebuilds the working copies there: the old one removes none of them
    assert sorted(path.name for path in agents.iterdir()) == sorted(letters_of(job.job_id).values())


class ListJournal:
    def __init__(self) -> None:
        self.events: list[ProtocolEvent] = []

    async def append(self, event: ProtocolEvent) -> None:
        self.events.append(event)


def _orchestrator(fakes: FakeProviders, resume: Resume, journal: ListJournal, **options: Any) -> Orchestrator:
    team = Team.model_validate(team_data(fakes, TRIO, **options))
    environ = {KEY_ENV: "test-key-0123456789"}
    return Orchestrator(
        JOB,
        "What is 6 times 7?",
        team,
        MemorySink(),
        Shared(endpoint_factory(environ)),
        journal=journal,
        resume=resume,
    )


async def test_a_resumed_orchestrator_keeps_the_journals_answers_and_asks_only_the_rest(
    fakes: FakeProviders,
) -> None:
    install(fakes.script, TRIO, voter())
    letters = sorted(letters_of().values())
    posted = [
        AnswerPosted(letters[0], 1, "Answer from an earlier process: 42.", key="42"),
        AnswerPosted(letters[1], 2, "Another earlier answer: 42.", key="42"),
    ]
    journal = ListJournal()
    orchestrator = _orchestrator(fakes, Resume([Start(), *posted], {}, 3.0), journal)
    result = await orchestrator.run()
    sink = orchestrator.sink
    assert isinstance(sink, MemorySink)
    assert [event.label for event in sink.kinds("answer")] == [f"{letters[2]}1"]  # only the third
    # in flight: the third agent's first turn, and the turns the two answers gave the others
    assert sorted(sink.kinds("resumed")[0].turns) == letters
    assert result.consensus and set(result.tally) == {f"{letter}1" for letter in letters}
    # the journal goes on from the replayed events, which are not written again
    assert Start() not in journal.events and not set(posted) & set(journal.events)
    assert sum(isinstance(event, AnswerPosted) for event in journal.events) == 1
    assert sum(isinstance(event, VoteCast) for event in journal.events) >= 3
    texts = {a.content for a in orchestrator.state.answers}
    assert {"Answer from an earlier process: 42.", "Another earlier answer: 42."} <= texts


async def test_a_note_left_while_the_job_was_down_is_taken_after_the_replay_in_journal_order(
    fakes: FakeProviders,
) -> None:
    install(fakes.script, TRIO, voter())
    letters = sorted(letters_of().values())
    replayed = [Start(), AnswerPosted(letters[0], 1, "Answer from an earlier process: 42.", key="42")]
    journal = ListJournal()
    orchestrator = _orchestrator(fakes, Resume(replayed, {}, 3.0), journal)
    assert orchestrator.steer("answer in one word")  # delivered before the run, as steering.attach does
    result = await orchestrator.run()
    sink = orchestrator.sink
    assert isinstance(sink, MemorySink) and result.consensus
    kinds = [event.kind for event in sink.events]
    # the note meets the replayed job (its turns in flight), not a job that has not started
    assert kinds.index("resumed") < kinds.index("steered") and not sink.kinds("steered")[0].late
    # a second resume from the journal as written holds the same note: it was taken in journal order
    again = _orchestrator(fakes, Resume([*replayed, *journal.events], {}, 9.0), ListJournal())
    assert again.state.notes == ("answer in one word",) and again.state.phase == "done"


async def test_a_resumed_orchestrators_budget_counts_the_usage_before_the_takeover(
    fakes: FakeProviders,
) -> None:
    install(fakes.script, TRIO, voter())
    used = {letter: Usage(input_tokens=400, output_tokens=10, calls=1) for letter in letters_of().values()}
    orchestrator = _orchestrator(
        fakes, Resume([Start()], used, 1.0), ListJournal(), coordination={"max_tokens": 1000}
    )
    result = await orchestrator.run()
    assert result.budget_reached and result.winner is None
    assert not fakes.script.requests  # no call was made past the budget


def test_an_owner_on_another_machine_is_judged_by_its_lease_alone(tmp_path: Path) -> None:
    now = [1000.0]
    there, here = Store(tmp_path / "conclave.db"), Store(tmp_path / "conclave.db")
    for store, host in ((there, "worker-2"), (here, "worker-1")):  # two machines, one clock
        store._clock, store.host = lambda: now[0], host
    try:
        there.create_job(new_job("cj-00000000000a", "t"), dead_pid(), "its-owner")
        there.heartbeat("its-owner", 15.0)
        # its pid means nothing here: dead on this machine, the owner there holds its lease
        assert here.orphans(lambda pid: False, 15.0) == []
        assert there.orphans(lambda pid: False, 15.0) == [("cj-00000000000a", "its-owner")]
        now[0] += 16  # the lease ran out: any machine may take it over, one claim wins
        assert here.orphans(lambda pid: True, 15.0) == [("cj-00000000000a", "its-owner")]
        assert here.claim("cj-00000000000a", "its-owner", "new-owner", 42, 15.0)
        assert not there.claim("cj-00000000000a", "its-owner", "other-owner", 43, 15.0)
        row = here.job("cj-00000000000a")
        assert row is not None and (row.owner_id, row.owner_host) == ("new-owner", "worker-1")
        assert here.orphans(lambda pid: True, 15.0) == []
    finally:
        here.close()
        there.close()
