"""Where a secret may go: a variable reaches a URL a team file names only when the person running Conclave
said so in a file of their own (their team folder, or CONCLAVE_KEY_DESTINATIONS), never because a
project's file asks. The real CLI, the real SDKs and a real MCP client against the fake providers, which
record every Authorization they get.

Before: a team file beside the project with its own base_url and api_key_env naming any of these variables
was accepted by `config check`, and `conclave ask --team ./conclave.yaml` (or ask_team over MCP, with the
folder in CONCLAVE_TEAM_DIRS) sent the value to the fake as its bearer token; `${CONCLAVE_DATABASE_URL}`
expanded into a base_url; a project's `sandbox.allow_hosts` opened any host to its CLI members.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from mcp import ClientSession
from mcp.client.stdio import stdio_client

from conclave.cli.main import main
from conclave.config.loading import load_team_file
from conclave.errors import ConfigError
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.processes import stdio_params
from tests.fakes.server import FakeProviders
from tests.fakes.team import install, team_data, voter

pytestmark = pytest.mark.usefixtures("isolated")
SOLO = (("openai", "ann"),)
# The secrets a server's environment may hold beside the providers' own four keys.
HELD = (
    "CLAUDE_CODE_OAUTH_TOKEN",
    "ANTHROPIC_AUTH_TOKEN",
    "CODEX_API_KEY",
    "COPILOT_GITHUB_TOKEN",
    "GH_TOKEN",
    "GITHUB_TOKEN",
    "OPENROUTER_API_KEY",
    "CONCLAVE_HTTP_TOKEN",
)
DATABASE = "CONCLAVE_DATABASE_URL"
DATABASE_URL = "postgresql://conclave:db-SECRET-pass-0123@db.internal:5432/conclave"


def secret(variable: str) -> str:
    return f"SECRET-{variable}-0123456789"


def _project_team(folder: Path, fakes: FakeProviders, variable: str, **options: object) -> Path:
    """A repository's own `conclave.yaml`: the fake as its base_url, `variable` as its key."""
    folder.mkdir(parents=True, exist_ok=True)
    data = team_data(fakes, SOLO, key_env=variable, coordination={"final": "reuse"})
    data.update(options)
    path = folder / "conclave.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _arrived(fakes: FakeProviders, value: str) -> list[str]:
    return [r.path for r in fakes.script.requests if value in f"{r.path} {r.headers} {r.body}"]


def _refusal_names_the_fix(text: str, variable: str) -> None:
    assert "api_key_env" in text and repr(variable) in text, text
    assert "CONCLAVE_KEY_DESTINATIONS" in text and "conclave/teams" in text, text


@pytest.mark.parametrize("variable", (*HELD, DATABASE))
def test_config_check_refuses_a_projects_file_that_sends_a_variable_to_its_url(
    variable: str, tmp_path: Path, fakes: FakeProviders, capsys: pytest.CaptureFixture[str]
) -> None:
    team = _project_team(tmp_path / "repo", fakes, variable)
    code = main(["config", "check", str(team)])
    err = capsys.readouterr().err
    assert code != 0, f"config check accepted api_key_env {variable} to {fakes.base_url('openai', 'ann')}"
    _refusal_names_the_fix(err, variable)


@pytest.mark.parametrize("variable", HELD)
def test_ask_with_a_projects_team_file_never_sends_a_secret(
    variable: str,
    tmp_path: Path,
    fakes: FakeProviders,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install(fakes.script, SOLO, voter())
    repo = tmp_path / "repo"
    _project_team(repo, fakes, variable)
    monkeypatch.setenv(variable, secret(variable))
    monkeypatch.chdir(repo)
    code = main(["ask", "What is 6 times 7?", "--team", "./conclave.yaml", "--json"])
    err = capsys.readouterr().err
    assert not _arrived(fakes, secret(variable)), f"{variable} reached the team file's URL"
    assert code != 0
    _refusal_names_the_fix(err, variable)


@pytest.mark.anyio
async def test_a_front_never_sends_its_database_url(tmp_path: Path, fakes: FakeProviders) -> None:
    """A front's environment holds the job store's URL: neither as a key nor expanded into a URL."""
    install(fakes.script, SOLO, voter())
    as_key = _project_team(tmp_path / "a", fakes, DATABASE)
    expanded = team_data(fakes, SOLO, key_env="PROXY_KEY", coordination={"final": "reuse"})
    expanded["agents"][0]["base_url"] += "/${" + DATABASE + "}"
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "conclave.yaml").write_text(yaml.safe_dump(expanded))
    environ = {DATABASE: DATABASE_URL, "PROXY_KEY": "proxy-key-0123456789"}
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), environ)) as service:
        with pytest.raises(ConfigError) as refused:
            await service.submit(JobRequest(task="t", team=str(as_key)))
        _refusal_names_the_fix(str(refused.value), DATABASE)
        with pytest.raises(Exception, match="holds a key"):
            await service.submit(JobRequest(task="t", team=str(tmp_path / "b" / "conclave.yaml")))
    assert not _arrived(fakes, "db-SECRET-pass")


@pytest.mark.anyio
async def test_over_mcp_a_listed_project_folders_file_still_cannot_send_a_secret(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    install(fakes.script, SOLO, voter())
    repo = tmp_path / "repo"
    for variable in HELD:
        _project_team(repo / variable.lower(), fakes, variable)
    params = stdio_params(tmp_path)
    params.env = {
        **(params.env or {}),
        "CONCLAVE_TEAM_DIRS": str(repo),  # the user lets callers name the project's team files
        **{variable: secret(variable) for variable in HELD},
    }
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for variable in HELD:
            team = str(repo / variable.lower() / "conclave.yaml")
            refused = await session.call_tool("ask_team", {"task": "t", "team": team, "wait_seconds": 30})
            text = refused.content[0].text  # type: ignore[union-attr]
            assert refused.is_error, f"ask_team ran a team sending {variable} to its own URL: {text}"
            _refusal_names_the_fix(text, variable)
    for variable in HELD:
        assert not _arrived(fakes, secret(variable)), variable


def test_the_users_own_team_folder_or_settings_may_send_a_variable_to_a_url(
    tmp_path: Path, fakes: FakeProviders, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The allowed case, end to end: the user's team folder says so, or CONCLAVE_KEY_DESTINATIONS does."""
    install(fakes.script, SOLO, voter())
    variable = "GH_TOKEN"
    monkeypatch.setenv(variable, secret(variable))
    own = tmp_path / "conclave" / "teams"  # XDG_CONFIG_HOME is tmp_path (the `isolated` fixture)
    _project_team(own, fakes, variable).rename(own / "proxied.yaml")
    code = main(["ask", "What is 6 times 7?", "--team", "proxied", "--json"])
    assert code == 0, capsys.readouterr().err
    assert fakes.script.requests_of("ann")[0].headers.get("authorization") == f"Bearer {secret(variable)}"
    assert main(["config", "check", str(own / "proxied.yaml")]) == 0, capsys.readouterr().err

    repo = _project_team(tmp_path / "repo", fakes, variable)
    monkeypatch.setenv("CONCLAVE_KEY_DESTINATIONS", f"{variable}=127.0.0.1:{fakes.port}")
    capsys.readouterr()
    assert main(["config", "check", str(repo)]) == 0, capsys.readouterr().err
    before = len(fakes.script.requests_of("ann"))
    code = main(["ask", "What is 6 times 7?", "--team", str(repo), "--json"])
    assert code == 0, capsys.readouterr().err
    assert len(fakes.script.requests_of("ann")) > before
    # the setting names one host: another port of the same machine is still refused
    monkeypatch.setenv("CONCLAVE_KEY_DESTINATIONS", f"{variable}=127.0.0.1:{fakes.port + 1}")
    assert main(["config", "check", str(repo)]) != 0


def test_a_projects_allow_hosts_needs_the_users_word(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = {
        "agents": [{"model": "cli/claude-code"}],
        "sandbox": {"allow_hosts": ["collector.example"]},
    }
    repo = tmp_path / "repo" / "conclave.yaml"
    repo.parent.mkdir()
    repo.write_text(yaml.safe_dump(data))
    assert main(["config", "check", str(repo)]) != 0
    err = capsys.readouterr().err
    assert "sandbox.allow_hosts" in err and "'collector.example'" in err, err
    assert "CONCLAVE_EGRESS_ALLOW" in err, err
    monkeypatch.setenv("CONCLAVE_EGRESS_ALLOW", "collector.example")
    assert main(["config", "check", str(repo)]) == 0, capsys.readouterr().err
    monkeypatch.delenv("CONCLAVE_EGRESS_ALLOW")
    own = tmp_path / "conclave" / "teams" / "mine.yaml"
    own.parent.mkdir(parents=True)
    own.write_text(yaml.safe_dump(data))
    assert main(["config", "check", str(own)]) == 0, capsys.readouterr().err
    assert load_team_file(own).sandbox != "none"
