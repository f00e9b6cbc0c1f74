"""The documentation stays true and complete: every setting and every CLI flag is documented, the
README's set-up commands are the ones CI runs, its links resolve, the architecture page names every
module, and the skill says what a calling agent must know.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

from conclave.cli import TARGETS
from conclave.cli.main import build_parser
from conclave.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
SKILL = ROOT / "skills" / "conclave" / "SKILL.md"


def docs_text() -> str:
    return "\n".join(path.read_text(encoding="utf-8") for path in sorted(DOCS.glob("*.md")))


def commands(
    parser: argparse.ArgumentParser, prefix: str = "conclave"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every (sub)command's name and parser, the top level included."""
    yield prefix, parser
    for action in parser._actions:  # argparse keeps its subparsers here only
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, f"{prefix} {name}")


def test_every_setting_is_documented() -> None:
    settings = (DOCS / "settings.md").read_text(encoding="utf-8")
    prefix = Settings.model_config.get("env_prefix", "")
    missing = [
        f"{prefix}{name}".upper()
        for name in Settings.model_fields
        if f"`{prefix}{name}`".upper() not in settings.upper()
    ]
    assert not missing, f"add these to docs/settings.md's table: {missing}"


def test_every_cli_command_and_flag_is_documented() -> None:
    cli = (DOCS / "cli.md").read_text(encoding="utf-8")
    missing = []
    for name, parser in commands(build_parser()):
        if name.removeprefix("conclave ") not in cli:
            missing.append(name)
        for action in parser._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help" and flag not in cli:
                    missing.append(f"{name} {flag}")
    for target in TARGETS:
        if f"`{target}`" not in cli or target not in (DOCS / "clients.md").read_text(encoding="utf-8"):
            missing.append(f"install target {target}")
    assert not missing, f"document these in docs/cli.md: {missing}"


def fenced_commands(text: str) -> list[str]:
    """The shell commands of ```bash blocks, continuation lines joined."""
    blocks = re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
    return [" ".join(block.replace("\\\n", " ").split()) for block in blocks]


def test_ci_runs_the_readme_set_up_commands_exactly() -> None:
    section = README.read_text(encoding="utf-8").split("## Set up", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 2, "the Set up section shows two commands: the main job, then the tests"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    for block in blocks:
        assert block in ci, f".ci/run must run, character for character:\n{block}"
    assert "pytest" in blocks[1] and "conclave ask" in blocks[0]


def test_the_readme_is_short_with_a_table_of_contents_that_resolves() -> None:
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= 250
    assert [n for n, line in enumerate(lines, 1) if len(line) > 110] == []
    headings = {
        re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-")
        for h in re.findall(r"(?m)^## (.+)$", text)
    }
    contents = text.split("## Contents", 1)[1].split("\n## ", 1)[0]
    anchors = re.findall(r"\]\(#([\w-]+)\)", contents)
    assert len(anchors) >= 8 and set(anchors) <= headings, set(anchors) - headings
    assert text.index("## Use it from your coding agent") > text.index("## Set up")
    assert "conclave install claude-code --write" in text.split("## Use it from your coding agent")[1][:200]


def test_relative_links_in_the_readme_and_docs_resolve() -> None:
    broken = []
    for page in [README, *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_examples_say_what_they_are() -> None:
    """A team file example named after a preset holds what the preset holds (no Ollama in frontier)."""
    for page in [README, *DOCS.glob("*.md")]:
        for block in re.findall(r"```yaml\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL):
            if re.search(r"^name: frontier$", block, re.MULTILINE):
                assert "base_url" not in block and "ollama" not in block.lower(), page


def test_the_skill_warns_about_the_demo_team_and_what_leaves_the_machine() -> None:
    skill = SKILL.read_text(encoding="utf-8")
    assert "README" not in skill  # an installed skill cannot see the README
    assert "do not hand it real work" in skill and "subscription member" in skill
    assert "sent to each model" in skill and "provider" in skill


def test_the_architecture_page_names_every_module() -> None:
    """docs/ARCHITECTURE.md's "Every module" has a bullet per folder naming each of its modules."""
    page = (DOCS / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = page.split("\n## Every module\n", 1)[1].split("\n## ", 1)[0]
    bullets = {
        match.group(1): match.group(2)
        for match in re.finditer(r"^- `([\w/]+/)`:(.*?)(?=^- |\Z)", section, re.M | re.S)
    }
    missing = []
    for folder in ("server", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if path.name == "__init__.py" and rel.parent.name != "server":
                continue  # a subpackage's first docstring line says what it holds (test_architecture)
            if f"`{path.name}`" not in bullets.get(f"{rel.parent}/", ""):
                missing.append(str(rel))
    assert not missing, f"name these in docs/ARCHITECTURE.md, 'Every module', under their folder: {missing}"
