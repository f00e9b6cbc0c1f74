"""Team configuration: the shipped presets, `${ENV}` expansion, error messages, lookup and the default team.

Every call passes `environ=` explicitly; nothing here reads the real environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from conclave.config.loading import expand_env, load_team_file, parse_team
from conclave.config.models import AgentSpec, SandboxSpec, Team
from conclave.config.presets import configs_dir, list_presets, preset_paths, resolve_team
from conclave.config.providers import PROVIDERS
from conclave.errors import ConfigError, MissingApiKey, TeamNotFound

SHIPPED = ("frontier", "anthropic", "openai", "gemini", "ollama", "vllm", "openrouter")
ALL_KEYS = {"ANTHROPIC_API_KEY": "sk-ant", "OPENAI_API_KEY": "sk-oai", "GEMINI_API_KEY": "gm-key"}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """An environment with no keys whose user team folder is an empty folder under tmp_path."""
    return {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path / "home")}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def one_agent(**extra: Any) -> dict[str, Any]:
    return {"name": "t", "agents": [{"model": "openai/gpt-5", **extra}]}


def config_error(data: Any, environ: dict[str, str] | None = None, source: str = "team.yaml") -> str:
    with pytest.raises(ConfigError) as caught:
        parse_team(data, source, environ or {})
    return str(caught.value)


# The shipped presets ------------------------------------------------------------------------------
def test_every_shipped_preset_is_present(env: dict[str, str]) -> None:
    presets = preset_paths(env)
    for name in SHIPPED:
        assert name in presets, f"preset {name} missing from {configs_dir()}"
        assert presets[name].parent == Path(str(configs_dir()))


@pytest.mark.parametrize("path", sorted(Path(str(configs_dir())).glob("*.y*ml")), ids=lambda p: p.stem)
def test_every_preset_file_loads_and_validates(path: Path, env: dict[str, str]) -> None:
    team = load_team_file(path, env)
    assert team.name == path.stem
    assert team.description
    assert 1 <= len(team.agents) <= 16
    for agent in team.agents:
        assert agent.provider in PROVIDERS
        assert agent.model_name
        assert "${" not in agent.model and "${" not in (agent.base_url or "")


def test_list_presets_loads_every_preset_without_errors(env: dict[str, str]) -> None:
    listed = dict(list_presets(env))
    assert set(SHIPPED) <= set(listed)
    broken = {name: str(team) for name, team in listed.items() if isinstance(team, ConfigError)}
    assert broken == {}


def test_frontier_preset_matches_the_design(env: dict[str, str]) -> None:
    team = resolve_team("frontier", env)
    assert [agent.model for agent in team.agents] == [
        "anthropic/claude-sonnet-4-5",
        "openai/gpt-5",
        "gemini/gemini-2.5-pro",
    ]
    assert team.agents[2].temperature == 0.7
    assert team.coordination.max_answers_per_agent == 3
    assert team.coordination.consensus == "all_voted"
    assert team.coordination.timeout_s == 900
    assert isinstance(team.sandbox, SandboxSpec) and team.sandbox.network == "none"


def test_local_server_presets_use_defaults_and_need_no_key(env: dict[str, str]) -> None:
    ollama = resolve_team("ollama", env)
    assert {agent.model for agent in ollama.agents} == {"openai/qwen2.5-coder:7b"}
    assert {agent.base_url for agent in ollama.agents} == {"http://127.0.0.1:11434/v1"}
    assert ollama.sandbox == "none"
    vllm = resolve_team("vllm", env)
    assert {agent.base_url for agent in vllm.agents} == {"http://127.0.0.1:8000/v1"}
    for team in (ollama, vllm):
        assert team.missing_keys(env) == []
        assert {agent.api_key(env) for agent in team.agents} == {"unused"}


def test_local_server_presets_follow_their_variables(env: dict[str, str]) -> None:
    ollama = {"OLLAMA_MODEL": "llama3.1:8b", "OLLAMA_BASE_URL": "http://gpu:11434/v1", "OLLAMA_API_KEY": "k"}
    environ = {**env, **ollama}
    team = resolve_team("ollama", environ)
    assert {agent.model for agent in team.agents} == {"openai/llama3.1:8b"}
    assert {agent.base_url for agent in team.agents} == {"http://gpu:11434/v1"}
    assert team.agents[0].api_key(environ) == "k"


def test_openrouter_preset_needs_its_own_key(env: dict[str, str]) -> None:
    team = resolve_team("openrouter", {**env, **ALL_KEYS})
    assert team.missing_keys({**env, **ALL_KEYS}) == ["OPENROUTER_API_KEY"]
    assert team.missing_keys({**env, "OPENROUTER_API_KEY": "or"}) == []
    assert {agent.base_url for agent in team.agents} == {"https://openrouter.ai/api/v1"}


# ${VAR} expansion ---------------------------------------------------------------------------------
def test_expand_env_replaces_variables_in_nested_strings() -> None:
    tree = {"a": "${X}", "b": ["pre-${Y:-dflt}-post", 3, None], "c": {"d": "${X}/${Y:-z}"}, "e": True}
    assert expand_env(tree, {"X": "ex"}, "f.yaml") == {
        "a": "ex",
        "b": ["pre-dflt-post", 3, None],
        "c": {"d": "ex/z"},
        "e": True,
    }


def test_set_variable_wins_over_its_default() -> None:
    assert expand_env("${Y:-dflt}", {"Y": "set"}, "f.yaml") == "set"
    assert expand_env("${Y:-}", {}, "f.yaml") == ""


def test_expansion_applies_when_parsing_a_team() -> None:
    data = {
        "agents": [
            {
                "model": "openai/${MODEL}",
                "base_url": "${URL:-http://localhost:1/v1}",
                "api_key_env": "LOCAL_KEY",
            }
        ]
    }
    team = parse_team(data, "mine.yaml", {"MODEL": "gpt-5-mini"})
    assert team.agents[0].model == "openai/gpt-5-mini"
    assert team.agents[0].base_url == "http://localhost:1/v1"
    assert team.name == "mine"  # defaults to the file's stem


def test_unset_variable_without_default_is_an_error_naming_it() -> None:
    message = config_error({"agents": [{"model": "openai/${CONCLAVE_TEST_MODEL}"}]}, {"OTHER": "x"}, "t.yaml")
    assert "CONCLAVE_TEST_MODEL" in message
    assert "t.yaml" in message
    assert "is not set" in message


def test_expansion_reads_only_the_given_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONCLAVE_TEST_ONLY_REAL", "from-process")
    with pytest.raises(ConfigError, match="CONCLAVE_TEST_ONLY_REAL"):
        parse_team({"agents": [{"model": "openai/${CONCLAVE_TEST_ONLY_REAL}"}]}, "t.yaml", {})


# Unknown keys and bad values ----------------------------------------------------------------------
def test_unknown_top_level_key_names_file_key_and_nearest() -> None:
    message = config_error({**one_agent(), "descripton": "x"}, source="/teams/mine.yaml")
    assert "/teams/mine.yaml" in message
    assert "'descripton'" in message
    assert "did you mean 'description'" in message


def test_unknown_agent_key_names_the_full_path_and_nearest() -> None:
    data = {"agents": [{"model": "openai/a"}, {"model": "openai/b", "temprature": 0.3}]}
    message = config_error(data, source="two.yaml")
    assert message.startswith("two.yaml: ")
    assert "'agents.1.temprature'" in message
    assert "did you mean 'temperature'" in message


def test_a_cli_members_errors_name_its_path_without_its_kind() -> None:
    """A team's agents are parsed into the type of their kind; the kind is no part of a key's path."""
    data = {"agents": [{"model": "openai/a"}, {"model": "cli/codex", "timout_s": 60}, {"model": "cli/vim"}]}
    message = config_error(data, source="clis.yaml")
    assert "'agents.1.timout_s'" in message and "did you mean 'timeout_s'" in message
    assert "clis.yaml: agents.2.model: " in message and "names no coding-agent CLI" in message
    team = parse_team({"agents": [{"model": "cli/codex:gpt-5.5"}, {"model": "openai/a"}]}, "t.yaml", {})
    assert [agent.model for agent in team.clis] == ["cli/codex:gpt-5.5"]
    assert [agent.timeout_s for agent in team.agents] == [600.0, 120.0]  # a CLI's turn is a whole run


def test_unknown_coordination_key_names_the_full_path_and_nearest() -> None:
    message = config_error({**one_agent(), "coordination": {"max_answer_per_agent": 2}}, source="c.yaml")
    assert "c.yaml" in message
    assert "'coordination.max_answer_per_agent'" in message
    assert "did you mean 'max_answers_per_agent'" in message


def test_unknown_nested_price_key_names_the_full_path() -> None:
    message = config_error(one_agent(price={"input": 1.0, "outptu": 2.0}), source="p.yaml")
    assert "'agents.0.price.outptu'" in message
    assert "did you mean 'output'" in message


def test_unknown_sandbox_key_names_the_path_without_union_tags() -> None:
    message = config_error({**one_agent(), "sandbox": {"netwrk": "none"}}, source="s.yaml")
    assert "s.yaml: unknown key 'sandbox.netwrk'; did you mean 'network'?" in message
    assert "SandboxSpec." not in message and "literal[" not in message


def test_unknown_key_far_from_any_lists_the_valid_keys() -> None:
    message = config_error({**one_agent(), "coordination": {"zzzzzz": 1}})
    assert "'coordination.zzzzzz'" in message
    assert "valid keys:" in message and "max_answers_per_agent" in message and "consensus" in message


def test_every_problem_is_reported_at_once() -> None:
    data = {
        "nmae": "x",
        "agents": [{"model": "openai/a", "seeed": 1}],
        "coordination": {"consensu": "majority"},
    }
    message = config_error(data)
    assert "'nmae'" in message and "'agents.0.seeed'" in message and "'coordination.consensu'" in message
    assert "'name'" in message and "'seed'" in message and "'consensus'" in message


def test_bad_value_names_the_path() -> None:
    message = config_error(one_agent(temperature=5), source="hot.yaml")
    assert "hot.yaml: agents.0.temperature:" in message
    assert "less than or equal to 2" in message
    assert "coordination.consensus" in config_error({**one_agent(), "coordination": {"consensus": "most"}})


def test_malformed_yaml_names_the_file_and_line(tmp_path: Path, env: dict[str, str]) -> None:
    path = write(
        tmp_path / "broken.yaml",
        "name: t\nagents:\n  - model: openai/x\n    temperature: 0.5\n   oops: 1\n",
    )
    with pytest.raises(ConfigError) as caught:
        load_team_file(path, env)
    message = str(caught.value)
    assert str(path) in message
    assert "malformed YAML" in message
    assert "line 5" in message


def test_unreadable_file_is_a_config_error(tmp_path: Path, env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="cannot read the team file"):
        load_team_file(tmp_path / "absent.yaml", env)


@pytest.mark.parametrize("text", ["- model: openai/x\n", "just a string\n", "", "42\n"])
def test_a_file_that_is_not_a_mapping_is_refused(tmp_path: Path, env: dict[str, str], text: str) -> None:
    path = write(tmp_path / "notmap.yaml", text)
    with pytest.raises(ConfigError) as caught:
        load_team_file(path, env)
    assert str(path) in str(caught.value)
    assert "must be a YAML mapping" in str(caught.value)


@pytest.mark.parametrize("model", ["gpt-5", "foo/bar", "openai/", "OpenAI/gpt-5"])
def test_a_bad_model_string_names_the_valid_providers(model: str) -> None:
    message = config_error({"agents": [{"model": model}]}, source="m.yaml")
    assert "m.yaml: agents.0.model:" in message
    assert repr(model) in message
    for provider in ("openai", "anthropic", "gemini", "local"):
        assert provider in message


def test_model_string_splits_into_provider_and_name() -> None:
    agent = AgentSpec(model="openai/openai/gpt-5")
    assert agent.provider == "openai"
    assert agent.model_name == "openai/gpt-5"


def test_missing_agents_is_refused() -> None:
    message = config_error({"name": "t"})
    assert "agents" in message and "Field required" in message


def test_an_empty_agent_list_is_refused() -> None:
    message = config_error({"agents": []}, source="empty.yaml")
    assert "empty.yaml: agents:" in message
    assert "at least 1" in message


def test_more_than_sixteen_agents_are_refused() -> None:
    assert len(parse_team({"agents": [{"model": "openai/a"}] * 16}, "t.yaml", {}).agents) == 16
    message = config_error({"agents": [{"model": "openai/a"}] * 17})
    assert "agents:" in message and "at most 16" in message


# Team lookup --------------------------------------------------------------------------------------
def test_resolve_an_explicit_path(tmp_path: Path, env: dict[str, str]) -> None:
    text = yaml.safe_dump({"agents": [{"model": "anthropic/claude-x"}]})
    path = write(tmp_path / "teams" / "mine.yaml", text)
    team = resolve_team(str(path), env)
    assert team.name == "mine"
    assert team.agents[0].model == "anthropic/claude-x"
    yml = write(tmp_path / "other.yml", yaml.safe_dump({"name": "named", "agents": [{"model": "gemini/g"}]}))
    assert resolve_team(str(yml), env).name == "named"


def test_resolve_a_missing_path_is_team_not_found(tmp_path: Path, env: dict[str, str]) -> None:
    with pytest.raises(TeamNotFound) as caught:
        resolve_team(str(tmp_path / "nope.yaml"), env)
    assert "nope.yaml" in str(caught.value) and "does not exist" in str(caught.value)


def test_resolve_a_preset_name(env: dict[str, str]) -> None:
    team = resolve_team("openai", env)
    assert team.name == "openai"
    assert {agent.provider for agent in team.agents} == {"openai"}


def test_unknown_team_name_suggests_the_nearest_preset(env: dict[str, str]) -> None:
    with pytest.raises(TeamNotFound) as caught:
        resolve_team("fronteir", env)
    message = str(caught.value)
    assert "'fronteir'" in message
    assert "did you mean 'frontier'?" in message
    for name in SHIPPED:
        assert name in message


def test_a_user_team_shadows_a_shipped_preset(tmp_path: Path, env: dict[str, str]) -> None:
    user_dir = Path(env["XDG_CONFIG_HOME"]) / "conclave" / "teams"
    mine = {"description": "mine", "agents": [{"model": "openai/o3"}]}
    write(user_dir / "openai.yaml", yaml.safe_dump(mine))
    write(user_dir / "extra.yaml", yaml.safe_dump({"agents": [{"model": "openai/gpt-5-nano"}]}))
    presets = preset_paths(env)
    assert presets["openai"] == user_dir / "openai.yaml"
    assert presets["frontier"].parent == Path(str(configs_dir()))
    team = resolve_team("openai", env)
    assert team.description == "mine"
    assert [agent.model for agent in team.agents] == ["openai/o3"]
    assert resolve_team("extra", env).agents[0].model == "openai/gpt-5-nano"


def test_user_team_dir_falls_back_to_home_dot_config(tmp_path: Path) -> None:
    environ = {"HOME": str(tmp_path)}
    write(tmp_path / ".config" / "conclave" / "teams" / "hometeam.yaml", "agents:\n  - model: openai/x\n")
    assert resolve_team("hometeam", environ).agents[0].model == "openai/x"


# The default team ---------------------------------------------------------------------------------
def test_default_with_all_three_keys_is_frontier(env: dict[str, str]) -> None:
    assert resolve_team(None, {**env, **ALL_KEYS}).name == "frontier"


def test_default_with_google_api_key_instead_of_gemini_is_still_frontier(env: dict[str, str]) -> None:
    environ = {**env, "ANTHROPIC_API_KEY": "a", "OPENAI_API_KEY": "o", "GOOGLE_API_KEY": "g"}
    assert resolve_team(None, environ).name == "frontier"


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({"OPENAI_API_KEY": "o"}, "openai"),
        ({"ANTHROPIC_API_KEY": "a"}, "anthropic"),
        ({"GEMINI_API_KEY": "g"}, "gemini"),
        ({"OPENAI_API_KEY": "o", "ANTHROPIC_API_KEY": "a"}, "anthropic"),
        ({"OPENAI_API_KEY": "o", "GOOGLE_API_KEY": "g"}, "openai"),
    ],
)
def test_default_is_the_first_ready_team_in_order(
    env: dict[str, str], keys: dict[str, str], expected: str
) -> None:
    assert resolve_team(None, {**env, **keys}).name == expected


def test_default_with_no_keys_is_the_local_team(env: dict[str, str]) -> None:
    assert "local" in preset_paths(env)
    assert resolve_team(None, env).name == "local"  # the offline fallback when no provider key is set


def test_default_with_no_keys_and_no_local_preset_names_the_keys(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    for preset in configs_dir().glob("*.yaml"):
        if preset.stem != "local":
            (shipped / preset.name).write_text(preset.read_text())
    monkeypatch.setattr("conclave.config.presets.configs_dir", lambda: shipped)
    assert "local" not in preset_paths(env)
    with pytest.raises(TeamNotFound) as caught:
        resolve_team(None, env)
    message = str(caught.value)
    for variable in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY"):
        assert variable in message
    assert "openai" in message and "frontier" in message  # the presets one could name instead


def test_empty_key_counts_as_unset(env: dict[str, str]) -> None:
    environ = {**env, **ALL_KEYS, "ANTHROPIC_API_KEY": ""}
    assert resolve_team(None, environ).name == "openai"


# Keys ---------------------------------------------------------------------------------------------
def test_api_key_reads_the_provider_variable() -> None:
    assert AgentSpec(model="openai/gpt-5").api_key({"OPENAI_API_KEY": "sk-1"}) == "sk-1"
    assert AgentSpec(model="anthropic/c").api_key({"ANTHROPIC_API_KEY": "sk-ant"}) == "sk-ant"


def test_api_key_env_wins_over_the_provider_variable() -> None:
    agent = AgentSpec(model="openai/gpt-5", api_key_env="MY_KEY")
    assert agent.key_variables() == ("MY_KEY",)
    assert agent.api_key({"OPENAI_API_KEY": "sk-default", "MY_KEY": "sk-mine"}) == "sk-mine"
    with pytest.raises(MissingApiKey) as caught:
        agent.api_key({"OPENAI_API_KEY": "sk-default"})
    assert caught.value.variable == "MY_KEY"
    assert "MY_KEY" in str(caught.value)


@pytest.mark.parametrize("variable", ["GEMINI_API_KEY", "GOOGLE_API_KEY"])
def test_gemini_accepts_either_variable(variable: str) -> None:
    assert AgentSpec(model="gemini/gemini-2.5-pro").api_key({variable: "g-key"}) == "g-key"


def test_gemini_prefers_gemini_api_key() -> None:
    agent = AgentSpec(model="gemini/gemini-2.5-pro")
    assert agent.api_key({"GOOGLE_API_KEY": "google", "GEMINI_API_KEY": "gemini"}) == "gemini"


@pytest.mark.parametrize(
    ("model", "variable"),
    [
        ("openai/gpt-5", "OPENAI_API_KEY"),
        ("anthropic/c", "ANTHROPIC_API_KEY"),
        ("gemini/g", "GEMINI_API_KEY"),
    ],
)
def test_missing_api_key_names_the_variable(model: str, variable: str) -> None:
    with pytest.raises(MissingApiKey) as caught:
        AgentSpec(model=model).api_key({"UNRELATED": "x"})
    assert caught.value.variable == variable
    assert variable in str(caught.value)
    assert model in str(caught.value)
    assert isinstance(caught.value, ConfigError)


def test_a_key_not_required_gives_a_placeholder() -> None:
    agent = AgentSpec(
        model="openai/llama", base_url="http://127.0.0.1:11434/v1", api_key_env="X", api_key_required=False
    )
    assert agent.api_key({}) == "unused"
    assert agent.api_key({"X": "real"}) == "real"
    assert AgentSpec(model="openai/llama", api_key_required=False).api_key({}) == "unused"


def test_local_provider_needs_no_key() -> None:
    agent = AgentSpec(model="local/qwen", model_path="/models/q.gguf")
    assert agent.key_variables() == ()
    assert agent.api_key({}) == "unused"


def test_team_missing_keys_lists_each_variable_once_in_order() -> None:
    team = Team(
        name="mixed",
        agents=[
            AgentSpec(model="anthropic/a"),
            AgentSpec(model="openai/b"),
            AgentSpec(model="anthropic/c"),
            AgentSpec(model="gemini/d"),
            AgentSpec(model="openai/e", api_key_env="CUSTOM"),
            AgentSpec(model="openai/f", api_key_env="OPTIONAL", api_key_required=False),
        ],
    )
    assert team.missing_keys({}) == ["ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "CUSTOM"]
    some = {"OPENAI_API_KEY": "o", "GOOGLE_API_KEY": "g"}
    assert team.missing_keys(some) == ["ANTHROPIC_API_KEY", "CUSTOM"]
    every = {"ANTHROPIC_API_KEY": "a", "OPENAI_API_KEY": "o", "GEMINI_API_KEY": "g", "CUSTOM": "c"}
    assert team.missing_keys(every) == []
