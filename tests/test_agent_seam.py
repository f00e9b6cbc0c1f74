"""One agent seam (coordination/agents.py): the kind of agent is decided once, from the spec, and nothing
in the flow asks again.

The provider string is compared in one place (config/models.py `agent_kind`, which parses a team's agents
into the type of their kind); the kind is asked of a spec only by the team's `clis` and the factory;
coordination never
recovers a kind by `isinstance` on a backend, a CLI member or an agent; and the one factory
(coordination/members.py `endpoint_factory`) builds each kind holding what it calls, typed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conclave.backends.base import Scorer
from conclave.backends.llama_server import LocalServers
from conclave.clis.member import CliMember
from conclave.config.loading import parse_team
from conclave.coordination.agents import ApiAgent, CliAgent, SplitAgent
from conclave.coordination.members import endpoint_factory
from conclave.files.secrets import Secrets

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "server"
COORDINATION = SERVER / "coordination"


def _names(node: ast.expr) -> list[str]:
    """The dotted names an expression spells (each element of a tuple); '' for anything else."""
    if isinstance(node, ast.Tuple):
        return [name for element in node.elts for name in _names(element)]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [*(f"{outer}.{node.attr}" for outer in _names(node.value)), node.attr]
    return [""]


def provider_comparisons(path: Path) -> list[str]:
    """Every `provider == "cli"` / `!=` / `in` with the literal "cli", either way round, in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        literal = any(isinstance(side, ast.Constant) and side.value == "cli" for side in sides)
        named = any(name.split(".")[-1] == "provider" for side in sides for name in _names(side))
        if literal and named:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_the_provider_string_decides_the_kind_in_one_place() -> None:
    found = [site for path in sorted(SERVER.rglob("*.py")) for site in provider_comparisons(path)]
    assert found == [], (
        f"the provider is compared with 'cli' at {found}: the registry says which providers' members are "
        "CLIs (config/providers.py `members_are_clis`, read by config/models.py `agent_kind`), and "
        "coordination/members.py `endpoint_factory` decides the kind of agent"
    )


def kind_questions(path: Path) -> list[str]:
    """Where a module asks a spec its kind: an `is_cli` read, or `isinstance(..., CliAgentSpec)`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        asked = isinstance(node, ast.Attribute) and node.attr == "is_cli"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
            asked = any(name.split(".")[-1] == "CliAgentSpec" for name in _names(node.args[1]))
        if asked:
            found.append(f"{path.relative_to(SERVER)}:{node.lineno}")
    return found


def test_a_specs_kind_is_asked_by_the_team_and_the_factory_alone() -> None:
    """A team's agents are parsed into the type of their kind: the team lists its CLI members
    (`Team.clis`) and the factory builds each kind; every other place takes the members of its kind."""
    found = [site for path in sorted(SERVER.rglob("*.py")) for site in kind_questions(path)]
    files = [site.rsplit(":", 1)[0] for site in found]
    assert files == ["config/models.py", "coordination/members.py"], found


def imported_from(tree: ast.Module, packages: tuple[str, ...]) -> set[str]:
    """The names a module imports from our backends, members and agents."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(packages):
            names |= {alias.asname or alias.name for alias in node.names}
    return names


def test_coordination_never_downcasts_to_recover_a_kind() -> None:
    downcasts = []
    for path in sorted(COORDINATION.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        kinds = imported_from(tree, ("conclave.backends", "conclave.clis", "conclave.coordination.agents"))
        checks = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and _names(node.func) == ["isinstance"]
        ]
        for node in checks:
            if len(node.args) == 2 and set(_names(node.args[1])) & kinds:
                downcasts.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert not downcasts, f"give the agent what it needs typed (coordination/agents.py): {downcasts}"


def _spec(model: str, **fields: object):  # type: ignore[no-untyped-def]
    return parse_team({"agents": [{"model": model, **fields}]}, "t").agents[0]


@pytest.mark.anyio
async def test_the_factory_builds_each_kind_holding_what_it_calls() -> None:
    environ = {"K": "key-0123456789", "OPENAI_API_KEY": "sk-test-0123456789"}
    async with LocalServers() as pool:
        make = endpoint_factory(environ, pool)
        cli = make(_spec("cli/claude-code", api_key_env="K"))
        api = make(_spec("openai/gpt-5"))
        split = make(_spec("openai/gpt-5", turn="split"))
        scoring = make(_spec("local/smollm2", turn="split", tool_mode="json"))
        try:
            assert isinstance(cli, CliAgent) and isinstance(cli.member, CliMember)
            assert type(api) is ApiAgent and api.backend.provider == "openai"
            assert isinstance(split, SplitAgent) and split.scorer is None  # votes by a short choice
            assert isinstance(scoring, SplitAgent) and isinstance(scoring.scorer, Scorer)
            assert scoring.scorer is scoring.backend  # the local backend scores what it answers with
            secrets = Secrets()
            cli.attach(None, secrets)
            assert cli.member.sandbox is None and cli.member.secrets is secrets
        finally:
            for agent in (cli, api, split, scoring):
                await agent.aclose()
