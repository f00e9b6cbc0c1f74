"""What a CLI member is charged when its run is cut short, and how each CLI's login is found or
explained (macOS Keychain, Copilot's keychain, Copilot's config.json), without a container."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conclave.backends.base import Usage
from conclave.cli.doctor import run_checks
from conclave.clis.claude_code import ClaudeCode
from conclave.clis.copilot import Copilot
from conclave.clis.logins import resolve_login
from conclave.clis.member import CliMember
from conclave.config.clis import CLIS, keychain_user, login_fix, login_source
from conclave.config.loading import parse_team
from conclave.config.presets import resolve_team
from conclave.errors import ConfigError
from conclave.jobs.read.teams import cli_status
from conclave.settings import Settings
from tests.fakes.login_files import copilot_config

PROMPT = "Fix add() in calc.py." * 20


def _member(model: str) -> CliMember:
    spec = parse_team({"agents": [{"model": model, "api_key_env": "K"}]}, "t").agents[0]
    return CliMember.for_spec(spec, {"K": "key-0123456789"})


def _stream(*events: dict[str, object]) -> str:
    return "\n".join(json.dumps(event) for event in events) + "\n"


def _start(input_tokens: int, read: int = 0, output: int = 1) -> dict[str, object]:
    usage = {"input_tokens": input_tokens, "cache_read_input_tokens": read, "output_tokens": output}
    return {
        "type": "stream_event",
        "event": {"type": "message_start", "message": {"usage": usage}},
        "parent_tool_use_id": None,
    }


def _delta(output: int) -> dict[str, object]:
    return {
        "type": "stream_event",
        "event": {"type": "message_delta", "usage": {"output_tokens": output}},
        "parent_tool_use_id": None,
    }


def test_a_killed_claude_code_run_is_charged_each_response_it_streamed() -> None:
    """Two responses: the first complete (its delta's cumulative output counts), the second cut after
    its message_start (input billed, the early output token); no result event (the run was killed)."""
    stdout = _stream(_start(1000, 200), _delta(5), _delta(40), {"type": "assistant"}, _start(1300, 0, 1))
    assert ClaudeCode().streamed_usage(stdout) == Usage(2500, 41, 200)
    member = _member("cli/claude-code")
    assert member.reported(PROMPT, stdout) == (Usage(2500, 41, 200), None)
    # a finished run is charged its result's totals, with its cost
    result = {
        "type": "result",
        "result": "done",
        "usage": {"input_tokens": 9, "output_tokens": 3},
        "total_cost_usd": 0.25,
    }
    assert member.reported(PROMPT, stdout + _stream(result)) == (Usage(9, 3, 0), 0.25)


@pytest.mark.parametrize("model", ["cli/codex", "cli/gemini", "cli/copilot"])
def test_a_run_that_reported_no_tokens_is_charged_an_estimate(model: str) -> None:
    """Codex and Gemini CLI report tokens only when the run ends, Copilot CLI never in its stream: a
    run killed after printing something is charged about four characters a token (a lower bound), its
    input marked as an estimate (the usage, get_status, the CLI and the web view say so)."""
    member = _member(model)
    printed = _stream({"type": "item.started", "item": {"type": "command_execution", "command": "pytest"}})
    usage, cost = member.reported(PROMPT, printed)
    guessed = len(PROMPT) // 4 + 1
    assert usage == Usage(guessed, len(printed) // 4, 0, estimated_input_tokens=guessed) and cost is None
    assert usage.estimated
    assert member.reported(PROMPT, "") == (Usage(), None)  # killed before it printed anything


def test_on_macos_claude_codes_keychain_login_is_explained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No file login and no key: on macOS the message says the login is in the Keychain, which is not
    read, and how to give Claude Code a plan login that is (`claude setup-token`); elsewhere the file."""
    environ = {"HOME": str(tmp_path)}
    spec = parse_team({"agents": [{"model": "cli/claude-code"}]}, "t").agents[0]
    monkeypatch.setattr("conclave.config.clis.sys.platform", "darwin")
    with pytest.raises(ConfigError, match=r"Keychain, which Conclave does not read.*claude setup-token"):
        resolve_login(spec, environ)
    assert "CLAUDE_CODE_OAUTH_TOKEN" in (cli_status(spec, environ) or "")
    assert "Keychain" in login_fix(CLIS["claude-code"])
    # the token from `claude setup-token` is a login Conclave finds, on macOS too
    login = resolve_login(spec, {**environ, "CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat01-abcdefgh"})
    assert login.variable == "CLAUDE_CODE_OAUTH_TOKEN"
    assert cli_status(spec, {**environ, "CLAUDE_CODE_OAUTH_TOKEN": "x"}).startswith("logged in")  # type: ignore[union-attr]
    monkeypatch.setattr("conclave.config.clis.sys.platform", "linux")
    assert ".claude/.credentials.json" in login_fix(CLIS["claude-code"])
    assert "Keychain" not in login_fix(CLIS["claude-code"])
    assert "COPILOT_GITHUB_TOKEN" in login_fix(CLIS["copilot"])


GITHUB_TOKEN = "gho_" + "copilotgithublogin" * 2


@pytest.mark.parametrize(
    ("config", "variables", "source"),
    [
        (None, {"GH_TOKEN": GITHUB_TOKEN}, "GH_TOKEN"),
        (None, {"GITHUB_TOKEN": GITHUB_TOKEN}, "GITHUB_TOKEN"),
        (copilot_config(GITHUB_TOKEN), {}, "config.json"),
        (b'// managed automatically\n{"firstLaunchAt": "2026-11-26T20:32:57.045Z"}', {}, None),
        (b"// a half-written file\n{", {}, None),
    ],
)
def test_copilot_logins_are_its_token_variables_or_a_config_json_that_holds_the_token(
    tmp_path: Path, config: bytes | None, variables: dict[str, str], source: str | None
) -> None:
    """Copilot CLI 1.0.102 honours COPILOT_GITHUB_TOKEN, GH_TOKEN and GITHUB_TOKEN, and keeps a sign-in
    in ~/.copilot/config.json (`authTokens`) only where it may not use a keychain; the same file exists
    after any first run without one, and is then no login."""
    environ = {"HOME": str(tmp_path), **variables}
    spec = parse_team({"agents": [{"model": "cli/copilot"}]}, "t").agents[0]
    if config is not None:
        (tmp_path / ".copilot").mkdir()
        (tmp_path / ".copilot" / "config.json").write_bytes(config)
    found = login_source(CLIS["copilot"], environ)
    # beside a Claude key, the subscriptions preset keeps Copilot only when its login is found
    preset = resolve_team("subscriptions", {**environ, "ANTHROPIC_API_KEY": "sk-ant-test"})
    assert ("cli/copilot" in [agent.model for agent in preset.agents]) == (source is not None)
    assert (Path(found).name if found and not variables else found) == source
    if source is None:
        with pytest.raises(ConfigError, match="COPILOT_GITHUB_TOKEN"):
            resolve_login(spec, environ)
        return
    login = resolve_login(spec, environ)
    environment = Copilot().environment(login, None)
    if variables:
        assert login.files == {} and environment["COPILOT_GITHUB_TOKEN"] == GITHUB_TOKEN
    else:  # the file goes whole into the member's private HOME, where the CLI reads it
        assert login.files == {".copilot/config.json": config} and "COPILOT_GITHUB_TOKEN" not in environment


def test_a_copilot_sign_in_kept_in_the_keychain_is_named_with_its_fix(tmp_path: Path) -> None:
    """With a keychain, config.json names the account but holds no token: Copilot is not usable in a
    container, and doctor, list_teams and the error at submit say so, naming the account and the fix."""
    config = json.loads(copilot_config(GITHUB_TOKEN).decode().split("\n", 2)[2])
    del config["authTokens"]
    (tmp_path / ".copilot").mkdir()
    (tmp_path / ".copilot" / "config.json").write_text("// managed automatically\n" + json.dumps(config))
    environ = {"HOME": str(tmp_path)}
    spec = parse_team({"agents": [{"model": "cli/copilot"}]}, "t").agents[0]
    assert login_source(CLIS["copilot"], environ) is None
    assert keychain_user(CLIS["copilot"], environ) == "member-octocat"
    said = "signed in to Copilot CLI as member-octocat, but it keeps its sign-in in the system keychain"
    with pytest.raises(ConfigError, match=said):
        resolve_login(spec, environ)
    status = cli_status(spec, environ) or ""
    assert status.startswith(f"not logged in: you are {said}") and "gh auth token" in status
    probe = {probe.name: probe for probe in run_checks(Settings(home=tmp_path / "state"), environ)}
    copilot = probe["cli/copilot"]
    assert not copilot.ok and copilot.detail == "signed in as member-octocat, in the system keychain only"
    assert "COPILOT_GITHUB_TOKEN" in (copilot.fix or "") and "Copilot Requests" in (copilot.fix or "")
    assert keychain_user(CLIS["codex"], environ) is None  # only a CLI with a login key says this
