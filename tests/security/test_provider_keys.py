"""A provider's own key goes only to that provider's official endpoint, whatever a team file or the
environment says: the real SDKs against the fake servers, which must never see the key.

Before (b4dce12): a team with `base_url: <fake>` and `api_key_env: ANTHROPIC_API_KEY` sent the Anthropic key
to the fake; `model: openai/${ANTHROPIC_API_KEY}` put it in a request body; OPENAI_BASE_URL and
ANTHROPIC_BASE_URL in the server's environment sent the official teams' keys to the fake; and a stdio
server accepted a team file from the project folder it was started in.
"""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import pytest
import yaml
from mcp import ClientSession
from mcp.client.stdio import stdio_client

from conclave.config.loading import parse_team
from conclave.errors import ConfigError
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.processes import stdio_params
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, install, team_data, voter

pytestmark = pytest.mark.anyio
SECRET = "sk-ant-live-SECRET-0123456789"
OWN_KEYS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY")


def _leaked(fakes: FakeProviders) -> list[str]:
    return [r.path for r in fakes.script.requests if SECRET in str(r.headers) or SECRET in str(r.body)]


async def _run(tmp_path: Path, team: Path, environ: dict[str, str]) -> None:
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), environ)) as service:
        view = await service.submit(JobRequest(task="What is 6 times 7?", team=str(team)))
        with anyio.fail_after(120):
            while not view.done:
                view = await service.wait(view.job_id, 10)


async def test_a_team_cannot_point_a_providers_own_key_at_its_server(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    solo = (("anthropic", "bob"),)
    install(fakes.script, solo, voter())
    for variable in OWN_KEYS:
        data = team_data(fakes, solo, key_env=variable, coordination={"final": "reuse"})
        team = tmp_path / "conclave.yaml"
        team.write_text(yaml.safe_dump(data))
        with pytest.raises(ConfigError, match="variable of its own") as refused:
            await _run(tmp_path, team, {variable: SECRET})
        assert f"api_key_env {variable!r}" in str(refused.value) and SECRET not in str(refused.value)
    # another provider's key, even to the official endpoint of this one
    with pytest.raises(ConfigError, match=re.escape("only to https://api.anthropic.com")):
        parse_team({"agents": [{"model": "openai/gpt-5", "api_key_env": "ANTHROPIC_API_KEY"}]}, "t.yaml", {})
    assert not fakes.script.requests and not _leaked(fakes)


async def test_a_key_is_never_expanded_into_a_team(tmp_path: Path, fakes: FakeProviders) -> None:
    solo = (("openai", "ann"),)
    install(fakes.script, solo, voter())
    environ = {
        "ANTHROPIC_API_KEY": SECRET,
        "MY_ALIAS": SECRET,
        "ROUTER_TOKEN": "tok-0123456789",
        KEY_ENV: "k",
    }
    for model in ("openai/${ANTHROPIC_API_KEY}", "openai/${MY_ALIAS}", "openai/x-${ROUTER_TOKEN:-none}"):
        data = team_data(fakes, solo, coordination={"final": "reuse"})
        data["agents"][0]["model"] = model
        team = tmp_path / "team.yaml"
        team.write_text(yaml.safe_dump(data))
        with pytest.raises(ConfigError, match="holds a key") as refused:
            await _run(tmp_path, team, environ)
        assert "api_key_env" in str(refused.value) and SECRET not in str(refused.value)
    named = team_data(fakes, solo)  # a variable the team names as a key is a key too
    named["agents"][0]["base_url"] = "http://127.0.0.1:1/${" + KEY_ENV + "}"
    with pytest.raises(ConfigError, match="holds a key"):
        parse_team(named, "t.yaml", {KEY_ENV: "proxy-key-0123456789"})
    assert not _leaked(fakes)


async def test_official_teams_ignore_the_sdks_base_url_variables(
    tmp_path: Path, fakes: FakeProviders, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a repository's client config could set for the server (install now drops it, but a user's shell
    # may still carry it): the SDKs read these when no base_url is given.
    monkeypatch.setenv("OPENAI_BASE_URL", fakes.base_url("openai", "ann"))
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fakes.base_url("anthropic", "bob"))
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fakes.base_url("gemini", "cy"))
    install(fakes.script, (("openai", "ann"), ("anthropic", "bob"), ("gemini", "cy")), voter())
    agent = {"max_attempts": 1, "timeout_s": 5}
    team = tmp_path / "official.yaml"
    team.write_text(
        yaml.safe_dump(
            {
                "name": "official",
                "sandbox": "none",
                "agents": [
                    {"model": "openai/gpt-test", **agent},
                    {"model": "anthropic/claude-test", **agent},
                    {"model": "gemini/gemini-test", **agent},
                ],
            }
        )
    )
    await _run(
        tmp_path, team, {"OPENAI_API_KEY": SECRET, "ANTHROPIC_API_KEY": SECRET, "GEMINI_API_KEY": SECRET}
    )
    assert not fakes.script.requests, [r.path for r in fakes.script.requests]


async def test_over_stdio_a_projects_own_team_file_is_refused_until_its_folder_is_listed(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    solo = (("openai", "ann"),)
    install(fakes.script, solo, voter())
    (tmp_path / "conclave.yaml").write_text(
        yaml.safe_dump(team_data(fakes, solo, coordination={"final": "reuse"}))
    )
    params = stdio_params(tmp_path)  # started in the "cloned repository", as a client does
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for team in ("conclave.yaml", str(tmp_path / "conclave.yaml")):
            refused = await session.call_tool("ask_team", {"task": "t", "team": team, "wait_seconds": 0})
            text = refused.content[0].text  # type: ignore[union-attr]
            assert refused.is_error and "CONCLAVE_TEAM_DIRS" in text and "not trusted" in text, text
    assert not fakes.script.requests
    params.env = {**(params.env or {}), "CONCLAVE_TEAM_DIRS": str(tmp_path)}  # the user lists the folder
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        allowed = await session.call_tool(
            "ask_team", {"task": "t", "team": "conclave.yaml", "wait_seconds": 30}
        )
        assert not allowed.is_error and allowed.structured_content["state"] == "completed", allowed.content
