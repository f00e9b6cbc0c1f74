"""CLI members on the user's own login, end to end: the real Claude Code and Codex from npm, inside
their containers, using the login files a user's sign-in left in their home (a Claude plan's
`.credentials.json`, a ChatGPT plan's `auth.json`), with no key and no base_url.

With a login the CLIs talk to their providers' real hosts over HTTPS (api.anthropic.com,
chatgpt.com/backend-api/codex). Here those names are served by fakes on 127.0.0.1 with a test CA's
certificate (tests/fakes/login_hosts.py): each member's egress proxy admits the host by its allowlist,
then connects it to the fake (the tests' `ProviderRedirect` route, tests/fakes/redirect.py), and the
container trusts the test CA. What the fakes see is what the providers would: the login's token.

Needs the Docker engine and the CLI image; skips, saying how to get them, without.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from conclave.backends.retry import RetryPolicy
from conclave.cli.doctor import run_checks
from conclave.config.presets import resolve_team
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.calc_task import TASK
from tests.fakes.cli_worker import CliWorker, answer_held
from tests.fakes.environment import environment_of
from tests.fakes.leaks import holding, tokens
from tests.fakes.login_files import claude_credentials, codex_auth, codex_claims, gemini_oauth_creds, jwt
from tests.fakes.login_hosts import LoginHosts, Seen
from tests.fakes.waits import cli_job, until_cli_done_opening

pytestmark = pytest.mark.anyio
FAST = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.05)
CLAUDE_TOKEN = "sk-ant-oat01-" + "claudeplanlogin" * 4
CLAUDE_REFRESH = "sk-ant-ort01-" + "claudeplanrefresh" * 4
CODEX_ACCOUNT = "acct-conclave-login-0123"
CODEX_TOKEN = jwt(codex_claims(CODEX_ACCOUNT, "chatgpt-plan-access-token"))
CODEX_REFRESH = "rt-" + "chatgptplanrefresh" * 4


@pytest.fixture
def user_home(tmp_path: Path) -> Path:
    """A user's home after signing in to Claude Code and Codex: their login files, nothing else."""
    home = tmp_path / "user"
    (home / ".claude").mkdir(parents=True)
    (home / ".codex").mkdir()
    (home / ".claude" / ".credentials.json").write_bytes(claude_credentials(CLAUDE_TOKEN, CLAUDE_REFRESH))
    (home / ".codex" / "auth.json").write_bytes(codex_auth(CODEX_TOKEN, CODEX_REFRESH, CODEX_ACCOUNT))
    for path in home.rglob("*.json"):
        path.chmod(0o600)
    return home


def login_secrets(home: Path) -> list[str]:
    """Every token of the user's login files (access, refresh, ID tokens)."""
    return [token for path in home.rglob("*.json") for token in tokens(path.read_bytes())]


def model_calls(seen: list[Seen], host: str, path: str) -> list[Seen]:
    return [call for call in seen if call.host == host and call.path.startswith(path)]


async def test_claude_code_and_codex_work_from_the_users_login_files(
    clis_image: str,
    tmp_path: Path,
    user_home: Path,
    project: Path,
    hosts: LoginHosts,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Both members log in with the user's files, copied into their containers' private tmpfs HOMEs;
    the providers see the plans' tokens; the job completes, charged what the fakes billed; and no token
    of either file lands in the job's state (workspaces, snapshots, check copies, the patch, final/),
    the project, the transcript, the events or the server's log."""
    caplog.set_level(logging.DEBUG, logger="conclave")
    environ = {"HOME": str(user_home)}  # no key variable: the login files are the only way in
    before = {path: path.read_bytes() for path in user_home.rglob("*.json")}
    claude = CliWorker(
        "anthropic",
        "sed -i 's/return a - b/return a + b/' calc.py && python3 -m pytest -q",
        "Fixed add() in calc.py: it subtracted; the test passes now.",
    )
    codex = CliWorker("responses", "sed -i 's/return a - b/return a * b/' calc.py", "add() now multiplies.")
    # Codex's answer waits until Claude Code has voted on its own: no decision run is then cut short by
    # a new answer (a killed Codex run is charged an estimate, clis/member.py)
    claude_voted = threading.Event()
    hosts.script.set_default("claude", claude).set_default("codex", answer_held(codex, claude_voted))
    team = tmp_path / "team.yaml"
    team.write_text(
        "name: plans\nagents:\n  - model: cli/claude-code\n  - model: cli/codex:gpt-5.5\n"
        "coordination: {max_answers_per_agent: 1, final: reuse, timeout_s: 900}\n"
        "sandbox: {memory: 2g, cpus: 1}\n"
    )
    settings = Settings(home=tmp_path / "state")
    async with JobService.serve(
        replace(environment_of(settings, environ, FAST), route=hosts.redirect())
    ) as service:
        listed = await service.lookup.teams()
        view = await service.submit(
            JobRequest(task=TASK, team=str(team), context_paths=[{"path": str(project)}], verify="pytest -q")
        )
        gates = {claude_voted: lambda agent: agent.model == "cli/claude-code" and bool(agent.vote)}
        view = await until_cli_done_opening(service, view, gates, 600)
        patch = (await service.lookup.read(view.job_id, "@diff", None, 0, 100_000)).content
        transcript = (await service.lookup.read(view.job_id, "transcript", None, 0, 100_000)).content
        events = [event.model_dump_json() for event in service.store.sync.events(view.job_id)]

    print(view.text())
    letters = {agent.model: agent.letter for agent in view.agents}
    mine, theirs = letters["cli/claude-code"], letters["cli/codex:gpt-5.5"]
    assert view.state == "completed" and view.result.winner == f"{mine}1", view.text()
    assert view.checks()[f"{mine}1"].startswith("passed") and view.checks()[f"{theirs}1"].startswith("failed")
    assert "-    return a - b\n+    return a + b\n" in patch and "a * b" not in patch
    assert claude.decisions and codex.decisions  # each voted, through its own CLI

    # the providers saw the plans' tokens, and no API key
    messages = model_calls(hosts.seen, "api.anthropic.com", "/v1/messages")
    responses = model_calls(hosts.seen, "chatgpt.com", "/backend-api/codex/responses")
    assert messages and {call.authorization for call in messages} == {f"Bearer {CLAUDE_TOKEN}"}
    assert not any("x-api-key" in call.headers for call in messages)
    assert responses and {call.authorization for call in responses} == {f"Bearer {CODEX_TOKEN}"}
    assert {call.headers.get("chatgpt-account-id") for call in responses} == {CODEX_ACCOUNT}
    assert {call.host for call in hosts.seen} <= {"api.anthropic.com", "chatgpt.com"}  # no refresh needed

    # usage is what the fakes billed, per member; Claude Code prices its run
    usage = {agent.letter: agent.usage for agent in view.agents}
    for letter, fake in ((mine, "claude"), (theirs, "codex")):
        billed = hosts.script.bill[fake][:2]
        assert (usage[letter].input_tokens, usage[letter].output_tokens) == billed, transcript[-6000:]
    assert usage[mine].cost_usd is not None and usage[mine].cost_usd > 0

    # the login never left the member's private HOME: nothing of the job keeps a token of it
    secrets = login_secrets(user_home)
    assert CLAUDE_TOKEN in secrets and CODEX_TOKEN in secrets and CODEX_REFRESH in secrets
    assert holding(tmp_path / "state", secrets) == [] and holding(project, secrets) == []
    assert not [secret for secret in secrets if secret in transcript or secret in patch]
    assert not [secret for secret in secrets if any(secret in event for event in events)]
    assert not [secret for secret in secrets if secret in caplog.text]
    assert {path: path.read_bytes() for path in user_home.rglob("*.json")} == before  # left as it was

    # and every report says where the login comes from
    claude_file, codex_file = user_home / ".claude" / ".credentials.json", user_home / ".codex" / "auth.json"
    assert [agent.model for agent in resolve_team("subscriptions", environ).agents] == [
        "cli/claude-code",
        "cli/codex",
    ]
    preset = next(team for team in listed.teams if team.name == "subscriptions")
    image = "; runs in the CLI image (`conclave sandbox build --clis`)"
    assert preset.ready and {agent.model: agent.cli for agent in preset.agents} == {
        "cli/claude-code": f"logged in ({claude_file}){image}",
        "cli/codex": f"logged in ({codex_file}){image}",
    }
    lines = listed.text().splitlines()
    assert all(any(str(path) in line for line in lines) for path in (claude_file, codex_file))  # whole
    probes = {probe.name: probe for probe in run_checks(settings, environ)}
    assert probes["cli/claude-code"].ok and probes["cli/claude-code"].detail == f"logged in ({claude_file})"
    assert probes["cli/codex"].ok and probes["cli/codex"].detail == f"logged in ({codex_file})"
    assert not probes["cli/gemini"].ok and not probes["cli/copilot"].ok


NEW_CLAUDE_TOKEN = "sk-ant-oat01-" + "refreshedinside" * 4
NEW_CODEX_TOKEN = jwt(codex_claims(CODEX_ACCOUNT, "refreshed-inside-the-container"))
REFRESHES = {
    # cli -> its token host, the reply the fake gives a refresh, the token the model must see after it
    "claude-code": (
        "platform.claude.com",
        {
            "access_token": NEW_CLAUDE_TOKEN,
            "refresh_token": "sk-ant-ort01-" + "rotatedinside" * 4,
            "expires_in": 28_800,
            "scope": "user:inference user:profile user:sessions:claude_code",
            "token_type": "Bearer",
        },
        NEW_CLAUDE_TOKEN,
    ),
    "codex": (
        "auth.openai.com",
        {
            "id_token": jwt(codex_claims(CODEX_ACCOUNT, "refreshed-id")),
            "access_token": NEW_CODEX_TOKEN,
            "refresh_token": "rt-" + "rotatedinside" * 4,
        },
        NEW_CODEX_TOKEN,
    ),
}


@pytest.mark.parametrize("cli", ["claude-code", "codex"])
async def test_an_expired_login_is_refreshed_inside_the_container_only(
    clis_image: str,
    tmp_path: Path,
    project: Path,
    hosts: LoginHosts,
    cli: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A login past its refresh time (Claude's token expiring within five minutes, Codex's access
    token past its `exp`): the CLI refreshes it through its own refresh host, which its allowlist
    admits, and works with the new token. The refreshed login lives and dies in the container's tmpfs
    HOME: the user's file stays as it was, and no new token reaches the job's state or the log."""
    caplog.set_level(logging.DEBUG, logger="conclave")
    home = tmp_path / "user"
    if cli == "claude-code":
        login = home / ".claude" / ".credentials.json"
        content, model, wire, agent = (
            claude_credentials(CLAUDE_TOKEN, CLAUDE_REFRESH, 60),
            "",
            "anthropic",
            "claude",
        )
    else:
        login = home / ".codex" / "auth.json"
        expired = jwt(codex_claims(CODEX_ACCOUNT, "chatgpt-plan-access-token", expires_in_s=-60))
        content = codex_auth(expired, CODEX_REFRESH, CODEX_ACCOUNT, refreshed_days_ago=9)
        model, wire, agent = ":gpt-5.5", "responses", "codex"
    login.parent.mkdir(parents=True)
    login.write_bytes(content)
    token_host, reply, new_token = REFRESHES[cli]
    hosts.tokens[token_host] = reply
    worker = CliWorker(wire, "sed -i 's/return a - b/return a + b/' calc.py", "Fixed add().")
    hosts.script.set_default(agent, worker)
    team = tmp_path / "team.yaml"
    team.write_text(f"agents:\n  - model: cli/{cli}{model}\ncoordination: {{final: reuse}}\n")
    settings = Settings(home=tmp_path / "state")
    async with JobService.serve(
        replace(environment_of(settings, {"HOME": str(home)}, FAST), route=hosts.redirect())
    ) as service:
        view = await cli_job(service, team, project)
        transcript = (await service.lookup.read(view.job_id, "transcript", None, 0, 100_000)).content

    assert view.state == "completed" and view.answer == "Fixed add().", view.text()
    refreshes = [call for call in hosts.seen if call.host == token_host]
    assert refreshes and all(call.method == "POST" for call in refreshes)
    old_refresh = CLAUDE_REFRESH if cli == "claude-code" else CODEX_REFRESH
    assert old_refresh.encode() in refreshes[0].body  # the user's refresh token, sent to its own host
    model_host = "api.anthropic.com" if cli == "claude-code" else "chatgpt.com"
    calls = [
        call
        for call in hosts.seen
        if call.host == model_host and call.path.endswith(("/messages", "/responses"))
    ]
    assert calls and {call.authorization for call in calls} == {f"Bearer {new_token}"}
    assert login.read_bytes() == content  # the refresh was written in the container's HOME only
    fresh = [str(value) for value in reply.values() if len(str(value)) >= 20]
    assert holding(tmp_path / "state", fresh) == [] and holding(project, fresh) == []
    assert not [token for token in fresh if token in transcript or token in caplog.text]


GEMINI_TOKEN = "ya29." + "googleloginaccess" * 4
GEMINI_REFRESH = "1//" + "googleloginrefresh" * 4


async def test_gemini_cli_works_from_a_google_login(
    clis_image: str, tmp_path: Path, project: Path, hosts: LoginHosts, caplog: pytest.LogCaptureFixture
) -> None:
    """Gemini CLI signed in with Google (`~/.gemini/oauth_creds.json`) speaks Code Assist at
    cloudcode-pa.googleapis.com, not the Gemini API: it checks its token at oauth2.googleapis.com
    (tokeninfo), finds its tier and project, then works. Both hosts are on its allowlist; its one other
    call (www.googleapis.com, the account's e-mail for its own display) is refused, and it goes on."""
    caplog.set_level(logging.DEBUG, logger="conclave")
    home = tmp_path / "user"
    login = home / ".gemini" / "oauth_creds.json"
    login.parent.mkdir(parents=True)
    login.write_bytes(gemini_oauth_creds(GEMINI_TOKEN, GEMINI_REFRESH))
    environ = {"HOME": str(home)}
    worker = CliWorker("gemini", "sed -i 's/return a - b/return a + b/' calc.py", "Fixed add() (gemini).")
    hosts.script.set_default("gemini", worker)
    team = tmp_path / "team.yaml"
    team.write_text("agents:\n  - model: cli/gemini\ncoordination: {final: reuse}\nsandbox: {memory: 2g}\n")
    async with JobService.serve(
        replace(environment_of(Settings(home=tmp_path / "state"), environ, FAST), route=hosts.redirect())
    ) as service:
        view = await cli_job(service, team, project, verify="pytest -q")
        patch = (await service.lookup.read(view.job_id, "@diff", None, 0, 100_000)).content
        transcript = (await service.lookup.read(view.job_id, "transcript", None, 0, 100_000)).content

    print(view.text())
    assert view.state == "completed" and view.answer == "Fixed add() (gemini).", view.text()
    # its own answer alone in view: it votes for it without a decision run (coordination/cli_turns.py)
    assert "+    return a + b\n" in patch and not worker.decisions and view.result.tally
    generate = model_calls(hosts.seen, "cloudcode-pa.googleapis.com", "/v1internal:streamGenerateContent")
    assert generate and {call.authorization for call in generate} == {f"Bearer {GEMINI_TOKEN}"}
    tokeninfo = [call for call in hosts.seen if call.path == "/tokeninfo"]
    assert tokeninfo and {call.authorization for call in tokeninfo} == {f"Bearer {GEMINI_TOKEN}"}
    assert not any("x-goog-api-key" in call.headers for call in hosts.seen)
    member = view.agents[0]
    assert (member.usage.input_tokens, member.usage.output_tokens) == hosts.script.bill["gemini"][:2]
    secrets = login_secrets(home)
    assert GEMINI_TOKEN in secrets and GEMINI_REFRESH in secrets
    assert holding(tmp_path / "state", secrets) == [] and holding(project, secrets) == []
    assert not [secret for secret in secrets if secret in transcript or secret in caplog.text]
    assert [agent.model for agent in resolve_team("subscriptions", environ).agents] == ["cli/gemini"]
    probe = {probe.name: probe for probe in run_checks(Settings(home=tmp_path / "state"), environ)}
    assert probe["cli/gemini"].detail == f"logged in ({login})"
