"""Copilot CLI as a member on the user's GitHub login, end to end: the real Copilot CLI 1.0.102 from npm,
in its container, with no own-key provider (no COPILOT_PROVIDER_*), logged in by the user's GitHub token
(COPILOT_GITHUB_TOKEN) or by the plaintext sign-in `copilot login` leaves in ~/.copilot/config.json.

It then calls GitHub's real hosts over HTTPS: api.github.com for the user's Copilot plan, which names the
plan's model host (api.individual.githubcopilot.com), then that host's models and Anthropic Messages.
Those names are served by fakes on 127.0.0.1 (tests/fakes/copilot_api.py, through
tests/fakes/login_hosts.py and the tests-only `ProviderRedirect`) after the member's egress proxy
admitted them by its allowlist; the container trusts the test CA.

Needs the Docker engine and the CLI image; skips, saying how to get them, without.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from conclave.backends.retry import RetryPolicy
from conclave.cli.doctor import run_checks
from conclave.config.presets import resolve_team
from conclave.jobs.service import JobService
from conclave.sandbox.allowlist import allowlist_for
from conclave.settings import Settings
from tests.fakes.cli_worker import CliWorker
from tests.fakes.copilot_api import AGENT, MODEL_HOST
from tests.fakes.environment import environment_of
from tests.fakes.leaks import holding
from tests.fakes.login_files import copilot_config
from tests.fakes.login_hosts import LoginHosts
from tests.fakes.waits import cli_job

pytestmark = pytest.mark.anyio
FAST = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.05)
GITHUB_TOKEN = "gho_" + "copilotgithublogin" * 2  # a GitHub OAuth token's shape (`gh auth token`'s)


@pytest.mark.parametrize("login", ["variable", "file"])
async def test_copilot_cli_works_from_the_users_github_login(
    clis_image: str,
    tmp_path: Path,
    project: Path,
    hosts: LoginHosts,
    login: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The member fixes add() with Copilot's own shell tool and decides; every call it makes carries the
    user's GitHub token and goes to api.github.com or the plan's model host, both on its allowlist, and
    nothing is refused; its usage is what the fake billed; the token reaches no file of the job, the
    project, the transcript, the events or the log; and every report says where the login comes from."""
    caplog.set_level(logging.DEBUG, logger="conclave")
    home = tmp_path / "user"
    environ = {"HOME": str(home)}
    config = home / ".copilot" / "config.json"
    if login == "variable":
        home.mkdir()
        environ["COPILOT_GITHUB_TOKEN"] = GITHUB_TOKEN
    else:
        config.parent.mkdir(parents=True)
        config.write_bytes(copilot_config(GITHUB_TOKEN))
        config.chmod(0o600)
    worker = CliWorker("anthropic", "sed -i 's/return a - b/return a + b/' calc.py", "Fixed add() (copilot).")
    hosts.script.set_default(AGENT, worker)
    team = tmp_path / "team.yaml"
    team.write_text("agents:\n  - model: cli/copilot\ncoordination: {final: reuse}\nsandbox: {memory: 2g}\n")
    settings = Settings(home=tmp_path / "state")
    async with JobService.serve(
        replace(environment_of(settings, environ, FAST), route=hosts.redirect())
    ) as service:
        listed = await service.lookup.teams()
        view = await cli_job(service, team, project, verify="pytest -q")
        patch = (await service.lookup.read(view.job_id, "@diff", None, 0, 100_000)).content
        transcript = (await service.lookup.read(view.job_id, "transcript", None, 0, 100_000)).content
        events = [event.model_dump_json() for event in service.store.sync.events(view.job_id)]

    print(view.text())
    for call in hosts.seen:
        print(call.method, call.host, call.path)
    assert view.state == "completed" and view.answer == "Fixed add() (copilot).", view.text()
    # it worked, then voted for its own answer, alone in view, without a decision run (cli_turns.py)
    assert "+    return a + b\n" in patch and not worker.decisions and view.result.tally
    assert "bash" in worker.tool_names  # Copilot's own shell tool ran the edit

    # GitHub's hosts saw the user's token and nothing else; the model host came from the plan's reply
    paths = [(call.host, call.path) for call in hosts.seen]
    assert ("api.github.com", "/copilot_internal/user") in paths and (MODEL_HOST, "/models") in paths
    turns = [call for call in hosts.seen if (call.host, call.path) == (MODEL_HOST, "/v1/messages")]
    assert turns and all(call.method == "POST" for call in turns)
    assert {call.authorization.partition(" ")[2] for call in hosts.seen} == {GITHUB_TOKEN}
    assert {call.authorization.partition(" ")[0].lower() for call in hosts.seen} == {"bearer"}
    assert not any("x-api-key" in call.headers for call in hosts.seen)
    assert {call.host for call in hosts.seen} == {"api.github.com", MODEL_HOST}
    assert not any(call.path.startswith("/mcp") for call in hosts.seen)  # its GitHub MCP server is off
    # the allowlist admits exactly these, and the member's proxy refused nothing
    assert all(allowlist_for("copilot").admits(host, 443) for host in ("api.github.com", MODEL_HOST))
    assert not [r for r in caplog.records if "egress" in r.getMessage() and "refused" in r.getMessage()]

    # usage is what the fake billed (from --usage-output-file: the stream carries none)
    member = view.agents[0]
    assert (member.usage.input_tokens, member.usage.output_tokens) == hosts.script.bill[AGENT][:2]
    assert member.usage.input_tokens > 0

    # the token never left the member's private HOME
    assert holding(tmp_path / "state", [GITHUB_TOKEN]) == [] and holding(project, [GITHUB_TOKEN]) == []
    assert GITHUB_TOKEN not in transcript and GITHUB_TOKEN not in patch
    assert not any(GITHUB_TOKEN in event for event in events) and GITHUB_TOKEN not in caplog.text
    if login == "file":
        assert config.read_bytes() == copilot_config(GITHUB_TOKEN)  # the user's file is left as it was

    # and every report says where the login comes from
    source = "COPILOT_GITHUB_TOKEN" if login == "variable" else str(config)
    assert [agent.model for agent in resolve_team("subscriptions", environ).agents] == ["cli/copilot"]
    preset = next(team for team in listed.teams if team.name == "subscriptions")
    assert preset.ready and [agent.cli for agent in preset.agents] == [
        f"logged in ({source}); runs in the CLI image (`conclave sandbox build --clis`)"
    ]
    probe = {probe.name: probe for probe in run_checks(settings, environ)}["cli/copilot"]
    assert probe.ok and probe.detail == f"logged in ({source})"
