"""Steering a running job: the protocol's rule, and a job whose agents change their answer after a note
(scripted fakes that react to it, through the real SDKs), from this process and from another one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from conclave.backends.retry import RetryPolicy
from conclave.coordination.protocol_events import CancelTurn, Start, StartTurn, Steer
from conclave.errors import InputError, JobFinished
from conclave.jobs.read.views import JobView
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, decide, is_presentation, vote_labels, write_team
from tests.test_protocol import Job, first_answers

ENV = {KEY_ENV: "test-key-0123456789"}
FAST = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05)
NOTE = "Answer in French."


# The protocol ------------------------------------------------------------------------------------
def test_a_note_clears_every_vote_and_every_later_turn_shows_it() -> None:
    job = Job(3)
    first_answers(job, "ABC")
    job.vote("A", "B1")
    job.vote("B", "B1")
    assert job.c.tally()["B1"] == 2
    version = job.c.version
    actions = job.feed(Steer(NOTE))
    assert job.c.tally() == {"A1": 0, "B1": 0, "C1": 0}  # votes cast before the note no longer count
    assert job.c.version == version + 1 and job.c.notes == (NOTE,)
    assert {a.letter for a in actions if isinstance(a, StartTurn)} == {"A", "B", "C"}
    assert all(a.notes == (NOTE,) for a in actions if isinstance(a, StartTurn))
    # C was thinking about its vote (no work yet): its turn restarts with the note
    assert any(isinstance(a, CancelTurn) and a.letter == "C" for a in actions)


def test_a_first_answer_that_is_only_thinking_restarts_but_one_doing_work_keeps_going() -> None:
    job = Job(3)
    job.work("B")  # B has started editing files: its turn goes on
    actions = job.feed(Steer(NOTE))
    restarted = {a.letter for a in actions if isinstance(a, StartTurn)}
    assert restarted == {"A", "C"} and not any(isinstance(a, CancelTurn) and a.letter == "B" for a in actions)
    assert job.started("A").note.startswith("the person who asked added a note")


def test_a_note_before_the_start_rides_on_the_first_turns_and_one_after_the_end_changes_nothing() -> None:
    from conclave.coordination.protocol import Coordination

    c = Coordination(["A", "B"])
    assert c.apply(Steer(NOTE)) == []
    assert all(a.notes == (NOTE,) for a in c.apply(Start()) if isinstance(a, StartTurn))
    job = Job(1, present=False)
    job.answer("A")
    job.vote("A", "A1")
    assert job.c.phase == "done"
    assert job.feed(Steer("too late")) == [] and job.c.notes[-1] == "too late"


# A real job --------------------------------------------------------------------------------------
def reacting(request: RecordedRequest) -> Reply:
    """Answers in English until the note is in its prompt, then in French; votes for its own language."""
    french = NOTE in request.text()
    if is_presentation(request):
        return Reply(text="FINAL: quarante-deux" if french else "FINAL: forty-two")
    words = "quarante-deux" if french else "forty-two"
    labels = vote_labels(request)
    mine = f"Answer ({request.agent}): {words}."
    own = "(your own answer)" in request.text()
    if not own or (french and not _is_french_own(request)):
        return decide("new_answer", {"content": mine}, request)
    wanted = [label for label in labels if _in_language(request, label, french)]
    slow = request.agent == "cy" and not french  # cy still thinks about its vote when the note comes
    return Reply(
        tool_calls=[("vote", {"answer": (wanted or labels)[0], "reason": "right language"})],
        delay=5.0 if slow else 0.2,
    )


def _section(request: RecordedRequest, label: str) -> str:
    return request.text().split(f"## Answer {label}", 1)[-1].split("## Answer", 1)[0]


def _in_language(request: RecordedRequest, label: str, french: bool) -> bool:
    return ("quarante" in _section(request, label)) == french


def _is_french_own(request: RecordedRequest) -> bool:
    own = [label for label in vote_labels(request) if "(your own answer)" in _section(request, label)]
    return bool(own) and _in_language(request, own[0], True)


@pytest.fixture
def fakes() -> Iterator[FakeProviders]:
    with FakeProviders() as running:
        yield running


async def wait_for(service: JobService, job_id: str, what) -> JobView:  # type: ignore[no-untyped-def]
    with anyio.fail_after(60):
        while not what(view := await service.lookup.view(job_id)):
            await anyio.sleep(0.05)
    return view


@pytest.mark.anyio
@pytest.mark.parametrize("where", ["here", "another process"])
async def test_a_note_mid_job_changes_the_answers_and_the_votes_before_it_do_not_count(
    tmp_path: Path, fakes: FakeProviders, where: str
) -> None:
    for _, agent in TRIO:
        fakes.script.set_default(agent, reacting)
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO, coordination={"timeout_s": 60}))
    settings = Settings(home=tmp_path / "state")
    async with JobService.serve(environment_of(settings, ENV, FAST)) as service:
        job_id = (await service.submit(JobRequest(task="What is 6 * 7? Answer in words.", team=team))).job_id
        before = await wait_for(service, job_id, lambda v: any(a.vote for a in v.agents) or v.done)
        assert not before.done, "the job ended before the note could be left"
        if where == "here":
            steered = await service.steer(job_id, NOTE)
        else:  # the CLI's way: another service on the same store writes the note, this one delivers it
            async with JobService.serve(environment_of(settings, ENV)) as other:
                steered = await other.steer(job_id, NOTE)
        assert steered.notes and steered.notes[0].text == NOTE
        view = await wait_for(service, job_id, lambda v: v.done)
        transcript = (await service.lookup.read(job_id, "transcript", None, 0, 100_000)).content
        with pytest.raises(JobFinished, match="follow_up="):
            await service.steer(job_id, "one more thing")
        with pytest.raises(InputError, match="message="):
            await service.steer(job_id, "  ")

    assert view.state == "completed" and "quarante-deux" in (view.answer or ""), view.text()
    assert view.notes[0].seen and view.notes[0].round is not None
    votes_before = [e for e in transcript.splitlines() if " voted for " in e]
    assert votes_before, transcript
    # every vote that counted in the end was cast after the note, for a French answer
    answers = await _answers(settings, job_id)
    assert "quarante" in answers[view.result.winner or ""]
    assert view.result.tally and all(
        "quarante" in answers[label] for label, count in view.result.tally.items() if count
    )
    assert "A note from the person who asked: Answer in French." in transcript
    assert "The note reached the agents in round" in transcript
    after = [r for r in fakes.script.requests if NOTE in r.text()]
    assert after and all("Notes from the person who asked" in r.text() for r in after)


async def _answers(settings: Settings, job_id: str) -> dict[str, str]:
    from conclave.jobs.store.sql import Store

    store = Store.of(settings)
    try:
        return {answer.label: answer.content for answer in store.answers(job_id)}
    finally:
        store.close()


# Over MCP: steer_job from real clients ------------------------------------------------------------------
@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_steer_job_over_mcp_changes_the_answers(
    tmp_path: Path, fakes: FakeProviders, transport: str
) -> None:
    from fastmcp import Client
    from mcp.client.client import Client as McpClient

    from tests.fakes.processes import HTTP_TOKEN, http_server, stdio_params

    for _, agent in TRIO:
        fakes.script.set_default(agent, reacting)
    config = tmp_path / "config"
    write_team(
        config / "conclave" / "teams" / "steerable.yaml",
        fakes,
        TRIO,
        name="steerable",
        coordination={"timeout_s": 60},
    )
    env = {"CONCLAVE_HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(config), **ENV}
    server_cm = http_server(tmp_path, env) if transport == "http" else None
    if server_cm is None:
        params = stdio_params(tmp_path)
        params.env = {**(params.env or {}), **env}
        client_cm: object = McpClient(params)
    else:
        client_cm = Client(server_cm.__enter__(), auth=HTTP_TOKEN)
    try:
        async with client_cm as client:  # type: ignore[attr-defined]

            async def call(name: str, arguments: dict[str, object]) -> JobView:
                result = await client.call_tool(name, arguments)
                assert not result.is_error, result.content[0].text
                return JobView.model_validate(result.structured_content)

            view = await call(
                "ask_team",
                {"task": "What is 6 * 7? Answer in words.", "team": "steerable", "wait_seconds": 0},
            )
            with anyio.fail_after(60):
                while not any(a.vote for a in view.agents) and not view.done:
                    view = await call("get_status", {"job_id": view.job_id, "wait_seconds": 1})
            assert not view.done
            steered = await call("steer_job", {"job_id": view.job_id, "message": NOTE})
            assert (
                steered.notes[0].text == NOTE
                and steered.notes[0].seen
                and steered.votes()[0] in ({}, {label: 0 for label in steered.votes()[0]})
            )  # the votes before the note no longer count
            with anyio.fail_after(60):
                while not view.done:
                    view = await call("get_status", {"job_id": view.job_id, "wait_seconds": 20})
            extra = {"raise_on_error": False} if transport == "http" else {}  # FastMCP raises by default
            late = await client.call_tool("steer_job", {"job_id": view.job_id, "message": "more"}, **extra)
    finally:
        if server_cm is not None:
            server_cm.__exit__(None, None, None)
    assert view.state == "completed" and "quarante-deux" in (view.answer or ""), view.text()
    assert late.is_error and "follow_up=" in late.content[0].text
