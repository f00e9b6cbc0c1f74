"""What a caller can spend: a caller may lower a team's limits, never raise them, and no call exceeds the
ceilings the operator set for the server (CONCLAVE_MAX_JOB_TOKENS, CONCLAVE_MAX_MEMBER_TOKENS,
CONCLAVE_MAX_JOB_COST_USD). Through the MCP tool (FastMCP's in-memory client) and the CLI.

Before: ask_team with max_tokens and max_tokens_per_member at 10^9 replaced a team file's 2,000 and 1,000,
and the server had no ceiling at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from fastmcp import Client

from conclave.app.server import create_app
from conclave.cli.main import main
from conclave.jobs.read.views import JobView
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, install, team_data, voter

SOLO = (("openai", "ann"),)
HUGE = 10**9
PRICE = {"input": 1.0, "output": 1.0}


def _team(
    tmp_path: Path, fakes: FakeProviders, *, limits: bool = True, priced: bool = True, name: str = "team"
) -> str:
    """One fake member; with `limits`, the team's 2,000 tokens a job, 1,000 a member, $1 a job."""
    install(fakes.script, SOLO, voter())
    coordination: dict[str, Any] = {"final": "reuse"}
    if limits:
        coordination.update(max_tokens=2000, max_cost_usd=1.0)
    data = team_data(fakes, SOLO, coordination=coordination, **({"price": PRICE} if priced else {}))
    if limits:
        data["agents"][0]["budget"] = {"max_tokens": 1000}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


async def _ask(client: Client, **arguments: Any) -> tuple[bool, str, dict[str, Any] | None]:
    result = await client.call_tool(
        "ask_team", {"task": "t", "wait_seconds": 0, **arguments}, raise_on_error=False
    )
    return result.is_error, result.content[0].text, result.structured_content  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_over_mcp_a_caller_may_lower_a_teams_limits_but_never_raise_them(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    team = _team(tmp_path, fakes)
    settings = Settings(home=tmp_path / "home")
    async with (
        JobService.serve(environment_of(settings, {KEY_ENV: "test-key"})) as service,
        Client(create_app(service, settings)) as client,
    ):
        for field, value, limit in (
            ("max_tokens", HUGE, "2000"),
            ("max_tokens_per_member", HUGE, "1000"),
            ("max_cost_usd", 1000.0, "1"),
        ):
            refused, text, _ = await _ask(client, team=team, **{field: value})
            assert refused, f"{field}={value} lifted the team's {limit}: {text}"
            assert field in text and str(value) in text and limit in text and "team" in text, text
        refused, text, content = await _ask(
            client, team=team, max_tokens=1500, max_tokens_per_member=500, max_cost_usd=0.5, wait_seconds=30
        )
        assert not refused, text
        view = JobView.model_validate(content)
        assert view.budget == {"max_tokens": 1500, "max_cost_usd": 0.5}
        assert [agent.max_tokens for agent in view.agents] == [500]
        _, _, content = await _ask(client, team=team, wait_seconds=30)  # asking nothing keeps the team's own
        view = JobView.model_validate(content)
        assert view.budget == {"max_tokens": 2000, "max_cost_usd": 1.0}
        assert [agent.max_tokens for agent in view.agents] == [1000]


@pytest.mark.anyio
async def test_over_mcp_no_call_exceeds_the_servers_ceilings(tmp_path: Path, fakes: FakeProviders) -> None:
    team = _team(tmp_path, fakes, limits=False)
    settings = Settings(
        home=tmp_path / "home", max_job_tokens=5000, max_member_tokens=3000, max_job_cost_usd=2.0
    )
    async with (
        JobService.serve(environment_of(settings, {KEY_ENV: "test-key"})) as service,
        Client(create_app(service, settings)) as client,
    ):
        for field, value, setting, ceiling in (
            ("max_tokens", HUGE, "CONCLAVE_MAX_JOB_TOKENS", "5000"),
            ("max_tokens_per_member", HUGE, "CONCLAVE_MAX_MEMBER_TOKENS", "3000"),
            ("max_cost_usd", 5.0, "CONCLAVE_MAX_JOB_COST_USD", "2"),
        ):
            refused, text, _ = await _ask(client, team=team, **{field: value})
            assert refused, f"{field}={value} passed the server's {setting}={ceiling}: {text}"
            assert field in text and str(value) in text and setting in text and ceiling in text, text
        # a team without limits of its own runs under the ceilings
        refused, text, content = await _ask(client, team=team, wait_seconds=30)
        assert not refused, text
        view = JobView.model_validate(content)
        assert view.budget == {"max_tokens": 5000, "max_cost_usd": 2.0}
        assert [agent.max_tokens for agent in view.agents] == [3000]
    # a team whose own limits are over the ceilings runs at the ceilings; a cost ceiling needs prices
    settings = Settings(
        home=tmp_path / "home", max_job_tokens=1500, max_member_tokens=800, max_job_cost_usd=0.5
    )
    limited = _team(tmp_path, fakes, name="limited")
    unpriced = _team(tmp_path, fakes, limits=False, priced=False, name="unpriced")
    async with (
        JobService.serve(environment_of(settings, {KEY_ENV: "test-key"})) as service,
        Client(create_app(service, settings)) as client,
    ):
        refused, text, content = await _ask(client, team=limited, wait_seconds=30)
        assert not refused, text
        view = JobView.model_validate(content)
        assert view.budget == {"max_tokens": 1500, "max_cost_usd": 0.5}
        assert [agent.max_tokens for agent in view.agents] == [800]
        refused, text, _ = await _ask(client, team=unpriced)
        assert refused and "CONCLAVE_MAX_JOB_COST_USD=0.5" in text and "price" in text, text


def test_the_cli_refuses_a_budget_over_the_teams_or_the_servers(
    tmp_path: Path,
    fakes: FakeProviders,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    isolated: Path,
) -> None:
    team = _team(tmp_path, fakes)
    monkeypatch.setenv(KEY_ENV, "test-key")
    code = main(["ask", "t", "--team", team, "--max-tokens", str(HUGE)])
    err = capsys.readouterr().err
    assert code == 2, f"--max-tokens {HUGE} lifted the team's 2000"
    assert "--max-tokens" in err and str(HUGE) in err and "2000" in err, err
    code = main(["ask", "t", "--team", team, "--max-tokens-per-member", str(HUGE)])
    err = capsys.readouterr().err
    assert code == 2 and "--max-tokens-per-member" in err and "1000" in err, err
    monkeypatch.setenv("CONCLAVE_MAX_JOB_TOKENS", "1200")
    code = main(["ask", "t", "--team", team, "--max-tokens", "1800"])
    err = capsys.readouterr().err
    assert code == 2 and "CONCLAVE_MAX_JOB_TOKENS" in err and "1200" in err, err
