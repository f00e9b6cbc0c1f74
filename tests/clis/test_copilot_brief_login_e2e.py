"""Copilot CLI's brief runs on the user's GitHub login, end to end: the real Copilot CLI 1.0.102 in its
container decides and presents through its server mode (clis/copilot.py `BRIEF_SESSION`), logged in by
COPILOT_GITHUB_TOKEN or by its sign-in's ~/.copilot/config.json, against GitHub's hosts as
tests/fakes/copilot_api.py serves them (through tests/fakes/login_hosts.py, as in
test_copilot_login_e2e.py); an API member on the fake providers gives it a real choice. Needs the Docker
engine and the CLI image; skips, saying how to get them, without."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from conclave.coordination.cli_turns import DECISION_SYSTEM
from conclave.coordination.prompts import PRESENT_SYSTEM
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.clis.test_cli_members_e2e import ENV, FAST, KEY
from tests.fakes.calc_task import TASK
from tests.fakes.cli_worker import (
    DECISION_MARK,
    PRESENT_MARK,
    CliWorker,
    _first_user_text,
    _tool_names,
    answer_held,
)
from tests.fakes.copilot_api import AGENT, MODEL_HOST
from tests.fakes.environment import environment_of
from tests.fakes.login_files import copilot_config
from tests.fakes.login_hosts import LoginHosts
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import decide, vote_labels
from tests.fakes.waits import until_cli_done_opening

pytestmark = pytest.mark.anyio
GITHUB_TOKEN = "gho_" + "copilotbrieflogin0" * 2  # a GitHub OAuth token's shape (`gh auth token`'s)


@pytest.mark.parametrize("login", ["variable", "file"])
async def test_copilot_decides_and_presents_with_our_prompt_on_a_github_login(
    clis_image: str, tmp_path: Path, project: Path, hosts: LoginHosts, fakes: FakeProviders, login: str
) -> None:
    """The member fixes add(); the API member answers that nothing needed changing and votes for its own
    answer. The member's decision and its presentation (the vote is split) each reach the plan's model
    host with our system prompt, only `view`, and the user's token; its usage is what the fake billed,
    its brief runs' included (their stream's usage events: no usage file in server mode)."""
    worker = CliWorker("anthropic", "sed -i 's/return a - b/return a + b/' calc.py", "Fixed add() (copilot).")
    api_in = threading.Event()
    hosts.script.set_default(AGENT, answer_held(worker, api_in))

    def api(request: RecordedRequest) -> Reply:
        if "(your own answer)" not in request.text():
            return decide("new_answer", {"content": "calc.py looks right to me; I changed nothing."}, request)
        own = re.findall(r"## Answer ([A-P][0-9]+) \(your own answer\)", request.text())
        return decide("vote", {"answer": (own or vote_labels(request))[0], "reason": "mine"}, request)

    fakes.script.set_default("api", api)
    team = tmp_path / "team.yaml"
    team.write_text(f"""\
agents:
  - model: cli/copilot
  - model: openai/gpt-fake
    base_url: {fakes.base_url("openai", "api")}
    api_key_env: {KEY}
coordination: {{max_answers_per_agent: 1, final: present, timeout_s: 900}}
sandbox: {{memory: 2g, cpus: 1}}
""")
    home = tmp_path / "user"
    environ = {**ENV, "HOME": str(home)}
    if login == "variable":
        home.mkdir()
        environ["COPILOT_GITHUB_TOKEN"] = GITHUB_TOKEN
    else:  # the plaintext sign-in `copilot login` leaves
        (home / ".copilot").mkdir(parents=True)
        (home / ".copilot" / "config.json").write_bytes(copilot_config(GITHUB_TOKEN))
    settings = Settings(home=tmp_path / "state")
    async with JobService.serve(
        replace(environment_of(settings, environ, FAST), route=hosts.redirect())
    ) as service:
        request = JobRequest(
            task=TASK, team=str(team), context_paths=[{"path": str(project)}], verify="pytest -q"
        )
        gates = {api_in: lambda agent: agent.model == "openai/gpt-fake" and bool(agent.answers)}
        view = await until_cli_done_opening(service, await service.submit(request), gates, 300)
    print(view.text())
    letters = {agent.model: agent.letter for agent in view.agents}
    assert view.state == "completed" and view.result.winner == f"{letters['cli/copilot']}1", view.text()
    assert worker.decisions

    turns = [call for call in hosts.seen if (call.host, call.path) == (MODEL_HOST, "/v1/messages")]
    assert turns and {call.authorization.partition(" ")[2] for call in hosts.seen} == {GITHUB_TOKEN}
    sent = hosts.script.requests_of(AGENT)
    for mark, system in ((DECISION_MARK, DECISION_SYSTEM), (PRESENT_MARK, PRESENT_SYSTEM)):
        brief = [r for r in sent if mark in _first_user_text(r.body, "anthropic")]
        assert brief, mark
        for request in brief:
            assert _tool_names(request.body) == ["view"], _tool_names(request.body)
            assert json.dumps(system)[1:80] in json.dumps(request.body.get("system")), request.body.get(
                "system"
            )
    member = next(agent for agent in view.agents if agent.model == "cli/copilot")
    assert (member.usage.input_tokens, member.usage.output_tokens) == hosts.script.bill[AGENT][:2]
