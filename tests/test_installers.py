"""`conclave install`: each client's format and place, merging, backups, idempotency, the skill."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from conclave.cli import install as installers
from conclave.cli.main import main
from conclave.config import list_presets
from conclave.errors import ConfigError
from conclave.config import configs_dir, package_dir

COMMAND = ["/opt/conclave/bin/conclave", "serve"]
STDIO = {"type": "stdio", "command": COMMAND[0], "args": ["serve"]}
SKILL = (package_dir("conclave.skills") / "conclave" / "SKILL.md").read_text(encoding="utf-8")


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A project folder as the cwd and a home, with CODEX_HOME unset (tests set it when they need it)."""
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    monkeypatch.chdir(project)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("CODEX_HOME", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    return project, home


def plan(target: str, project: Path, home: Path, scope: str | None = None, **environ: str) -> installers.Plan:
    return installers.plan(target, scope, cwd=project, home=home, environ=environ, command=COMMAND)


# Formats and places ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("target", "relative", "key", "entry"),
    [
        ("claude-code", ".mcp.json", "mcpServers", STDIO),
        ("cursor", ".cursor/mcp.json", "mcpServers", {"command": COMMAND[0], "args": ["serve"]}),
        ("vscode", ".vscode/mcp.json", "servers", STDIO),
    ],
)
def test_json_clients_get_their_own_key_and_place(
    dirs: tuple[Path, Path], target: str, relative: str, key: str, entry: dict[str, object]
) -> None:
    project, home = dirs
    made = plan(target, project, home)
    registration = made.changes[0]
    assert registration.path == project / relative and registration.before is None
    assert json.loads(registration.after) == {key: {"conclave": entry}}
    assert json.loads(made.snippet) == {key: {"conclave": entry}}


def test_codex_table_in_codex_home_with_keys_forwarded_and_timeouts(dirs: tuple[Path, Path]) -> None:
    project, home = dirs
    default = plan("codex", project, home).changes[0]
    assert default.path == home / ".codex" / "config.toml"
    moved = plan("codex", project, home, CODEX_HOME=str(home / "elsewhere")).changes[0]
    assert moved.path == home / "elsewhere" / "config.toml"
    table = tomllib.loads(moved.after)["mcp_servers"]["conclave"]
    assert table["command"] == COMMAND[0] and table["args"] == ["serve"]
    assert {"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY"} <= set(table["env_vars"])
    assert table["tool_timeout_sec"] == 60 and table["startup_timeout_sec"] >= 20
    assert plan("codex", project, home, scope="project").changes[0].path == project / ".codex" / "config.toml"


def test_codex_forwards_every_key_a_preset_needs() -> None:
    needed = set()
    for _, team in list_presets({}):
        if not isinstance(team, ConfigError):
            needed |= {name for agent in team.agents for name in agent.key_variables()}
    assert needed and needed <= set(installers.FORWARDED_ENV)
    for preset in configs_dir().glob("*.yaml"):  # ${VAR} settings too
        text = preset.read_text(encoding="utf-8")
        for name in re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", text):
            assert name in installers.FORWARDED_ENV, (preset.name, name)


def test_user_scopes(dirs: tuple[Path, Path]) -> None:
    project, home = dirs
    assert plan("cursor", project, home, "user").changes[0].path == home / ".cursor" / "mcp.json"
    if sys.platform.startswith("linux"):
        vscode = plan("vscode", project, home, "user", XDG_CONFIG_HOME=str(home / "cfg")).changes[0]
        assert vscode.path == home / "cfg" / "Code" / "User" / "mcp.json"
    claude = plan("claude-code", project, home, "user")
    assert [change.what for change in claude.changes] == ["skill"]  # ~/.claude.json is Claude's own
    assert claude.changes[0].path == home / ".claude" / "skills" / "conclave" / "SKILL.md"
    assert any("claude mcp add --scope user conclave -- /opt/conclave/bin/conclave serve" in hint
               for hint in claude.hints)


def test_claude_code_copies_the_skill_with_its_front_matter(dirs: tuple[Path, Path]) -> None:
    project, home = dirs
    skill = plan("claude-code", project, home).changes[1]
    assert skill.path == project / ".claude" / "skills" / "conclave" / "SKILL.md"
    assert skill.after == SKILL
    front = yaml.safe_load(SKILL.split("---")[1])
    assert front["name"] == "conclave" and "Use it" in front["description"]
    assert len(SKILL.splitlines()) < 150


# Merging ---------------------------------------------------------------------------------------
def test_json_merge_keeps_other_servers_and_keys_and_our_extra_settings(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    before = {
        "inputs": [{"id": "token", "type": "promptString"}],
        "servers": {
            "github": {"type": "http", "url": "https://api.example/mcp"},
            "conclave": {"command": "old", "env": {"CONCLAVE_MAX_JOBS": "4"}},
        },
    }
    ours = {"command": "new", "args": []}
    merged = json.loads(installers.merge_json(json.dumps(before), path, "servers", ours))
    assert merged["inputs"] == before["inputs"]
    assert merged["servers"]["github"] == before["servers"]["github"]
    assert merged["servers"]["conclave"] == {"command": "new", "args": [], "env": {"CONCLAVE_MAX_JOBS": "4"}}


def test_json_with_comments_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    with pytest.raises(ConfigError, match="mcp.json is not plain JSON"):
        installers.merge_json('{\n  // mine\n  "servers": {}\n}', path, "servers", {"command": "x"})


CODEX_CONFIG = """\
# my Codex settings
model = "gpt-5"  # the default model

[mcp_servers.docs]
command = "npx"
args = ["-y", "docs-mcp"]

[mcp_servers.conclave]
command = "/old/conclave"  # replaced
args = ["serve"]
env_vars = ["MY_OWN_VAR"]

[mcp_servers.conclave.env]
CONCLAVE_MAX_JOBS = "3"

# keep me: the profile below
[profiles.fast]
model = "gpt-5-mini"
"""


def test_codex_merge_replaces_only_our_table_and_keeps_comments(tmp_path: Path) -> None:
    table = installers.codex_table(COMMAND)
    after = installers.merge_codex_toml(CODEX_CONFIG, tmp_path / "config.toml", table)
    data = tomllib.loads(after)
    ours = data["mcp_servers"]["conclave"]
    assert ours["command"] == COMMAND[0] and ours["tool_timeout_sec"] == 60
    assert ours["env"] == {"CONCLAVE_MAX_JOBS": "3"}  # the user's settings survive
    assert ours["env_vars"][0] == "MY_OWN_VAR" and "OPENAI_API_KEY" in ours["env_vars"]
    assert data["mcp_servers"]["docs"] == {"command": "npx", "args": ["-y", "docs-mcp"]}
    assert data["model"] == "gpt-5" and data["profiles"] == {"fast": {"model": "gpt-5-mini"}}
    for comment in ("# my Codex settings", "# the default model", "# keep me: the profile below"):
        assert comment in after
    order = [after.index(marker) for marker in ("[mcp_servers.docs]", "[mcp_servers.conclave]", "# keep me")]
    assert order == sorted(order)
    assert installers.merge_codex_toml(after, tmp_path / "config.toml", table) == after  # idempotent


def test_codex_merge_appends_to_a_file_without_us_and_refuses_inline_tables(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    table = installers.codex_table(COMMAND)
    after = installers.merge_codex_toml('model = "o3"', path, table)
    assert after.startswith('model = "o3"\n\n[mcp_servers.conclave]\n')
    assert tomllib.loads(after)["mcp_servers"]["conclave"]["args"] == ["serve"]
    inline = 'mcp_servers = { conclave = { command = "old" } }\n'
    with pytest.raises(ConfigError, match="inline") as caught:
        installers.merge_codex_toml(inline, path, table)
    assert "[mcp_servers.conclave]" in str(caught.value)  # says what to write by hand
    with pytest.raises(ConfigError, match="not valid TOML"):
        installers.merge_codex_toml("model = ", path, table)


def test_server_command_is_an_absolute_path_that_starts_this_installation() -> None:
    command = installers.server_command(argv0="/usr/lib/python3/dist-packages/pytest")
    assert Path(command[0]).is_absolute() and command[-1] == "serve"
    version = subprocess.run([*command[:-1], "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("conclave ")
    fallback = installers.server_command(argv0="x", executable="/nowhere/bin/python3")
    assert fallback == ["/nowhere/bin/python3", "-m", "conclave", "serve"]


# Writing through the CLI ------------------------------------------------------------------------
def test_install_prints_without_writing(dirs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    project, _ = dirs
    assert main(["install", "cursor"]) == 0
    printed = capsys.readouterr().out
    assert ".cursor/mcp.json: MCP registration, would be created" in printed and "--write" in printed
    assert '"mcpServers"' in printed and not (project / ".cursor").exists()


@pytest.mark.parametrize("target", installers.TARGETS)
def test_install_write_merges_backs_up_and_is_idempotent(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    project, home = dirs
    monkeypatch.setenv("CODEX_HOME", str(home / "codex"))
    path = installers.plan(target, None, cwd=project, home=home, environ={"CODEX_HOME": str(home / "codex")},
                           command=COMMAND).changes[0].path
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".toml":
        original = '# mine\n[mcp_servers.other]\ncommand = "other"\n'
    else:
        key = "servers" if target == "vscode" else "mcpServers"
        original = json.dumps({key: {"other": {"command": "other"}}, "extra": True}, indent=2) + "\n"
    path.write_text(original, encoding="utf-8")

    assert main(["install", target, "--write"]) == 0
    first = capsys.readouterr().out
    assert f"wrote {path}" in first and "backup at" in first
    backups = list(path.parent.glob(f"{path.name}.*.bak"))
    assert len(backups) == 1 and backups[0].read_text(encoding="utf-8") == original
    written = path.read_text(encoding="utf-8")
    if path.suffix == ".toml":
        data = tomllib.loads(written)
        assert written.startswith("# mine\n") and data["mcp_servers"]["other"] == {"command": "other"}
        assert data["mcp_servers"]["conclave"]["args"] == ["serve"]
    else:
        data = json.loads(written)
        assert data["extra"] is True and data[key]["other"] == {"command": "other"}
        assert data[key]["conclave"]["args"] == ["serve"]
        assert Path(data[key]["conclave"]["command"]).is_absolute()
    if target == "claude-code":
        assert (project / ".claude" / "skills" / "conclave" / "SKILL.md").read_text(encoding="utf-8") == SKILL

    assert main(["install", target, "--write"]) == 0
    second = capsys.readouterr().out
    assert "Nothing changed" in second and "already up to date" in second and "wrote" not in second
    assert path.read_text(encoding="utf-8") == written
    assert len(list(path.parent.glob(f"{path.name}.*.bak"))) == 1


def test_a_broken_file_is_left_alone_with_an_error(
    dirs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    project, _ = dirs
    broken = project / ".vscode" / "mcp.json"
    broken.parent.mkdir()
    broken.write_text("{ // JSONC\n}", encoding="utf-8")
    assert main(["install", "vscode", "--write"]) == 2
    assert "is not plain JSON" in capsys.readouterr().err
    assert broken.read_text(encoding="utf-8") == "{ // JSONC\n}" and not list(broken.parent.glob("*.bak"))
