"""A CLI member's revision goes stale: the real Codex in its container, an API agent beside it, both on
the fakes (tests/clis/test_cli_members_e2e.py has the set-up).

Codex answers (its fix), sees the API agent's answer and decides to write a new one. Its revision's work
run starts a `setsid` child through Codex's own shell tool, then waits on its model, which the fake holds
(a gate the test never opens while the job runs). The test then lets the API agent post its second
answer: the revision is moot, so its turn is cancelled (coordination/cli_turns.py: a CLI's work run does
not count as the protocol's work) and the CLI's whole process tree is killed (clis/member.py). Codex's
next run decides on the current answers, the new one among them, and the job ends with a winner.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import anyio
import anyio.to_thread
import docker
import pytest

from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.clis.test_cli_members_e2e import ENV, FAST, KEY
from tests.fakes.calc_task import TASK
from tests.fakes.cli_worker import DECISION_MARK, WORK_MARK, CliWorker, _first_user_text
from tests.fakes.container_processes import container_processes
from tests.fakes.environment import environment_of
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import decide, own_letter, vote_labels
from tests.fakes.waits import until_cli_done

pytestmark = pytest.mark.anyio
FIX = "sed -i 's/return a - b/return a + b/' calc.py"
MARKER = "conclave-stale-revision"
FIRST = "calc.py looks right to me; I changed nothing."
SECOND = "On a second look: add() must return a + b, as the test says."
LIMIT_S = 90.0  # under the fakes' GATE_LIMIT_S (120 s), which would let the held revision call go


def _team(path: Path, fakes: FakeProviders) -> str:
    path.write_text(f"""\
agents:
  - model: cli/codex:gpt-5.5
    base_url: {fakes.base_url("responses", "codex")}
    api_key_env: {KEY}
  - model: openai/gpt-fake
    base_url: {fakes.base_url("openai", "api")}
    api_key_env: {KEY}
coordination: {{max_answers_per_agent: 2, final: reuse}}
sandbox: {{memory: 2g}}
""")
    return str(path)


async def _until(event: threading.Event, what: str) -> None:
    """Until a fake has set `event` (it runs in the fakes' threads); fails the test after LIMIT_S."""
    if not await anyio.to_thread.run_sync(event.wait, LIMIT_S, abandon_on_cancel=True):
        pytest.fail(f"{what} never happened within {LIMIT_S:g} s")


async def test_a_stale_revisions_run_is_killed_and_the_member_decides_on_the_new_answer(
    clis_image: str, tmp_path: Path, fakes: FakeProviders, project: Path
) -> None:
    codex = CliWorker("responses", FIX, "Fixed add() in calc.py.")
    child = f"setsid sh -c 'sleep 600; echo {MARKER}' >/dev/null 2>&1 & echo ok"
    revision = CliWorker("responses", child, "")
    held = threading.Event()  # the revision's run waits on its model, its `setsid` child started
    peer = threading.Event()  # the test lets the API agent post its second answer
    asked = threading.Event()  # Codex's next run reached its model (the revision's run is over by then)
    looked = threading.Event()  # the test has looked at the container: that run may go on
    release = threading.Event()  # the revision's held call, let go when the test ends
    later: list[str] = []  # Codex's prompts after the kill

    def respond(request: RecordedRequest) -> Reply:
        prompt = _first_user_text(request.body, "responses")
        if DECISION_MARK in prompt and held.is_set():  # its turn after the kill: vote for the new answer
            later.append(prompt)
            asked.set()
            label = next((label for label, text in _blocks(prompt) if SECOND in text), "")
            vote = {"decision": "vote", "answer": label, "reason": "the newest"}
            return Reply(text=json.dumps(vote), gate=looked)
        if DECISION_MARK in prompt:  # revise once it sees the peer's answer, else keep its own
            choice = "new_answer" if FIRST in prompt else "vote"
            label = "" if FIRST in prompt else _blocks(prompt)[0][0]
            return Reply(text=json.dumps({"decision": choice, "answer": label, "reason": "a better fix"}))
        if WORK_MARK in prompt and "Your own current answer" in prompt:  # the revision
            reply = revision(request)
            if revision.tool_results:  # the shell ran: now the run waits on its model
                held.set()
                return Reply(text="never", gate=release)
            return reply
        return codex(request)

    posted: list[int] = []

    def api(request: RecordedRequest) -> Reply:
        text, letter = request.text(), own_letter(request)
        if "(your own answer)" not in text:
            return decide("new_answer", {"content": FIRST}, request)
        if codex.answer in text and not posted:  # Codex's fix is shown: its second answer, when let go
            posted.append(1)
            reply = decide("new_answer", {"content": SECOND}, request)
            reply.gate = peer
            return reply
        own = max(label for label in vote_labels(request) if label[0] == letter)
        return decide("vote", {"answer": own, "reason": "mine"}, request)

    fakes.script.set_default("codex", respond).set_default("api", api)
    team = _team(tmp_path / "team.yaml", fakes)
    try:
        async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
            view = await service.submit(
                JobRequest(task=TASK, team=team, context_paths=[{"path": str(project)}])
            )
            await _until(held, "Codex's revision")
            agents = (await service.lookup.view(view.job_id)).agents
            letter = next(agent.letter for agent in agents if agent.model.startswith("cli/"))
            labels = [f"conclave.job={view.job_id}", f"conclave.agent={letter}"]
            container = docker.from_env().containers.list(ignore_removed=True, filters={"label": labels})[0]
            running = container_processes(container)
            assert "Your own current answer" in running and MARKER in running, running
            peer.set()
            await _until(asked, "Codex's next run after the revision went stale")
            running = container_processes(container)
            looked.set()
            view = await until_cli_done(service, view)
            events = list(service.store.sync.events(view.job_id))
    finally:
        release.set()
        peer.set()
        looked.set()
    print(view.text())
    # the revision's CLI and the child it started are gone, while the member's next run is under way
    assert "Your own current answer" not in running and MARKER not in running, running
    assert 'Decide: "vote" for the answer' in running, running  # its decision run
    mine = [(index, event) for index, event in enumerate(events) if event.letter == letter]
    work = [index for index, event in mine if event.kind == "tool_call"]
    assert len(work) == 2, [event.kind for _, event in mine]  # the first answer's run and the revision's
    assert any(event.kind == "turn_cancelled" and index > work[1] for index, event in mine)
    # it decided against the current answers: the peer's second answer was in its next prompt
    assert later and SECOND in later[0] and FIRST not in later[0], later
    assert next(agent for agent in view.agents if agent.letter == letter).answers == 1  # no revision landed
    assert view.state == "completed" and view.result and view.result.winner, view.text()
    assert any(event.kind == "vote" and event.letter == letter for _, event in mine)


def _blocks(prompt: str) -> list[tuple[str, str]]:
    """The answers a decision prompt shows, in its order: (label, text)."""
    parts = prompt.split("=== ")[1:]
    return [(part.split(" ", 1)[0], part.split("===", 1)[-1]) for part in parts]
