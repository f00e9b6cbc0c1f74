"""The CLI image: the sandbox image plus Node, the pinned coding-agent CLIs, socat and git (`--clis`).

`conclave sandbox build --clis` builds it after the plain image; teams without CLI members never need it,
so the plain image stays small. The recipe is sandbox/recipe.py's, on either route (image_route.py):

1. npm on this machine installs `clis_npm/package-lock.json` (the CLIs and a Node 22 binary, every file
   pinned by its integrity hash: Debian bookworm's nodejs is 18, and Gemini CLI needs 20 or later) into
   a temporary prefix, for the image's CPU (`npm ci --cpu`), without install scripts.
2. The Dockerfile route builds `FROM` the plain image: the recipe's extra packages, the prefix copied to
   /opt/conclave-clis, the layout script. The mmdebstrap route builds the plain recipe plus the extra
   packages, and customize hooks copy the prefix in and run the same layout script in the root. The
   layout links `claude`, `codex`, `gemini`, `copilot` and `node` into /usr/local/bin and runs Claude
   Code's one install script, which puts its native binary for the image's CPU in place.
3. The candidate runs every CLI's `--version` as uid 1000 with no network before it gets its tag.

Nothing is fetched once it is built: the CLIs run offline in it (their model traffic goes through the
member's egress proxy). The tag carries a digest of this recipe, the npm lock included, so new pins
build anew.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
from functools import partial
from pathlib import Path

import anyio
import anyio.to_thread

from conclave.errors import SandboxError
from conclave.sandbox import dockerfile
from conclave.sandbox.image import (
    BuildOptions,
    BuildReport,
    Log,
    _tag_for,
    _tail,
    build_image,
    build_once,
    host_apt_sources,
    import_root,
    mmdebstrap,
    smoke_test,
    start_build,
)
from conclave.sandbox.image_route import Route
from conclave.sandbox.recipe import (
    CLI_PACKAGES,
    CLIS_LAYOUT,
    CLIS_NPM,
    CLIS_PREFIX,
    CLIS_SMOKE_TEST,
    PACKAGES,
    TRIM,
    clis_digest,
    npm_cpu,
)

CLIS_REPO = "conclave-sandbox-clis"
# The same pins as .ci/install-agent-clis.sh (the lock holds them with their hashes).
CLI_PINS = tuple(
    f"{name}@{version}"
    for name, version in json.loads((CLIS_NPM / "package.json").read_text())["dependencies"].items()
)


def clis_tag(platform: str | None = None) -> str:
    """`conclave-sandbox-clis:<version>-<digest of the recipe and the npm lock>` (and `-arm64` for a
    platform named, as `default_tag`)."""
    return _tag_for(CLIS_REPO, clis_digest(), platform)


async def build_clis_image(
    tag: str | None = None,
    *,
    options: BuildOptions | None = None,
    log: Log | None = None,
) -> BuildReport:
    """Build `tag` (default `clis_tag()`) unless it exists; the Dockerfile route starts from the plain
    image, `default_tag()` (built first when missing). See the module docstring."""
    options = options or BuildOptions()
    start = await start_build(tag or clis_tag(options.platform), None, options, log, needs=_needs_npm)
    if isinstance(start, BuildReport):
        return start
    docker, tag, target, choice, say = start.docker, start.tag, start.target, start.route, start.say

    async def with_dockerfile(docker: object, candidate: str, say: Log) -> None:
        base = await build_image(client=docker, options=options, log=say)
        with tempfile.TemporaryDirectory(prefix=f"{CLIS_REPO}-") as tmp:
            prefix = await _npm_prefix(Path(tmp), target, say)
            context = Path(tmp) / "context"
            context.mkdir()
            dockerfile.write_context(context, dockerfile.clis_dockerfile(base.tag, CLI_PACKAGES), prefix)
            say(f"docker build from {base.tag} with {', '.join(CLI_PACKAGES)} and the CLIs")
            await anyio.to_thread.run_sync(
                partial(
                    dockerfile.build,
                    docker,
                    context,
                    candidate,
                    platform=target,
                    apt_mirror=options.apt_mirror,
                    say=say,
                )
            )

    async def with_mmdebstrap(docker: object, candidate: str, say: Log) -> None:
        sources = host_apt_sources()
        with tempfile.TemporaryDirectory(prefix=f"{CLIS_REPO}-") as tmp:
            prefix = await _npm_prefix(Path(tmp), target, say)
            tarball = Path(tmp) / "root.tar"
            packages = (*PACKAGES, *CLI_PACKAGES)
            say(f"mmdebstrap {sources.suite} for {target} with {', '.join(packages)} and the CLIs")
            copy = f'mkdir -p "$1{CLIS_PREFIX}" && cp -a {shlex.quote(str(prefix))}/. "$1{CLIS_PREFIX}/"'
            layout = f'chroot "$1" sh -c {shlex.quote(CLIS_LAYOUT)} sh ""'
            await mmdebstrap(sources, packages, Path(tmp), tarball, platform=target, hooks=(copy, layout))
            await import_root(docker, tarball, candidate, say)

    make = with_dockerfile if choice.route is Route.DOCKERFILE else with_mmdebstrap
    smoke = "every CLI's --version, offline"
    return await build_once(
        tag, CLIS_REPO, make, _smoke_test, smoke=smoke, client=docker, log=say, route=choice
    )


def build_clis_image_sync(*, options: BuildOptions | None = None) -> BuildReport:
    """`conclave sandbox build --clis`, from a synchronous caller, printing its progress."""
    return anyio.run(partial(build_clis_image, options=options, log=print))


def _needs_npm(tag: str) -> None:
    if shutil.which("npm") is None:
        raise SandboxError(
            f"cannot build {tag}: npm is not installed; the CLIs and Node come from npm on this machine: "
            "install Node.js with npm and run `conclave sandbox build --clis` again"
        )


async def _npm_prefix(folder: Path, platform: str, say: Log) -> Path:
    """`npm ci` of the lock into `folder/clis` for `platform`'s CPU, trimmed (recipe.TRIM)."""
    prefix = folder / "clis"
    prefix.mkdir()
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(CLIS_NPM / name, prefix / name)
    cpu = npm_cpu(platform)
    say(f"npm ci of {CLIS_NPM / 'package-lock.json'} for linux/{cpu}")
    argv = [
        "npm",
        "ci",
        "--prefix",
        str(prefix),
        "--os=linux",
        f"--cpu={cpu}",
        "--ignore-scripts",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
    ]
    await _run(argv, "npm ci of the pinned CLIs")
    if not (prefix / "node_modules" / f"node-linux-{cpu}").is_dir():
        raise SandboxError(
            f"npm ci did not install node-linux-{cpu}: this npm ({shutil.which('npm')}) ignores --cpu; "
            "use npm 10 or later, or build on a machine of the image's architecture"
        )
    for unused in (found for pattern in TRIM for found in prefix.glob(pattern)):
        shutil.rmtree(unused)
    return prefix


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
