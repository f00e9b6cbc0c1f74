"""Fair share between callers (jobs/run/fair_share.py): each caller waits in its own line, freed slots go to
the lines in turn, and one caller's burst neither refuses nor delays another caller's job."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError

from conclave.errors import QueueFull
from conclave.jobs.admission.admit import check_line
from conclave.jobs.read.views import JobView
from conclave.jobs.request import JobRequest
from conclave.jobs.run.fair_share import FairShare
from conclave.jobs.service import JobService
from conclave.jobs.store.owners import QUEUE_OWNER
from conclave.jobs.store.sql import Store
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.processes import http_server
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, install, voter, write_team
from tests.redis import Redis

pytestmark = pytest.mark.anyio

ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789ab"


async def test_a_freed_slot_goes_to_the_next_callers_line_before_the_same_callers_next_job() -> None:
    share = FairShare(total=2, per_caller=2)
    order: list[str] = []
    release = {name: anyio.Event() for name in ["a0", "a1", *(f"a{i}" for i in range(2, 8)), "b0"]}

    async def job(name: str) -> None:
        async with share.slot(name[0]):
            order.append(name)
            await release[name].wait()

    async with anyio.create_task_group() as tg:
        for i in range(8):  # a's burst: two run, six wait in a's line
            tg.start_soon(job, f"a{i}")
            await anyio.wait_all_tasks_blocked()
        tg.start_soon(job, "b0")
        await anyio.wait_all_tasks_blocked()
        assert order == ["a0", "a1"] and share.waiting("a") == 6 and share.waiting("b") == 1
        release["a0"].set()  # the first slot freed goes to b, not to a's next
        await anyio.wait_all_tasks_blocked()
        assert order == ["a0", "a1", "b0"]
        for name in release:
            release[name].set()
    assert order[3:] == [f"a{i}" for i in range(2, 8)]  # a's line kept its order


async def test_with_one_slot_the_callers_take_turns_whoever_queued_first() -> None:
    share = FairShare(total=1, per_caller=1)
    order: list[str] = []
    release = anyio.Event()

    async def job(name: str) -> None:
        async with share.slot(name[0]):
            order.append(name)
            await release.wait()

    async with anyio.create_task_group() as tg:
        for name in ("a0", "a1", "a2", "b0", "b1", "c0"):  # a's line is the oldest
            tg.start_soon(job, name)
            await anyio.wait_all_tasks_blocked()
        release.set()
    assert order == ["a0", "b0", "c0", "a1", "b1", "a2"]


async def test_a_caller_at_its_share_waits_while_another_callers_job_takes_a_free_slot() -> None:
    share = FairShare(total=3, per_caller=1)
    started: list[str] = []
    done = anyio.Event()

    async def job(name: str) -> None:
        async with share.slot(name[0]):
            started.append(name)
            await done.wait()

    async with anyio.create_task_group() as tg:
        for name in ("a0", "a1", "b0"):
            tg.start_soon(job, name)
            await anyio.wait_all_tasks_blocked()
        assert started == ["a0", "b0"] and share.waiting("a") == 1  # a1 waits for a's share, not a slot
        done.set()


async def test_a_waiting_job_cancelled_leaves_its_line_and_a_granted_one_hands_its_slot_on() -> None:
    share = FairShare(total=1, per_caller=1)
    started: list[str] = []
    hold = anyio.Event()
    scopes = {name: anyio.CancelScope() for name in ("b0", "c0", "d0")}

    async def job(name: str) -> None:
        with scopes[name]:
            async with share.slot(name[0]):
                started.append(name)
                await hold.wait()

    async with anyio.create_task_group() as tg:
        first = share.slot("a")
        await first.__aenter__()  # the test's own job holds the one slot
        for name in ("b0", "c0", "d0"):
            tg.start_soon(job, name)
            await anyio.wait_all_tasks_blocked()
        scopes["b0"].cancel()  # cancelled while it waits: it leaves its line
        await anyio.wait_all_tasks_blocked()
        assert share.waiting("b") == 0 and share.waiting("c") == 1
        await first.__aexit__(None, None, None)  # grants c0 its slot...
        scopes["c0"].cancel()  # ...which is cancelled as it gets it: the slot goes on to d0
        await anyio.wait_all_tasks_blocked()
        assert started[-1] == "d0" and share.running == {"d": 1}
        hold.set()
    assert not share.running


def test_a_full_queue_refuses_only_the_caller_with_the_longest_line(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, max_queued=16, max_queued_per_caller=30)
    check_line({"alice": 16}, "bob", settings)  # bob's first job: admitted past the full queue
    check_line({"alice": 16, "bob": 3}, "bob", settings)
    with pytest.raises(QueueFull, match=r"the job queue is full: 16 jobs .*CONCLAVE_MAX_QUEUED=16"):
        check_line({"alice": 16}, "alice", settings)
    with pytest.raises(QueueFull, match=r"caller 'alice'.*CONCLAVE_MAX_QUEUED_PER_CALLER=30"):
        check_line({"alice": 30}, "alice", Settings(home=tmp_path, max_queued=100, max_queued_per_caller=30))


@pytest.fixture
def fakes() -> Iterator[FakeProviders]:
    with FakeProviders() as running:
        install(running.script, TRIO, voter(delay=0.6))
        yield running


async def test_over_http_a_callers_thirty_queued_jobs_neither_refuse_nor_hold_back_anothers(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    home, config = tmp_path / "home", tmp_path / "config"
    write_team(config / "conclave" / "teams" / "fake-trio.yaml", fakes, TRIO, name="fake-trio")
    home.mkdir(mode=0o700)
    tokens = home / "http-tokens.json"
    tokens.write_text(json.dumps({"alice": ALICE, "bob": BOB}))
    tokens.chmod(0o600)
    env = {
        "CONCLAVE_HOME": str(home),
        "XDG_CONFIG_HOME": str(config),
        KEY_ENV: "test-key",
        "CONCLAVE_MAX_JOBS": "1",
        "CONCLAVE_MAX_QUEUED": "30",
        "CONCLAVE_MAX_QUEUED_PER_CALLER": "30",
    }
    ask = {"task": "What is 6 * 7?", "team": "fake-trio", "wait_seconds": 0}
    with http_server(tmp_path, env, token=None) as url:
        async with Client(url, auth=ALICE) as alice, Client(url, auth=BOB) as bob:
            mine = [await _ask(alice, ask)]
            with anyio.fail_after(30):
                while (await _view(alice, mine[0].job_id)).state != "running":
                    await anyio.sleep(0.1)  # sleep-ok: polls the store through get_status
            mine += [await _ask(alice, ask) for _ in range(30)]
            with pytest.raises(ToolError, match="CONCLAVE_MAX_QUEUED_PER_CALLER=30"):
                await alice.call_tool("ask_team", ask)  # alice's line is full: 1 runs, 30 wait
            # the queue is full (CONCLAVE_MAX_QUEUED=30), but bob's line is the shorter one
            asked = JobView.model_validate((await bob.call_tool("ask_team", ask)).structured_content)
            assert asked.state == "queued"
            assert "next in bob's line" in asked.phase and "CONCLAVE_MAX_JOBS=1" in asked.phase
            last = await _view(alice, mine[-1].job_id)
            assert "29 of alice's jobs ahead of it" in last.phase
            with pytest.raises(ToolError, match="no such job"):
                await bob.call_tool("get_status", {"job_id": mine[0].job_id})  # alice's is not bob's
            done = JobView.model_validate(
                (
                    await bob.call_tool("get_status", {"job_id": asked.job_id, "wait_seconds": 45})
                ).structured_content
            )
            assert done.state == "completed"
    store = Store.of(Settings(home=home))
    try:
        rows = {job.job_id: store.job(job.job_id) for job in [*mine, asked]}
    finally:
        store.close()
    bobs = rows[asked.job_id]
    assert bobs is not None and bobs.started_at is not None
    # every alice job that started after bob asked started after bob's: the first freed slot was bob's
    later = [r for r in rows.values() if r and r.started_at and r.started_at > bobs.created_at]
    assert min(later, key=lambda r: r.started_at or 0).id == asked.job_id
    # so bob waited for one job's end, not for alice's line: only the job running when he asked ended first
    ended_before = [r for r in rows.values() if r and r.finished_at and r.finished_at < bobs.started_at]
    assert [r.id for r in ended_before] == [mine[0].job_id]


async def _ask(client: Client, arguments: dict[str, object]) -> JobView:
    return JobView.model_validate((await client.call_tool("ask_team", arguments)).structured_content)


async def _view(client: Client, job_id: str) -> JobView:
    return JobView.model_validate(
        (await client.call_tool("get_status", {"job_id": job_id})).structured_content
    )


@pytest.mark.parametrize(
    ("callers", "per_caller", "total", "admitted"),
    [
        (("alice",), 16, 100, {"alice": 16}),  # CONCLAVE_MAX_QUEUED_PER_CALLER
        (("alice",), 100, 12, {"alice": 12}),  # CONCLAVE_MAX_QUEUED
        (("alice", "bob"), 10, 100, {"alice": 10, "bob": 10}),  # each caller's own line
    ],
)
async def test_asks_sent_at_once_through_two_fronts_are_admitted_exactly_to_the_limits(
    tmp_path: Path,
    queue_fakes: FakeProviders,
    redis: Redis,
    callers: tuple[str, ...],
    per_caller: int,
    total: int,
    admitted: dict[str, int],
) -> None:
    """64 asks at once, half to each of two fronts of one queue: what is stored as queued is exactly what
    the limits allow, and every other ask was refused, whatever order the checks interleaved in."""
    team = str(write_team(tmp_path / "team.yaml", queue_fakes, TRIO))
    settings = Settings(
        home=tmp_path / "state",
        queue_url=redis.url(),
        max_queued=total,
        max_queued_per_caller=per_caller,
    )
    env = {KEY_ENV: "test-key"}
    told: dict[str, int] = dict.fromkeys(callers, 0)
    refused = 0

    async def ask(front: JobService, caller: str) -> None:
        nonlocal refused
        try:
            await front.submit(JobRequest(task="What is 6 * 7?", team=team), caller)
            told[caller] += 1
        except QueueFull:
            refused += 1

    async with (
        JobService.serve(environment_of(settings, env)) as one,
        JobService.serve(environment_of(settings, env)) as two,
    ):
        async with anyio.create_task_group() as tg:
            for index in range(64):
                tg.start_soon(ask, (one, two)[index % 2], callers[index // 2 % len(callers)])
        queued = await one.store.queued_by_caller(QUEUE_OWNER)
    assert queued == admitted and told == admitted
    assert refused == 64 - sum(admitted.values())


@pytest.fixture
def queue_fakes() -> Iterator[FakeProviders]:
    with FakeProviders() as running:  # no job runs (no worker): the team's servers only answer probes
        yield running
