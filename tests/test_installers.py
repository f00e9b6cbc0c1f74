"""`conclave install`: each client's format and place, the approvals headless modes need, merging (comments
kept, TOML and JSON with comments), backups, idempotency, the skill."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from conclave.cli import TARGETS, client_files, install_claude, install_entries, jsonc
from conclave.cli import install as installers
from conclave.cli.main import main
from conclave.config.presets import configs_dir, list_presets, package_dir
from conclave.errors import ConfigError
from conclave.tools.catalog import tool_names

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


def plan(
    target: str, project: Path, home: Path, scope: str | None = None, approvals: bool = True, **environ: str
) -> installers.Plan:
    return installers.plan(
        target, scope, cwd=project, home=home, environ=environ, command=COMMAND, approvals=approvals
    )


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
    assert json.loads(registration.snippet) == {key: {"conclave": entry}}


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
    assert needed and needed <= set(install_entries.FORWARDED_ENV)
    for preset in configs_dir().glob("*.yaml"):  # ${VAR} settings too
        text = preset.read_text(encoding="utf-8")
        for name in re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", text):
            assert name in install_entries.FORWARDED_ENV, (preset.name, name)


def test_codex_forwards_every_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """A setting the user exported (say CONCLAVE_ALLOWED_ROOTS) must reach the server Codex starts."""
    from conclave.settings import Settings

    for name in Settings.model_fields:
        variable = f"CONCLAVE_{name.upper()}"
        if name != "http_token":  # only `serve --http` reads it, and Codex starts stdio servers
            assert variable in install_entries.FORWARDED_ENV, variable
    monkeypatch.setenv("CONCLAVE_MAX_QUEUED", "3")
    assert Settings().max_queued == 3  # the variable names are the ones pydantic-settings reads


def test_user_scopes(dirs: tuple[Path, Path]) -> None:
    project, home = dirs
    assert plan("cursor", project, home, "user").changes[0].path == home / ".cursor" / "mcp.json"
    if sys.platform.startswith("linux"):
        vscode = plan("vscode", project, home, "user", XDG_CONFIG_HOME=str(home / "cfg")).changes[0]
        assert vscode.path == home / "cfg" / "Code" / "User" / "mcp.json"
    claude = plan("claude-code", project, home, "user")
    assert [change.what for change in claude.changes] == [
        "tool approvals",
        "skill",
    ]  # ~/.claude.json is Claude's own
    assert claude.changes[0].path == home / ".claude" / "settings.json"
    assert claude.changes[1].path == home / ".claude" / "skills" / "conclave" / "SKILL.md"
    assert any(
        "claude mcp add --scope user conclave -- /opt/conclave/bin/conclave serve" in hint
        for hint in claude.hints
    )


def test_claude_code_copies_the_skill_with_its_front_matter(dirs: tuple[Path, Path]) -> None:
    project, home = dirs
    skill = plan("claude-code", project, home).changes[-1]
    assert skill.path == project / ".claude" / "skills" / "conclave" / "SKILL.md"
    assert skill.after == SKILL
    front = yaml.safe_load(SKILL.split("---")[1])
    assert front["name"] == "conclave" and "Use it" in front["description"]
    assert len(SKILL.splitlines()) < 150


def test_gemini_cli_trusts_the_server_and_names_the_keys_it_would_strip(dirs: tuple[Path, Path]) -> None:
    project, home = dirs
    change = plan("gemini", project, home).changes[0]
    assert (
        change.path == home / ".gemini" / "settings.json"
        and change.what == "MCP registration and tool approvals"
    )
    entry = jsonc.loads(change.after)["mcpServers"]["conclave"]
    assert entry["trust"] is True and entry["command"] == COMMAND[0] and entry["args"] == ["serve"]
    assert entry["env"]["OPENAI_API_KEY"] == "$OPENAI_API_KEY" and set(entry["env"]) == set(
        install_entries.KEY_VARIABLES
    )
    assert (
        "trust"
        not in jsonc.loads(plan("gemini", project, home, approvals=False).changes[0].after)["mcpServers"][
            "conclave"
        ]
    )
    assert plan("gemini", project, home, "project").changes[0].path == project / ".gemini" / "settings.json"


# Merging ---------------------------------------------------------------------------------------
def test_json_merge_keeps_other_servers_and_keys_and_replaces_our_entry_wholesale(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    before = {
        "inputs": [{"id": "token", "type": "promptString"}],
        "servers": {
            "github": {"type": "http", "url": "https://api.example/mcp"},
            "conclave": {"command": "old", "env": {"CONCLAVE_MAX_JOBS": "4"}},
        },
    }
    ours = {"command": "new", "args": []}
    merged = json.loads(client_files.merge_json(json.dumps(before), path, "servers", ours))
    assert merged["inputs"] == before["inputs"]
    assert merged["servers"]["github"] == before["servers"]["github"]
    assert merged["servers"]["conclave"] == {"command": "new", "args": []}  # a repo's env does not survive
    assert client_files.dropped(before["servers"]["conclave"], ours, "servers.conclave") == [
        "servers.conclave.env (CONCLAVE_MAX_JOBS)"
    ]


VSCODE_JSONC = """\
{
  // servers of mine
  "servers": {
    "github": {"type": "http", "url": "https://api.example/mcp"}, // the hosted one
    /* a block comment */
    "local": {"command": "x",},
  },
  "inputs": [],
}
"""


def test_json_with_comments_is_edited_in_place_keeping_every_comment(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    ours = {"type": "stdio", "command": "/new", "args": ["serve"]}
    after = client_files.merge_json(VSCODE_JSONC, path, "servers", ours)
    for kept in (
        "// servers of mine",
        "// the hosted one",
        "/* a block comment */",
        '"local": {"command": "x",},',
    ):
        assert kept in after
    assert after.startswith(VSCODE_JSONC[: VSCODE_JSONC.index('    "local"')])  # untouched up to our entry
    data = jsonc.loads(after)
    assert data["servers"]["conclave"] == ours and data["servers"]["github"]["type"] == "http"
    assert client_files.merge_json(after, path, "servers", ours) == after  # idempotent
    replaced = client_files.merge_json(after, path, "servers", {**ours, "command": "/newer"})
    assert jsonc.loads(replaced)["servers"]["conclave"]["command"] == "/newer"
    assert "// the hosted one" in replaced and replaced.count('"conclave"') == 1


def test_jsonc_edits_keep_layout_and_refuse_what_is_not_json() -> None:
    inline = jsonc.add_items(
        '{"permissions": {"allow": ["Bash(ls)"]}}', ["permissions", "allow"], ["a", "Bash(ls)"]
    )
    assert inline == '{"permissions": {"allow": ["Bash(ls)", "a"]}}'
    created = jsonc.add_items("{\n  // only a comment\n}\n", ["permissions", "allow"], ["a"])
    assert "// only a comment" in created and jsonc.loads(created) == {"permissions": {"allow": ["a"]}}
    assert jsonc.loads('{"a": "// not a comment", "b": [1, 2,],}') == {"a": "// not a comment", "b": [1, 2]}
    for broken, where in (
        ('{"a": /* open', "line 1 column 7"),
        ('{"a": 1 "b": 2}', "line 1 column 9"),
        ("[1]", "object"),
    ):
        with pytest.raises(jsonc.JsoncError, match=where):
            jsonc.set_value(broken, ["x"], 1)
    with pytest.raises(jsonc.JsoncError, match="a is not an object"):
        jsonc.set_value('{"a": 3}', ["a", "b"], 1)


# Approvals: what a headless run needs ------------------------------------------------------------
def test_codex_pre_approves_ask_team_cancel_job_and_steer_job_unless_told_not_to(
    dirs: tuple[Path, Path],
) -> None:
    project, home = dirs
    change = plan("codex", project, home).changes[0]
    table = tomllib.loads(change.after)["mcp_servers"]["conclave"]
    assert table["tools"] == {
        name: {"approval_mode": "approve"} for name in ("ask_team", "cancel_job", "steer_job")
    }
    assert change.what == "MCP registration and tool approvals" and "approval_mode" in change.snippet
    bare = plan("codex", project, home, approvals=False).changes[0]
    assert "tools" not in tomllib.loads(bare.after)["mcp_servers"]["conclave"]
    assert "approval" not in installers.describe(plan("codex", project, home, approvals=False))
    assert "--no-approvals" in installers.describe(plan("codex", project, home))


def test_claude_code_allows_the_five_tools_and_trusts_the_project_server(dirs: tuple[Path, Path]) -> None:
    project, home = dirs
    settings = project / ".claude" / "settings.local.json"
    settings.parent.mkdir(parents=True)
    settings.write_text('{\n  // mine\n  "permissions": {"allow": ["Bash(ls)"], "deny": ["Read(.env)"]}\n}\n')
    change = installers.plan(
        "claude-code", None, cwd=project, home=home, environ={}, command=COMMAND, claude_version=(2, 1, 330)
    ).changes[1]
    assert change.path == settings and change.what == "tool approvals"
    data = jsonc.loads(change.after)
    tools = [f"mcp__conclave__{tool}" for tool in tool_names()]
    assert data["permissions"] == {"allow": ["Bash(ls)", *tools], "deny": ["Read(.env)"]}
    assert data["enabledMcpjsonServers"] == ["conclave"] and "// mine" in change.after
    user = plan("claude-code", project, home, "user").changes[0]
    assert "enabledMcpjsonServers" not in jsonc.loads(user.after)  # user servers need no project trust
    assert [c.what for c in plan("claude-code", project, home, approvals=False).changes] == [
        "MCP registration",
        "skill",
    ]


@pytest.mark.parametrize("version", [(2, 1, 197), None])
def test_claude_code_that_gates_project_permissions_gets_them_at_user_scope(
    dirs: tuple[Path, Path], version: tuple[int, int, int] | None
) -> None:
    """Claude Code before 2.1.330 (or one that did not say its version) drops a project's allow list in a
    folder not trusted interactively, so `claude -p` refused ask_team: the list goes to the user's settings,
    merged into what is there (comments and the user's own entries kept), and the output says why."""
    project, home = dirs
    user = home / ".claude" / "settings.json"
    user.parent.mkdir()
    user.write_text('{\n  // my settings\n  "model": "opus",\n  "permissions": {"allow": ["Bash(ls)"]}\n}\n')
    user.chmod(0o600)
    made = installers.plan(
        "claude-code", None, cwd=project, home=home, environ={}, command=COMMAND, claude_version=version
    )
    local, shared = made.changes[1], made.changes[2]
    assert jsonc.loads(local.after) == {"enabledMcpjsonServers": ["conclave"]}  # what starts the server
    data = jsonc.loads(shared.after)
    tools = [f"mcp__conclave__{tool}" for tool in tool_names()]
    assert shared.path == user and data == {"model": "opus", "permissions": {"allow": ["Bash(ls)", *tools]}}
    assert "// my settings" in shared.after and "enabledMcpjsonServers" not in data
    said = installers.describe(made)
    assert (
        f"{user}: tool approvals at user scope: " in said
        and "the project's until the folder is trusted" in said
    )
    assert ("Claude Code 2.1.197 ignores" in said) == (version is not None)
    written = "\n".join(installers.write(made, stamp="t"))
    assert f"wrote {user} (tool approvals at user scope" in written and "backup at" in written
    assert user.stat().st_mode & 0o777 == 0o600 and jsonc.loads(user.read_text()) == data
    backups = list(user.parent.glob("settings.json.t-*.bak"))
    assert len(backups) == 1 and "// my settings" in backups[0].read_text()
    assert not any(
        c.needed
        for c in installers.plan(
            "claude-code", None, cwd=project, home=home, environ={}, command=COMMAND, claude_version=version
        ).changes
    )


def test_claude_code_user_settings_that_are_not_json_stop_the_install(dirs: tuple[Path, Path]) -> None:
    project, home = dirs
    user = home / ".claude" / "settings.json"
    user.parent.mkdir()
    user.write_text('{"permissions": {"allow": ["Bash(ls)"],}')
    with pytest.raises(
        ConfigError, match=re.escape(str(user)) + r" is not JSON .*nothing was written; fix it"
    ):
        installers.plan(
            "claude-code",
            None,
            cwd=project,
            home=home,
            environ={},
            command=COMMAND,
            claude_version=(2, 1, 197),
        )
    assert user.read_text() == '{"permissions": {"allow": ["Bash(ls)"],}'


def test_the_installed_claude_code_version_is_asked_on_path(tmp_path: Path) -> None:
    fake = tmp_path / "claude"
    fake.write_text("#!/bin/sh\necho '2.1.197 (Claude Code)'\n")
    fake.chmod(0o755)
    assert install_claude.installed_version({"PATH": str(tmp_path)}) == (2, 1, 197)
    assert install_claude.installed_version({"PATH": str(tmp_path / "none")}) is None
    fake.write_text("#!/bin/sh\nexit 3\n")
    assert install_claude.installed_version({"PATH": str(tmp_path)}) is None


def test_a_claude_planted_in_the_project_is_never_run(dirs: tuple[Path, Path]) -> None:
    """An empty or relative PATH entry means the working folder: a cloned repository's `./claude` would
    run."""
    project, _ = dirs
    planted = project / "claude"
    planted.write_text(f"#!/bin/sh\ntouch {project}/ran\necho 2.1.330\n")
    planted.chmod(0o755)
    assert install_claude.installed_version({"PATH": ":.:bin"}) is None and not (project / "ran").exists()


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


def test_codex_merge_replaces_only_our_table_wholesale_and_keeps_comments(tmp_path: Path) -> None:
    table = install_entries.codex_table(COMMAND)
    after = client_files.merge_codex_toml(CODEX_CONFIG, tmp_path / "config.toml", table)
    data = tomllib.loads(after)
    ours = data["mcp_servers"]["conclave"]
    assert ours["command"] == COMMAND[0] and ours["tool_timeout_sec"] == 60
    assert ours["tools"]["ask_team"] == {"approval_mode": "approve"}
    assert ours == table  # wholesale: what was there is named, not kept
    existing = tomllib.loads(CODEX_CONFIG)["mcp_servers"]["conclave"]
    assert client_files.dropped(existing, table, "mcp_servers.conclave") == [
        "mcp_servers.conclave.env_vars: MY_OWN_VAR",
        "mcp_servers.conclave.env (CONCLAVE_MAX_JOBS)",
    ]
    assert data["mcp_servers"]["docs"] == {"command": "npx", "args": ["-y", "docs-mcp"]}
    assert data["model"] == "gpt-5" and data["profiles"] == {"fast": {"model": "gpt-5-mini"}}
    for comment in ("# my Codex settings", "# the default model", "# keep me: the profile below"):
        assert comment in after
    assert after.index("# keep me") < after.index("[profiles.fast]") and after.endswith(CODEX_CONFIG[-42:])
    order = [after.index(marker) for marker in ("[mcp_servers.docs]", "[mcp_servers.conclave]", "# keep me")]
    assert order == sorted(order)
    assert client_files.merge_codex_toml(after, tmp_path / "config.toml", table) == after  # idempotent


def test_codex_merge_appends_to_a_file_without_us_and_refuses_inline_tables(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    table = install_entries.codex_table(COMMAND)
    after = client_files.merge_codex_toml('model = "o3"', path, table)
    assert after.startswith('model = "o3"\n\n[mcp_servers.conclave]\n')
    assert tomllib.loads(after)["mcp_servers"]["conclave"]["args"] == ["serve"]
    inline = 'mcp_servers = { conclave = { command = "old" } }\n'
    with pytest.raises(ConfigError, match="inline") as caught:
        client_files.merge_codex_toml(inline, path, table)
    assert "[mcp_servers.conclave]" in str(caught.value)  # says what to write by hand
    assert 'approval_mode = "approve"' in str(caught.value)
    with pytest.raises(ConfigError, match="not valid TOML"):
        client_files.merge_codex_toml("model = ", path, table)


def test_server_command_is_an_absolute_path_that_starts_this_installation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "argv", ["/usr/lib/python3/dist-packages/pytest"])
    command = installers.server_command()
    assert Path(command[0]).is_absolute() and command[-1] == "serve"
    version = subprocess.run([*command[:-1], "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("conclave ")
    monkeypatch.setattr(sys, "argv", ["x"])
    monkeypatch.setattr(sys, "executable", "/nowhere/bin/python3")
    assert installers.server_command() == ["/nowhere/bin/python3", "-m", "conclave", "serve"]


def test_under_uvx_the_command_makes_the_environment_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uvx's environment lives in uv's cache (`uv cache clean` empties it): the command is uv's own
    `tool run --from`; an environment elsewhere (`uv run`, `uv tool install`) keeps its script.
    tests/test_packaging.py runs the real uvx."""
    cache = tmp_path / "cache"
    bin_dir = cache / "archive-v0" / "abc" / "bin"
    bin_dir.mkdir(parents=True)
    uv = tmp_path / "uv"
    uv.write_text(f'#!/bin/sh\n[ "$1 $2" = "cache dir" ] && echo {cache}\n')
    uv.chmod(0o755)
    monkeypatch.setenv("UV", str(uv))
    monkeypatch.setattr(sys, "argv", ["x"])
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    command = installers.server_command()
    assert command[:4] == [str(uv), "tool", "run", "--from"] and command[5:] == ["conclave", "serve"]
    assert command[4]  # the wheel, folder or release this was installed from
    monkeypatch.setattr(sys, "executable", "/nowhere/bin/python3")
    assert installers.server_command() == ["/nowhere/bin/python3", "-m", "conclave", "serve"]


# Writing through the CLI ------------------------------------------------------------------------
def test_install_prints_without_writing(dirs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    project, _ = dirs
    assert main(["install", "cursor"]) == 0
    printed = capsys.readouterr().out
    assert ".cursor/mcp.json: MCP registration, would be created" in printed and "--write" in printed
    assert '"mcpServers"' in printed and not (project / ".cursor").exists()


@pytest.mark.parametrize("target", TARGETS)
def test_install_write_merges_backs_up_and_is_idempotent(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    project, home = dirs
    monkeypatch.setenv("CODEX_HOME", str(home / "codex"))
    path = (
        installers.plan(
            target, None, cwd=project, home=home, environ={"CODEX_HOME": str(home / "codex")}, command=COMMAND
        )
        .changes[0]
        .path
    )
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
    broken.write_text('{ "servers": { /* never closed\n}', encoding="utf-8")
    assert main(["install", "vscode", "--write"]) == 2
    err = capsys.readouterr().err
    assert "is not JSON (with comments)" in err and "not closed at line 1 column 16" in err
    assert broken.read_text(encoding="utf-8").startswith('{ "servers"') and not list(
        broken.parent.glob("*.bak")
    )


def test_an_http_registration_sends_the_token_from_a_variable_in_each_clients_syntax(
    dirs: tuple[Path, Path],
) -> None:
    project, home = dirs
    url = "http://127.0.0.1:8765/mcp"
    wanted = {
        "claude-code": {
            "type": "http",
            "url": url,
            "headers": {"Authorization": "Bearer ${CONCLAVE_HTTP_TOKEN}"},
        },
        "vscode": {
            "type": "http",
            "url": url,
            "headers": {"Authorization": "Bearer ${env:CONCLAVE_HTTP_TOKEN}"},
        },
        "cursor": {"url": url, "headers": {"Authorization": "Bearer ${env:CONCLAVE_HTTP_TOKEN}"}},
        "gemini": {
            "httpUrl": url,
            "headers": {"Authorization": "Bearer ${CONCLAVE_HTTP_TOKEN}"},
            "trust": True,
        },
    }
    for target, entry in wanted.items():
        made = installers.plan(target, None, cwd=project, home=home, environ={}, command=COMMAND, http=url)
        data = jsonc.loads(made.changes[0].after)
        assert data["servers" if target == "vscode" else "mcpServers"]["conclave"] == entry
        assert "export CONCLAVE_HTTP_TOKEN=" in installers.describe(made)
    codex = installers.plan("codex", None, cwd=project, home=home, environ={}, command=COMMAND, http=url)
    table = tomllib.loads(codex.changes[0].after)["mcp_servers"]["conclave"]
    assert (
        table["url"] == url
        and table["bearer_token_env_var"] == "CONCLAVE_HTTP_TOKEN"
        and "command" not in table
    )
    with pytest.raises(ConfigError, match="is not a URL"):
        installers.plan(
            "cursor", None, cwd=project, home=home, environ={}, command=COMMAND, http="localhost:8765"
        )
