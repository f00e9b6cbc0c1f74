"""The real coding agents delegate to Conclave headless, registered exactly as `conclave install X --write`
leaves them: `claude -p` (Claude Code), `codex exec` (Codex), `gemini -p` (Gemini CLI) and `copilot -p`
(GitHub Copilot CLI, which reads the project's `.mcp.json`), from npm, pinned.

Each CLI talks to a fake model of ours (tests/fakes/coding_agent.py: Anthropic Messages over SSE for
Claude Code and Copilot, the OpenAI Responses API over SSE for Codex, Gemini's streamGenerateContent
for Gemini CLI) that finds the conclave tools,
calls ask_team, then get_status until the job is done, and prints the team's answer. Conclave runs as
the CLI starts it (`conclave serve` over stdio), on a team of fake providers that answers in seconds.

The CLIs are installed by .ci/install-agent-clis.sh into .ci/agents/ (git-ignored); without them
these tests skip and say how to install them. CI installs them, so nothing skips there. Claude Code comes
twice: 2.1.330 run with Node 22 (.ci/agents), and 2.1.197, what `npm install` resolves on Node 20, run with
the machine's Node (.ci/agents-node20). 2.1.197 ignores a project's permissions until the workspace is
trusted, so the two take different routes through `conclave install` (server/cli/install_claude.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.coding_agent import FINAL_PREFIX, CodingAgent
from tests.fakes.processes import http_server
from tests.fakes.server import FakeProviders
from tests.fakes.team import TRIO, install, voter, write_team

ROOT = Path(__file__).resolve().parents[1]
AGENTS = ROOT / ".ci" / "agents" / "node_modules"
CLAUDE = AGENTS / ".bin" / "claude"
NODE22 = ROOT / ".ci" / "node" / "node_modules" / ".bin"
# Each Claude Code with the Node that `npm install` would have picked it for: (claude's bin folder, Node's).
CLAUDES = {
    "2.1.330": (AGENTS / ".bin", NODE22),
    "2.1.197": (ROOT / ".ci" / "agents-node20" / "node_modules" / ".bin", None),  # None: the machine's node
}
CODEX_JS = AGENTS / "@openai" / "codex" / "bin" / "codex.js"
COPILOT_JS = AGENTS / "@github" / "copilot" / "npm-loader.js"
GEMINI_JS = AGENTS / "@google" / "gemini-cli" / "bundle" / "gemini.js"
CONCLAVE = Path(sys.executable).with_name("conclave")
TEAM = "fake-trio"
TASK = "What is 6 * 7? Answer with the number."
# The team's key must be one `conclave install codex` forwards: Codex starts MCP servers with a short
# list of variables plus the server's `env_vars`. Not a provider's own key: the team's base_url is a fake
# server, and a provider's own key goes only to its official endpoint (docs/SECURITY.md).
TEAM_KEY = "VLLM_API_KEY"


def _require(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path.relative_to(ROOT)} is missing: run .ci/install-agent-clis.sh")


def _node() -> str:
    bundled = ROOT / ".ci" / "node" / "node_modules" / ".bin" / "node"
    found = str(bundled) if bundled.exists() else shutil.which("node")
    if found is None:
        pytest.skip("no Node to run Codex's launcher: run .ci/install-node-clients.sh")
    return found


@pytest.fixture
def fakes() -> Iterator[FakeProviders]:
    with FakeProviders() as running:
        install(running.script, TRIO, voter())
        yield running


@pytest.fixture
def setup(tmp_path: Path, fakes: FakeProviders) -> tuple[Path, dict[str, str]]:
    """A project folder and the environment a user's shell would have: Conclave's state and team folder,
    the team's key, a home of its own (no real config of anyone's is read or written)."""
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    write_team(
        tmp_path / "config" / "conclave" / "teams" / f"{TEAM}.yaml", fakes, TRIO, name=TEAM, key_env=TEAM_KEY
    )
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "CONCLAVE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        TEAM_KEY: "test-key",
        "FASTMCP_LOG_LEVEL": "WARNING",
    }
    return project, env


def _install(target: str, project: Path, env: dict[str, str]) -> str:
    """`conclave install TARGET --write`, run as a user would; its output."""
    done = subprocess.run(
        [str(CONCLAVE), "install", target, "--write"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _run(command: list[str], project: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        command, cwd=project, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
    )
    print(f"$ {' '.join(command[:3])} ...\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}")
    return done


def _check_delegation(agent: CodingAgent, printed: str) -> None:
    """The model found the tools with its first search (or, after waiting for the server, in the request
    itself), asked, polled, and the CLI printed the answer."""
    found = agent.searches[0] if agent.searches else agent.first_step or []
    assert {"ask_team", "get_status"} <= _bare(found), (agent.searches, agent.first_step)
    _check_answer(agent, printed)


def _check_answer(agent: CodingAgent, printed: str) -> None:
    """The model asked, polled until the job completed, and the CLI printed the team's answer."""
    assert agent.calls[0] == "ask_team" and "get_status" in agent.calls[1:], agent.calls
    final = json.loads(agent.results[-1][agent.results[-1].find('{"') :])
    assert final["state"] == "completed" and final["result"]["answer"].startswith("FINAL: the team's answer")
    assert f"{FINAL_PREFIX} {final['result']['answer']}" in printed


def _copilot_env(fakes: FakeProviders, env: dict[str, str]) -> dict[str, str]:
    """Copilot CLI offline, its model the scripted fake behind the Anthropic wire format."""
    return {
        **env,
        "COPILOT_PROVIDER_BASE_URL": fakes.base_url("anthropic", "copilot"),
        "COPILOT_PROVIDER_TYPE": "anthropic",
        "COPILOT_PROVIDER_API_KEY": "sk-fake",
        "COPILOT_MODEL": "claude-sonnet-5",
        "COPILOT_OFFLINE": "true",
        "COPILOT_AUTO_UPDATE": "false",
    }


def _bare(names: list[str]) -> set[str]:
    return {name.replace("/", "__").split("__")[-1] for name in names if "conclave" in name}


def _claude_on_path(version: str, env: dict[str, str]) -> dict[str, str]:
    """`env` with this Claude Code, and the Node it was installed with, first on PATH: `conclave install`
    asks `claude --version` there, as it would on a user's machine."""
    claude_bin, node_bin = CLAUDES[version]
    _require(claude_bin / "claude")
    if node_bin is not None:
        _require(node_bin / "node")
    folders = [str(claude_bin)] + ([str(node_bin)] if node_bin is not None else [])
    return {**env, "PATH": os.pathsep.join([*folders, env["PATH"]])}


@pytest.mark.parametrize("version", list(CLAUDES))
def test_claude_code_print_mode_delegates_with_what_install_wrote(
    setup: tuple[Path, dict[str, str]], fakes: FakeProviders, version: str
) -> None:
    """A fresh project and a fresh home: nothing trusted by hand, only what `conclave install` wrote."""
    project, env = setup
    env = _claude_on_path(version, env)
    found = subprocess.run(["claude", "--version"], env=env, capture_output=True, text=True, timeout=60)
    assert found.stdout.startswith(version), found.stdout + found.stderr
    said = _install("claude-code", project, env)
    assert ".mcp.json (MCP registration)" in said and "tool approvals" in said, said
    # 2.1.197 ignores a project's allow list in an untrusted folder: install says so and writes the user's.
    gated = version == "2.1.197"
    assert ("tool approvals at user scope: Claude Code 2.1.197 ignores" in said) == gated, said
    assert (Path(env["HOME"]) / ".claude" / "settings.json").exists() == gated
    agent = CodingAgent("anthropic", TASK, TEAM)
    fakes.script.set_default("claude", agent)
    env = {
        **env,
        "ANTHROPIC_BASE_URL": fakes.base_url("anthropic", "claude"),
        "ANTHROPIC_API_KEY": "sk-ant-fake",
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    done = _run(["claude", "-p", f"Ask the conclave team: {TASK}", "--output-format", "json"], project, env)
    assert done.returncode == 0
    assert "has not been trusted" not in done.stderr  # no permission of ours was dropped
    result = json.loads(done.stdout)
    assert not result["is_error"] and result["permission_denials"] == []
    _check_delegation(agent, result["result"])
    # What Claude Code's model read: the structured result as JSON, led by what matters.
    read = json.loads(agent.results[-1][agent.results[-1].find('{"') :])
    assert list(read)[:3] == ["job_id", "state", "result"]
    assert list(read["result"])[:3] == ["answer", "consensus", "winner"]


def test_claude_code_reaches_the_http_server_with_the_header_install_wrote(
    setup: tuple[Path, dict[str, str]], fakes: FakeProviders, tmp_path: Path
) -> None:
    """`conclave serve --http` always needs a token; `install --http` writes Claude Code's Authorization
    header, which reads the token from CONCLAVE_HTTP_TOKEN in the client's environment."""
    _require(CLAUDE)
    project, env = setup
    with http_server(
        tmp_path, {key: value for key, value in env.items() if key != "PATH"}, token=None
    ) as url:
        done = subprocess.run(
            [str(CONCLAVE), "install", "claude-code", "--http", url, "--write"],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0 and "CONCLAVE_HTTP_TOKEN" in done.stdout, done.stderr
        assert "Bearer ${CONCLAVE_HTTP_TOKEN}" in (project / ".mcp.json").read_text(encoding="utf-8")
        token = (Path(env["CONCLAVE_HOME"]) / "http-token").read_text(encoding="utf-8").strip()
        agent = CodingAgent("anthropic", TASK, TEAM)
        fakes.script.set_default("claude", agent)
        env = {
            **env,
            "CONCLAVE_HTTP_TOKEN": token,
            "ANTHROPIC_BASE_URL": fakes.base_url("anthropic", "claude"),
            "ANTHROPIC_API_KEY": "sk-ant-fake",
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
        done = _run(
            [str(CLAUDE), "-p", f"Ask the conclave team: {TASK}", "--output-format", "json"], project, env
        )
        assert done.returncode == 0
        result = json.loads(done.stdout)
        assert not result["is_error"] and result["permission_denials"] == []
        _check_delegation(agent, result["result"])


def test_codex_exec_delegates_with_what_install_wrote(
    setup: tuple[Path, dict[str, str]], fakes: FakeProviders
) -> None:
    _require(CODEX_JS)
    project, env = setup
    codex_home = project.parent / "codex"
    env = {**env, "CODEX_HOME": str(codex_home), "FAKE_MODEL_KEY": "sk-fake"}
    said = _install("codex", project, env)
    assert "config.toml (MCP registration and tool approvals)" in said
    agent = CodingAgent("responses", TASK, TEAM)
    fakes.script.set_default("codex", agent)
    # The model provider is the test's; everything about conclave is as `conclave install` wrote it.
    config = codex_home / "config.toml"
    provider = (
        f'model = "gpt-5.5"\nmodel_provider = "fake"\n\n[model_providers.fake]\nname = "fake"\n'
        f'base_url = "{fakes.base_url("responses", "codex")}"\nwire_api = "responses"\n'
        f'env_key = "FAKE_MODEL_KEY"\n\n'
    )
    config.write_text(provider + config.read_text(encoding="utf-8"), encoding="utf-8")
    done = _run(
        [_node(), str(CODEX_JS), "exec", "--skip-git-repo-check", f"Ask the conclave team: {TASK}"],
        project,
        env,
    )
    assert done.returncode == 0
    assert "requires approval" not in done.stdout + done.stderr
    # Codex's first step already had conclave: its first tool_search returned the tools.
    _check_delegation(agent, done.stdout)


def test_copilot_print_mode_delegates_with_the_project_mcp_json(
    setup: tuple[Path, dict[str, str]], fakes: FakeProviders, tmp_path: Path
) -> None:
    """Copilot CLI strips variables that look like secrets from an MCP server's environment, so this
    team runs without a key (like an Ollama team); docs/clients.md says how to forward keys to it."""
    _require(COPILOT_JS)
    project, env = setup
    write_team(
        tmp_path / "config" / "conclave" / "teams" / f"{TEAM}.yaml",
        fakes,
        TRIO,
        name=TEAM,
        key_env="CONCLAVE_TEST_UNSET_KEY",
        api_key_required=False,
    )
    _install("claude-code", project, env)  # .mcp.json: Copilot CLI reads the same file
    agent = CodingAgent("anthropic", TASK, TEAM)
    fakes.script.set_default("copilot", agent)
    env = _copilot_env(fakes, env)
    # -p mode reads a project's MCP servers only from a trusted folder, and runs only allowed tools;
    # both are command-line flags (docs/clients.md, "GitHub Copilot CLI").
    done = _run(
        [
            _node(),
            str(COPILOT_JS),
            "-p",
            f"Ask the conclave team: {TASK}",
            "--trust-folder",
            "--allow-tool=conclave",
        ],
        project,
        env,
    )
    assert done.returncode == 0
    assert {"conclave-ask_team", "conclave-get_status"} <= set(agent.first_step or []), agent.first_step
    _check_answer(agent, done.stdout)


def test_copilot_print_mode_delegates_with_what_install_copilot_wrote(
    setup: tuple[Path, dict[str, str]], fakes: FakeProviders
) -> None:
    """`conclave install copilot --write`: ~/.copilot/mcp-config.json with `env` naming the key set now,
    so the team's key reaches Conclave although Copilot CLI strips secrets from a server's environment."""
    _require(COPILOT_JS)
    project, env = setup
    said = _install("copilot", project, env)
    config = json.loads((Path(env["HOME"]) / ".copilot" / "mcp-config.json").read_text(encoding="utf-8"))
    assert config["mcpServers"]["conclave"]["env"] == {TEAM_KEY: f"${{{TEAM_KEY}}}"}, said
    assert "--allow-tool=conclave" in said
    agent = CodingAgent("anthropic", TASK, TEAM)
    fakes.script.set_default("copilot", agent)
    env = _copilot_env(fakes, env)
    done = _run(
        [_node(), str(COPILOT_JS), "-p", f"Ask the conclave team: {TASK}", "--allow-tool=conclave"],
        project,
        env,
    )
    assert done.returncode == 0
    _check_answer(agent, done.stdout)


def test_gemini_cli_prompt_mode_delegates_with_what_install_wrote(
    setup: tuple[Path, dict[str, str]], fakes: FakeProviders
) -> None:
    _require(GEMINI_JS)
    project, env = setup
    settings = Path(env["HOME"]) / ".gemini" / "settings.json"
    settings.parent.mkdir()
    # A user's Gemini CLI set up for an API key, with comments (its settings file is JSON with comments).
    settings.write_text(
        '{\n  // set up by the user\n  "security": {"auth": {"selectedType": "gemini-api-key"}},\n'
        '  "general": {"disableAutoUpdate": true}\n}\n',
        encoding="utf-8",
    )
    said = _install("gemini", project, env)
    assert "settings.json (MCP registration and tool approvals)" in said
    assert "// set up by the user" in settings.read_text(encoding="utf-8")
    agent = CodingAgent("gemini", TASK, TEAM)
    fakes.script.set_default("gemini", agent)
    env = {
        **env,
        "GEMINI_API_KEY": "fake-key",
        "GOOGLE_GEMINI_BASE_URL": fakes.base_url("gemini", "gemini"),
        "GEMINI_CLI_NO_RELAUNCH": "true",
    }
    # --skip-trust: headless Gemini CLI refuses any folder not trusted before, Conclave or not.
    done = _run(
        [_node(), str(GEMINI_JS), "-p", f"Ask the conclave team: {TASK}", "--skip-trust"], project, env
    )
    assert done.returncode == 0
    assert {"mcp_conclave_ask_team", "mcp_conclave_get_status"} <= set(agent.first_step or []), (
        agent.first_step
    )
    assert agent.calls[0] == "ask_team" and "get_status" in agent.calls[1:], agent.calls
    # Gemini CLI hands its model the text block (JobView.text()), not the structured result.
    final = agent.results[-1]
    assert ": completed - " in final and "\nFinal answer:\nFINAL: the team's answer" in final
    answer = final.split("\nFinal answer:\n", 1)[1].split("\n\nNext: ", 1)[0]
    assert f"{FINAL_PREFIX} {answer}" in done.stdout
