"""A job with files survives its server's `kill -9`: the next server resumes it from what is durable
(the copy made at its start, each posted answer's snapshot, the journal), rebuilds its workspaces and
containers, runs again only the turn in flight (on the files that turn started with) and no check
already reported, and ends with the diff and apply of an uninterrupted run of the same transcript
(jobs/upkeep/takeover.py, files/workspaces.py `restore`). Real `conclave serve --http` processes, real Docker,
the real SDKs and scripted fakes."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import anyio
import docker
import pytest
from fastmcp import Client

from conclave.jobs.read.views import JobView
from conclave.jobs.store.sql import AnswerRow, Store
from conclave.settings import Settings
from tests.fakes.calc_task import CALC, CHECK, TASK, agent, calc_project, label_of
from tests.fakes.processes import HTTP_TOKEN, http_process
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, write_team
from tests.fakes.waits import done_through, status_of

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_image")]
DOCKER = {"memory": "256m", "cpus": 1, "pids": 64}
HELD_S = 60.0  # bob's answer before the kill: its turn is in flight when the server dies


def held_bob(released: threading.Event) -> Any:
    """bob edits calc.py (its failing "fix"), then answers: that answer's reply is held until the test
    released it, so the server dies with bob's edit made and its answer not posted."""
    respond = agent("ann")

    def held(request: RecordedRequest) -> Reply:
        reply = respond(request)
        if label_of(request, "bob") is None and "replaced 1 occurrence" in request.text():
            reply.delay = 0.0 if released.is_set() else HELD_S
        return reply

    return held


async def until_bob_edited(client: Client, job_id: str, fakes: FakeProviders) -> JobView:
    """The job's view once ann and cy have answered and bob has edited calc.py (its answer held by
    `held_bob`), and the store has had time to commit what was reported: the moment to kill its server."""
    with anyio.fail_after(120):
        while (
            (view := await status_of(client, job_id)).progress is None
            or sum(a.answers for a in view.progress.agents) < 2
            or not any(
                r.agent == "bob" and "replaced 1 occurrence" in r.text() for r in fakes.script.requests
            )
        ):
            await anyio.sleep(0.05)  # sleep-ok: polls until ann and cy answered, bob edited
    await anyio.sleep(1.0)  # sleep-ok: the store's writer commits what was reported
    return view


def _ask(project: Path) -> dict[str, Any]:
    paths = [{"path": str(project), "permission": "write"}]
    return {
        "task": TASK,
        "team": "fake-files",
        "context_paths": paths,
        "verify": CHECK,
        "apply": True,
        "wait_seconds": 0,
    }


def _stored(home: Path, job_id: str) -> tuple[list[AnswerRow], int, dict[str, int], list[dict[str, Any]]]:
    """The job's answers, the calls its usage counts, how many times each answer's check was reported,
    and what each resume ran again, as stored."""
    store = Store.of(Settings(home=home))
    try:
        row = store.job(job_id)
        assert row is not None
        calls = sum(agent.usage.calls for agent in row.progress.agents) if row.progress else 0
        checked: dict[str, int] = {}
        for event in store.events(job_id, "checked"):
            checked[event.label] = checked.get(event.label, 0) + 1
        resumes = store.events(job_id, "resumed")
        return store.answers(job_id), calls, checked, resumes
    finally:
        store.close()


def _by_author(view: JobView) -> dict[str, str]:
    """Letter -> the fake agent's name (letters are shuffled per job)."""
    return {a.letter: a.model.rsplit("-", 1)[1] for a in view.agents}


def _patch_body(patch: str) -> str:
    """The patch without its first line, which names the project's folder."""
    return patch.split("\n", 1)[1]


async def test_kill_9_mid_job_with_files_then_a_restart_resumes_it_to_the_uninterrupted_diff(
    tmp_path: Path,
) -> None:
    home, config = tmp_path / "home", tmp_path / "config"
    project = calc_project(tmp_path)
    (tmp_path / "again").mkdir()
    again = calc_project(tmp_path / "again")  # the same project, for the uninterrupted run
    released = threading.Event()
    with FakeProviders() as fakes:
        fakes.script.set_default("ann", agent("ann"))
        fakes.script.set_default("bob", held_bob(released))
        fakes.script.set_default("cy", agent("ann"))
        teams = config / "conclave" / "teams"
        write_team(teams / "fake-files.yaml", fakes, TRIO, name="fake-files", sandbox=DOCKER)
        env = {"CONCLAVE_HOME": str(home), "XDG_CONFIG_HOME": str(config), KEY_ENV: "test-key"}
        env["CONCLAVE_CHECK_POOL"] = "0"
        with http_process(tmp_path, env) as (base, process):
            async with Client(f"{base}/mcp", auth=HTTP_TOKEN) as client:
                asked = (await client.call_tool("ask_team", _ask(project))).structured_content
                job_id = JobView.model_validate(asked).job_id
                view = await until_bob_edited(client, job_id, fakes)
            process.send_signal(signal.SIGKILL)  # bob's turn in flight: calc.py edited, no answer yet
            process.wait()
            released.set()
            fakes.settle()  # what the killed process had sent is recorded before the count
            requests_before = len(fakes.script.requests)
        answers_before, calls_before, _, _ = _stored(home, job_id)
        authors = _by_author(view)
        assert {authors[a.label[0]] for a in answers_before} == {"ann", "cy"} and not view.done
        assert project.joinpath("calc.py").read_text() == CALC  # nothing applied before the kill
        with http_process(tmp_path, env) as (base, process):
            async with Client(f"{base}/mcp", auth=HTTP_TOKEN) as client:
                resumed = await done_through(client, job_id)
                requests_after = len(fakes.script.requests) - requests_before  # the resumed job's alone
                patch = (
                    await client.call_tool(
                        "read_workspace", {"job_id": job_id, "path": "@diff", "limit": 100_000}
                    )
                ).structured_content
                whole_id = JobView.model_validate(
                    (await client.call_tool("ask_team", _ask(again))).structured_content
                ).job_id
                whole = await done_through(client, whole_id)
                whole_patch = (
                    await client.call_tool(
                        "read_workspace", {"job_id": whole_id, "path": "@diff", "limit": 100_000}
                    )
                ).structured_content
            process.terminate()
            assert process.wait(timeout=60) == 0
    assert resumed.state == "completed", resumed.phase
    answers_after, calls_after, checked, resumes = _stored(home, job_id)
    authors = _by_author(resumed)
    # one resume, which ran again bob's turn (ann and cy may have been voting too)
    assert len(resumes) == 1 and "bob" in {authors[letter] for letter in resumes[0].turns}
    # the answers posted before the kill are kept as they were; bob's turn ran again and answered once
    assert answers_after[: len(answers_before)] == answers_before
    assert sorted(authors[a.label[0]] for a in answers_after) == ["ann", "bob", "cy"]
    # every check reported once: none reported before the kill ran again
    assert sorted(checked) == sorted(a.label for a in answers_after) and set(checked.values()) == {1}
    # each call counted once: the calls charged before the kill, plus every request made after it
    assert calls_after == resumed.usage.calls == calls_before + requests_after
    # the same outcome, diff and apply as the uninterrupted run of the transcript
    assert resumed.result is not None and whole.result is not None
    for view in (resumed, whole):
        assert view.result is not None and view.result.winner is not None and view.result.consensus
        assert _by_author(view)[view.result.winner[0]] == "ann", view.text()
        checks = {_by_author(view)[label[0]]: text.split(" ")[0] for label, text in view.checks().items()}
        assert checks == {"ann": "passed", "bob": "failed", "cy": "failed"}
    assert patch is not None and whole_patch is not None
    assert _patch_body(patch["content"]) == _patch_body(whole_patch["content"])
    assert "-    return a - b\n+    return a + b\n" in patch["content"]
    assert project.joinpath("calc.py").read_bytes() == again.joinpath("calc.py").read_bytes()
    assert project.joinpath("calc.py").read_text() == CALC.replace("a - b", "a + b")
    # no container of the job is left, the dead server's included
    client = docker.from_env()
    try:
        assert not client.containers.list(all=True, filters={"label": f"conclave.job={job_id}"})
    finally:
        client.close()
