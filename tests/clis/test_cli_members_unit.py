"""CLI members without a container: team files, the subscriptions preset, logins, each CLI's command
line and its JSON output read back (shapes from the CLIs' own output)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conclave.backends.base import Usage
from conclave.clis.claude_code import ClaudeCode
from conclave.clis.cli_adapter import Login
from conclave.clis.codex import Codex
from conclave.clis.copilot import USAGE_MARK, Copilot
from conclave.clis.gemini_cli import Gemini
from conclave.clis.logins import resolve_login
from conclave.clis.member import CliMember
from conclave.config.loading import parse_team
from conclave.config.presets import resolve_team
from conclave.coordination.cli_turns import decision_schema
from conclave.errors import ConfigError

TOKEN = "sk-ant-oat01-" + "s3cr3t" * 8  # a login file's token: it must never leave the exec's environment


def _home(tmp_path: Path, *clis: str) -> dict[str, str]:
    """A user's home with the login files of `clis`."""
    home = tmp_path / "home"
    files = {
        "claude-code": ".claude/.credentials.json",
        "codex": ".codex/auth.json",
        "gemini": ".gemini/oauth_creds.json",
        "copilot": ".copilot/config.json",
    }
    for cli in clis:
        path = home / files[cli]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"claudeAiOauth": {"accessToken": TOKEN, "expiresAt": 1}}))
    home.mkdir(exist_ok=True)
    return {"HOME": str(home), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}


def test_a_team_mixes_cli_members_with_api_agents() -> None:
    team = parse_team(
        {
            "agents": [
                {"model": "cli/claude-code:opus"},
                {"model": "cli/codex:gpt-5.5"},
                {"model": "openai/gpt-5"},
            ]
        },
        "team.yaml",
    )
    assert [agent.provider for agent in team.agents] == ["cli", "cli", "openai"]
    assert team.agents[0].timeout_s == 600 and team.agents[2].timeout_s == 120


def test_an_unknown_cli_names_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"cli/cursor.*claude-code, codex, gemini, copilot"):
        parse_team({"agents": [{"model": "cli/cursor"}]}, "team.yaml")


def test_a_cli_member_with_its_own_endpoint_names_its_key_variable() -> None:
    with pytest.raises(ConfigError, match="api_key_env"):
        parse_team({"agents": [{"model": "cli/claude-code", "base_url": "http://gw.internal/v1"}]}, "t.yaml")
    team = parse_team(
        {"agents": [{"model": "cli/claude-code", "base_url": "http://gw.internal", "api_key_env": "GW_KEY"}]},
        "t.yaml",
    )
    login = resolve_login(team.agents[0], {"GW_KEY": "gw-key-123456789", "ANTHROPIC_API_KEY": "sk-own"})
    assert (login.key, login.base_url) == ("gw-key-123456789", "http://gw.internal")
    assert ClaudeCode().environment(login, None)["ANTHROPIC_BASE_URL"] == "http://gw.internal"


def test_subscriptions_keeps_the_clis_you_are_logged_in_to(tmp_path: Path) -> None:
    env = _home(tmp_path, "claude-code", "gemini") | {"OPENAI_API_KEY": "sk-openai"}
    team = resolve_team("subscriptions", env)
    assert [agent.model for agent in team.agents] == ["cli/claude-code", "cli/codex", "cli/gemini"]
    assert team.missing_keys(env) == []


def test_subscriptions_with_no_login_says_how_to_log_in(tmp_path: Path) -> None:
    env = _home(tmp_path)
    team = resolve_team("subscriptions", env)
    missing = team.missing_keys(env)
    assert (
        len(team.agents) == 4
        and "a claude-code login (~/.claude/.credentials.json) or ANTHROPIC_API_KEY" in missing
    )
    with pytest.raises(ConfigError, match="not logged in to codex"):
        resolve_login(team.agents[1], env)


def test_a_linked_login_file_is_not_a_login(tmp_path: Path) -> None:
    env = _home(tmp_path)
    (Path(env["HOME"]) / ".codex").mkdir()
    (Path(env["HOME"]) / ".codex" / "auth.json").symlink_to("/etc/passwd")
    team = resolve_team("subscriptions", env)
    with pytest.raises(ConfigError, match="not logged in to codex"):
        resolve_login(team.agents[1], env)


def test_the_login_reaches_the_cli_only_through_the_exec_environment(tmp_path: Path) -> None:
    env = _home(tmp_path, "claude-code")
    team = parse_team({"agents": [{"model": "cli/claude-code:opus"}]}, "t.yaml")
    member = CliMember.for_spec(team.agents[0], env)
    command, variables = member.script("Fix the failing test.", decision_schema(("A1", "B1"), True))
    assert TOKEN not in command and TOKEN not in repr(member)
    assert any(
        TOKEN in __import__("base64").b64decode(v).decode(errors="ignore")
        for k, v in variables.items()
        if k.startswith("CONCLAVE_HOME_FILE_")
    )
    # written once into the private HOME (0700 by umask), then the variables are gone before the CLI runs
    assert command.startswith("umask 077") and "unset CONCLAVE_HOME_FILE_0 CONCLAVE_SCHEMA" in command
    assert variables["HOME"] == "/home/sandbox" and variables["IS_SANDBOX"] == "1"
    assert "--permission-mode bypassPermissions" in command and "--model opus" in command


def test_claude_codes_result_gives_text_usage_cost_and_the_structured_decision() -> None:
    out = ClaudeCode().parse(
        json.dumps(
            {
                "type": "result",
                "subtype": "success",
                "is_error": False,
                "result": "",
                "total_cost_usd": 0.0123,
                "usage": {
                    "input_tokens": 10,
                    "cache_creation_input_tokens": 5,
                    "cache_read_input_tokens": 100,
                    "output_tokens": 7,
                },
                "structured_output": {"decision": "vote", "answer": "B1", "reason": "passes"},
            }
        )
    )
    assert (out.usage.input_tokens, out.usage.output_tokens, out.usage.cached_input_tokens) == (115, 7, 100)
    assert out.cost_usd == 0.0123 and out.structured == {
        "decision": "vote",
        "answer": "B1",
        "reason": "passes",
    }


def test_codex_stream_gives_the_last_message_and_summed_usage() -> None:
    lines = [
        {"type": "thread.started", "thread_id": "t"},
        {"type": "item.completed", "item": {"type": "command_execution", "command": "pytest"}},
        {"type": "item.completed", "item": {"type": "agent_message", "text": "Fixed add()."}},
        {
            "type": "turn.completed",
            "usage": {"input_tokens": 50, "cached_input_tokens": 20, "output_tokens": 9},
        },
    ]
    out = Codex().parse("warning: something\n" + "\n".join(json.dumps(line) for line in lines))
    assert out.text == "Fixed add()." and (out.usage.input_tokens, out.usage.cached_input_tokens) == (50, 20)
    assert "--output-schema" in Codex().command("p", "gpt-5.5", {"type": "object"}, True, Login())
    config = Codex().home_files(Login("OPENAI_API_KEY", "sk-x"), "gpt-5.5")[".codex/config.toml"].decode()
    assert "supports_websockets = false" in config and 'env_key = "CONCLAVE_CODEX_KEY"' in config


def test_gemini_and_copilot_outputs() -> None:
    out = Gemini().parse(
        json.dumps(
            {
                "response": "Done.",
                "stats": {
                    "models": {
                        "gemini-2.5-pro": {
                            "tokens": {"prompt": 40, "candidates": 6, "cached": 10, "thoughts": 2}
                        }
                    }
                },
            }
        )
    )
    assert out.text == "Done." and (out.usage.input_tokens, out.usage.output_tokens) == (40, 8)
    stream = "\n".join(
        json.dumps(e) for e in [{"type": "assistant.message", "data": {"content": "All set."}}]
    )
    usage = {"modelMetrics": {"claude-sonnet-5": {"usage": {"inputTokens": 30, "outputTokens": 4}}}}
    out = Copilot().parse(f"{stream}\n{USAGE_MARK}\n{json.dumps(usage)}")
    assert out.text == "All set." and (out.usage.input_tokens, out.usage.output_tokens) == (30, 4)
    # no built-in GitHub MCP server: with a GitHub login it would act on the user's repositories
    assert "--disable-builtin-mcps" in Copilot().command("p", None, None, False, Login())
    # a brief run (its server mode): the usage is each call's assistant.usage event in the stream, so a
    # run cut short still says what it used; a session error is what its output says went wrong
    calls = [{"type": "assistant.usage", "data": {"inputTokens": n, "outputTokens": 2}} for n in (300, 500)]
    brief = "\n".join(
        json.dumps(e) for e in [*calls, {"type": "assistant.message", "data": {"content": "{}"}}]
    )
    out = Copilot().parse(f"{brief}\n{USAGE_MARK}\n")
    assert out.text == "{}" and (out.usage.input_tokens, out.usage.output_tokens) == (800, 4)
    failed = Copilot().parse(json.dumps({"type": "session.error", "data": {"message": "No model"}}))
    assert failed.error is not None and "No model" in failed.error and failed.usage == Usage()


def test_the_decision_schema_is_strict_for_codex() -> None:
    schema = decision_schema(("B1", "A1"), can_answer=False)
    assert schema["required"] == list(schema["properties"]) and schema["additionalProperties"] is False
    assert schema["properties"]["decision"]["enum"] == ["vote"]
    assert schema["properties"]["answer"]["enum"] == ["B1", "A1", ""]


def test_a_team_with_cli_members_needs_context_paths_and_claude_code_needs_no_price() -> None:
    from conclave.errors import InputError
    from conclave.jobs.admission.team_shape import Ceilings, shape_team
    from conclave.jobs.request import JobRequest

    team = parse_team({"agents": [{"model": "cli/claude-code:opus"}, {"model": "cli/codex"}]}, "t.yaml")
    with pytest.raises(
        InputError, match=r"cli/claude-code:opus, cli/codex run as coding agents .* context_paths"
    ):
        shape_team(team, JobRequest(task="t"), has_context=False, ceilings=Ceilings())
    assert team.unpriced() == ["cli/codex"]
