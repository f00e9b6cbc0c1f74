"""Both sandbox images by both routes on this engine's architecture, compared: the same recipe must give
the same image (packages and versions, files under /opt/conclave-clis, CLI versions, smoke tests).

python bench/image_routes.py     # about 10 minutes here; writes bench/results/image-routes.json

No registry is reachable here, so the Dockerfile route's `debian:bookworm-slim` is made from this
machine's mirror (tests/fakes/debian_base.py). tests/test_image_routes.py checks the plain image on every
run; the CLI image (about 1.4 GB, a few minutes a route) is compared here. Tags end in `-routes` and are
removed after. Timings are wall-clock on a shared, busy machine: read them as orders of magnitude; a
Dockerfile build whose steps the engine has built before takes its layers from the build cache (the
plain image's 3 s in the committed results).
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, tests/

from bench.results_file import write_results
from conclave.sandbox import image as image_module
from conclave.sandbox.clis_image import CLIS_REPO, build_clis_image
from conclave.sandbox.engine import connect
from conclave.sandbox.image import IMAGE_REPO, BuildOptions, BuildReport, build_image, default_tag
from conclave.sandbox.image_route import Route
from tests.fakes.debian_base import ensure_public_base

RESULTS = Path(__file__).parent / "results" / "image-routes.json"
PACKAGES = "dpkg-query -W -f '${Package} ${Version}\\n' | sort"
FILES = "find /opt/conclave-clis /usr/local/bin | sort"
VERSIONS = "for c in node claude codex gemini copilot; do printf '%s: ' $c; $c --version | head -1; done"
CLI_ENV = {"HOME": "/tmp", "GEMINI_CLI_NO_RELAUNCH": "true", "DISABLE_AUTOUPDATER": "1"}


def run(docker: Any, image: str, script: str) -> list[str]:
    output = docker.containers.run(
        image,
        ["sh", "-c", script],
        network_mode="none",
        remove=True,
        user="1000:1000",
        environment=CLI_ENV,
        tmpfs={"/tmp": "rw,exec,size=1g"},
    )
    return str(output.decode()).strip().splitlines()


def figures(report: BuildReport) -> dict[str, Any]:
    return {"build_s": round(report.seconds, 1), "size_mb": round(report.size_bytes / 1e6, 1)}


async def main() -> dict[str, Any]:
    docker = connect()
    ensure_public_base()
    results: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "engine": docker.version()["Version"],
    }
    tags: list[str] = []
    try:
        for route in Route:
            options = BuildOptions(route=route)
            plain = f"{IMAGE_REPO}:{route}-routes"
            clis = f"{CLIS_REPO}:{route}-routes"
            tags += [plain, clis]
            plain_report = await build_image(plain, options=options, log=print)
            # the CLI image's Dockerfile route starts from default_tag()'s image: this run's plain one here
            image_module.default_tag = lambda platform=None, plain=plain: plain
            try:
                clis_report = await build_clis_image(clis, options=options, log=print)
            finally:
                image_module.default_tag = default_tag
            results[f"plain_{route}"] = figures(plain_report)
            results[f"clis_{route}"] = figures(clis_report)
        checks = (
            ("plain", "packages", PACKAGES),
            ("clis", "packages", PACKAGES),
            ("clis", "files", FILES),
            ("clis", "versions", VERSIONS),
        )
        for image, what, check in checks:
            repo = IMAGE_REPO if image == "plain" else CLIS_REPO
            seen = [run(docker, f"{repo}:{route}-routes", check) for route in Route]
            name = f"{image}_same_{what}"
            results[name] = seen[0] == seen[1]
            if seen[0] != seen[1]:
                results[f"{name}_differences"] = sorted(set(seen[0]) ^ set(seen[1]))[:40]
            if check is VERSIONS:
                results["clis_versions"] = seen[0]
    finally:
        for tag in tags:
            docker.images.remove(tag, force=True)
    return results


if __name__ == "__main__":
    write_results(RESULTS, anyio.run(main))
