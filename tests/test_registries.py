"""One place per tool and per provider: the lists the rest of the code reads (tools/catalog.py,
config/providers.py), and nothing else in the package that spells them out again."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastmcp import Client

from conclave.app.server import create_app
from conclave.cli import install_claude, install_entries
from conclave.config.presets import configs_dir
from conclave.config.providers import PROVIDERS
from conclave.jobs.service import JobService
from conclave.settings import Settings
from conclave.tools.catalog import TOOLS, tool_names
from tests.fakes.environment import environment_of

ROOT = Path(__file__).resolve().parents[1]
SKILL = ROOT / "skills" / "conclave" / "SKILL.md"
CATALOG = ROOT / "tools" / "catalog.py"
REGISTRY = ROOT / "server" / "config" / "providers.py"
# The APIs a coding-agent CLI member speaks through its key proxy: each one's allowed calls and usage
# reports are read in one module, by API, and a new provider needs no entry there unless a CLI speaks it.
WIRES = ROOT / "server" / "sandbox" / "provider_wire.py"
CODE_SPAN = re.compile(r"`([a-z][a-z_]*)\b[^`]*`")


def package_modules() -> Iterator[Path]:
    for folder in ("server", "tools"):
        yield from sorted((ROOT / folder).rglob("*.py"))


def named(item: ast.expr) -> object:
    """What an item of a literal names: a string, a name (a function), or a call's first argument."""
    if isinstance(item, ast.Call) and item.args:
        item = item.args[0]
    if isinstance(item, ast.Constant):
        return item.value
    return item.id if isinstance(item, ast.Name) else None


def literals_naming(path: Path, names: set[str], at_least: int) -> Iterator[str]:
    """Each tuple, list, set or dict literal (dict keys) in `path` holding `at_least` of `names`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [key for key in node.keys if key is not None]
        else:
            continue
        found = {name for item in items if (name := named(item)) in names}
        if len(found) >= at_least:
            yield f"{path.relative_to(ROOT)}:{node.lineno} {sorted(found)}"


def test_every_tool_module_is_in_the_one_list_and_the_list_names_only_tool_modules() -> None:
    modules = {
        path.stem
        for path in (ROOT / "tools").glob("*.py")
        if not path.stem.startswith("_") and path != CATALOG
    }
    assert set(tool_names()) == modules
    assert len(set(tool_names())) == len(TOOLS)


def test_the_skill_names_exactly_the_tools_in_the_list() -> None:
    """A code span opening with a tool module's name is the skill naming that tool (`get_status {...}`)."""
    modules = {path.stem for path in (ROOT / "tools").glob("*.py") if not path.stem.startswith("_")}
    named = {word for word in CODE_SPAN.findall(SKILL.read_text(encoding="utf-8")) if word in modules}
    assert named == set(tool_names())


def test_no_module_but_the_catalog_lists_tool_names() -> None:
    """A second hand-kept list of tools (the server's, an installer's) drifts from the first."""
    names = set(tool_names())
    found = [hit for path in package_modules() if path != CATALOG for hit in literals_naming(path, names, 2)]
    assert found == []


@pytest.mark.anyio
async def test_the_server_and_the_installers_publish_and_approve_what_the_list_holds(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    async with (
        JobService.serve(environment_of(settings, {})) as service,
        Client(create_app(service, settings)) as client,
    ):
        listed = {tool.name: tool for tool in await client.list_tools()}
    assert list(listed) == list(tool_names())
    for tool in TOOLS:
        hints = listed[tool.name].annotations
        assert hints is not None and listed[tool.name].title == tool.title
        assert (
            hints.read_only_hint,
            hints.idempotent_hint,
            hints.open_world_hint,
            hints.destructive_hint,
        ) == (
            tool.read_only,
            tool.idempotent,
            tool.open_world,
            tool.destructive,
        )
    allowed = install_claude.claude_settings("project")[("permissions", "allow")]
    assert allowed == [f"mcp__conclave__{name}" for name in tool_names()]
    assert tuple(tool.name for tool in TOOLS if tool.approvable) == install_entries.CODEX_APPROVED
    assert set(install_entries.CODEX_APPROVED) == {"ask_team", "cancel_job", "steer_job"}


def provider_comparisons(path: Path, names: set[str]) -> Iterator[str]:
    """Each `<...provider...> == "<name>"` (or !=, in): a provider singled out outside the registry."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare) and "provider" in ast.unparse(node.left):
            for right in node.comparators:
                if isinstance(right, ast.Constant) and right.value in names:
                    yield f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}"


def test_no_module_but_the_registry_lists_or_singles_out_providers() -> None:
    """A provider's facts are its registry entry: a second table of providers (names, keys) or a special
    case for one of them elsewhere is what adding a provider would have to find and extend."""
    names = set(PROVIDERS)
    owners = {variable: entry.name for entry in PROVIDERS.values() for variable in entry.key_variables}
    gateway_variables = {variable for gateway in PROVIDERS.gateways for variable in gateway.variables}
    found = []
    for path in package_modules():
        if path in (REGISTRY, WIRES):
            continue
        found += literals_naming(path, names, 2)
        found += provider_comparisons(path, names)
        found += literals_naming(path, gateway_variables, 1)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Tuple | ast.List | ast.Set):
                held = {
                    owners[i.value] for i in node.elts if isinstance(i, ast.Constant) and i.value in owners
                }
                if len(held) >= 2:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} keys of {sorted(held)}")
    assert found == []


def test_every_backend_in_the_registry_resolves_and_none_is_imported_by_the_registry() -> None:
    for entry in PROVIDERS.with_backends():
        backend = getattr(importlib.import_module(entry.backend_module), entry.backend_class)
        assert isinstance(backend, type) and backend.__name__ == entry.backend_class
    code = "import sys, conclave.config.models; print([m for m in sys.modules if 'conclave.backends' in m])"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"  # team files validate without a provider's SDK


def test_every_variable_a_shipped_team_reads_is_forwarded_by_the_installers() -> None:
    read = {
        match
        for preset in configs_dir().glob("*.yaml")
        for match in re.findall(r"\$\{(\w+)", preset.read_text(encoding="utf-8"))
    }
    assert read <= set(install_entries.FORWARDED_ENV)
    assert set(PROVIDERS.forwarded_variables()) <= set(install_entries.FORWARDED_ENV)


ONE_LINE = (
    '    Provider("mistral", "openai:OpenAIBackend", ("MISTRAL_API_KEY",), "https://api.mistral.ai/v1"),\n'
)
WITH_ONE_MORE = """
import importlib.util, sys
from pathlib import Path
table = "_ENTRIES = (\\n"
source = Path(sys.argv[1]).read_text(encoding="utf-8").replace(table, table + sys.argv[2], 1)
spec = importlib.util.spec_from_loader("conclave.config.providers", loader=None)
module = importlib.util.module_from_spec(spec)
sys.modules["conclave.config.providers"] = module
exec(compile(source, sys.argv[1], "exec"), module.__dict__)

from conclave.backends import create_backend
from conclave.backends.base import Endpoint
from conclave.cli import doctor, install_entries
from conclave.config.loading import secret_variables
from conclave.config.models import AgentSpec

spec = AgentSpec(model="mistral/large")
assert spec.endpoint_url == "https://api.mistral.ai/v1" and not spec.custom_endpoint
assert spec.api_key({"MISTRAL_API_KEY": "k-1"}) == "k-1"
for refused in ({"model": "openai/gpt-5", "api_key_env": "MISTRAL_API_KEY"},
                {"model": "mistral/large", "base_url": "https://proxy.example/v1"}):
    try:
        AgentSpec(**refused)
    except ValueError as exc:
        print("refused:", str(exc).splitlines()[1][:80])
    else:
        raise AssertionError(refused)
endpoint = Endpoint(provider="mistral", model="large", api_key="k-1", base_url=spec.endpoint_url)
backend = create_backend(endpoint)
print("backend:", type(backend).__name__)
assert "MISTRAL_API_KEY" in install_entries.FORWARDED_ENV
assert "MISTRAL_API_KEY" in secret_variables({"MISTRAL_API_KEY": "k-1", "HOME": "/x"})
assert any(probe.name == "mistral key" for probe in doctor._keys({}))
print("ok")
"""


def test_a_provider_added_by_one_registry_line_is_read_everywhere() -> None:
    """Adding a provider is its backend module plus one line in config/providers.py: with that line (and an
    existing backend standing in for its module), team files, keys, the backend factory, doctor and the
    installers know it, and no other file changes."""
    run = subprocess.run(
        [sys.executable, "-c", WITH_ONE_MORE, str(REGISTRY), ONE_LINE],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "ok" and "backend: OpenAIBackend" in run.stdout
