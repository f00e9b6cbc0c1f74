"""Both sandbox images for linux/arm64 on an x86-64 host, under qemu-user-static and binfmt_misc.

python bench/arm64_images.py [plain e2e clis]   # as root; each step an hour or less here

Each step adds its figures to the results file (an image built earlier is reused: `built_now: false`,
its build time is the `..._build_s` of the run that built it).

Too slow for every CI run, so a script with dated results (bench/results/arm64-images.json):
1. binfmt_misc mounted and Debian's qemu-user-static registered (`update-binfmts --enable`);
2. the plain image by the mmdebstrap route (`--platform linux/arm64`): its smoke test, `uname -m`, and
   the architecture the engine records for an imported image, with and without `import --platform`;
3. the CLI image by the mmdebstrap route: its smoke test and every CLI's `--version`;
4. one end-to-end job on the arm64 plain image: the scripted team of tests/test_files_e2e.py edits a
   file in arm64 containers, a peer reads the snapshot as uid 1000, and the diff is exact.
The Dockerfile route for linux/arm64, as a user types it, is bench/arm64_dockerfile.py's (an engine of
its own: Docker 20.10 holds one image per name, so an arm64 `debian:bookworm-slim` here would replace the
amd64 one). Tags end in `-arm64bench`, never the engine's own images' tags. Timings are wall-clock on
a shared, busy machine: read them as orders of magnitude.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, tests/

from bench.results_file import write_results
from conclave.sandbox.clis_image import CLIS_REPO, build_clis_image
from conclave.sandbox.engine import connect
from conclave.sandbox.image import IMAGE_REPO, BuildOptions, build_image
from conclave.sandbox.image_route import Route
from conclave.sandbox.recipe import clis_digest, plain_digest

RESULTS = Path(__file__).parent / "results" / "arm64-images.json"
PLATFORM = "linux/arm64"
BINFMT = Path("/proc/sys/fs/binfmt_misc")


def enable_binfmt() -> str:
    """Mount binfmt_misc and register qemu-aarch64 when needed; what the kernel then runs it with."""
    if not (BINFMT / "register").exists():
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], check=True)
    if not (BINFMT / "qemu-aarch64").exists():
        subprocess.run(["update-binfmts", "--enable", "qemu-aarch64"], check=True)
    entry = (BINFMT / "qemu-aarch64").read_text()
    return next(line for line in entry.splitlines() if line.startswith("interpreter"))


def run(docker: Any, image: str, command: list[str]) -> str:
    output = docker.containers.run(image, command, network_mode="none", remove=True, user="1000:1000")
    return str(output.decode()).strip()


async def timed(step: str, results: dict[str, Any], work: Any) -> Any:
    started = time.monotonic()
    print(f"== {step}", flush=True)
    try:
        value = await work()
    except Exception as exc:
        results[f"{step}_error"] = f"{type(exc).__name__}: {exc}"[:2000]
        print(results[f"{step}_error"], flush=True)
        return None
    results[f"{step}_s"] = round(time.monotonic() - started, 1)
    return value


STEPS = ("plain", "e2e", "clis")


async def main(steps: tuple[str, ...]) -> dict[str, Any]:
    docker = connect()
    results: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results.update(
        {
            "date": datetime.date.today().isoformat(),
            "engine": docker.version()["Version"],
            "host": subprocess.run(["uname", "-m"], capture_output=True, text=True).stdout.strip(),
            "binfmt": enable_binfmt(),
        }
    )
    options = BuildOptions(route=Route.MMDEBSTRAP, platform=PLATFORM)
    plain = f"{IMAGE_REPO}:{plain_digest()}-arm64bench"
    if "plain" in steps:
        earlier = results.get("plain_mmdebstrap_build_s")
        report = await timed(
            "plain_mmdebstrap_build", results, lambda: build_image(plain, options=options, log=print)
        )
        if report is not None:
            results["plain_mmdebstrap"] = describe(docker, plain, report)
        if report is not None and not report.built and earlier is not None:
            results["plain_mmdebstrap_build_s"] = earlier  # reused: the time of the run that built it
        if report is not None:
            results["import_platform_linux_arm64_records"] = import_records(plain)
    if "e2e" in steps:
        await timed("e2e_job_on_plain_arm64", results, lambda: e2e_job(plain, results))
    if "clis" in steps:
        clis = f"{CLIS_REPO}:{clis_digest()}-arm64bench"
        clis_report = await timed(
            "clis_mmdebstrap_build", results, lambda: build_clis_image(clis, options=options, log=print)
        )
        if clis_report is not None:
            results["clis_mmdebstrap"] = describe(docker, clis, clis_report)
            versions = (
                "for c in node claude codex gemini copilot; do printf '%s: ' $c; $c --version | head -1; done"
            )
            results["clis_versions"] = (
                docker.containers.run(
                    clis,
                    ["sh", "-c", versions],
                    network_mode="none",
                    remove=True,
                    user="1000:1000",
                    environment={
                        "HOME": "/tmp",
                        "GEMINI_CLI_NO_RELAUNCH": "true",
                        "DISABLE_AUTOUPDATER": "1",
                    },
                    tmpfs={"/tmp": "rw,exec,size=1g"},
                )
                .decode()
                .strip()
                .splitlines()
            )
    return results


def import_records(image: str) -> str:
    """What the engine records for `docker import --platform linux/arm64` of `image`'s files."""
    check = "conclave-arm64bench/import-check:1"
    container = subprocess.run(["docker", "create", image], capture_output=True, text=True, check=True)
    try:
        exported = subprocess.Popen(["docker", "export", container.stdout.strip()], stdout=subprocess.PIPE)
        subprocess.run(
            ["docker", "import", "--platform", PLATFORM, "-", check], stdin=exported.stdout, check=True
        )
        exported.wait()
        shown = ["docker", "image", "inspect", check, "--format", "{{.Os}}/{{.Architecture}}"]
        return subprocess.run(shown, capture_output=True, text=True, check=True).stdout.strip()
    finally:
        subprocess.run(["docker", "rm", container.stdout.strip()], capture_output=True)
        subprocess.run(["docker", "rmi", check], capture_output=True)


def describe(docker: Any, tag: str, report: Any) -> dict[str, Any]:
    attrs = docker.images.get(tag).attrs
    return {
        "tag": tag,
        "recorded_architecture": attrs.get("Architecture"),
        "uname_m_inside": run(docker, tag, ["uname", "-m"]),
        "size_mb": round(attrs.get("Size", 0) / 1e6, 1),
        "smoke_test": "passed",  # the build tags only a candidate that passed it
        **(
            {"built_now": report.built, "route": str(report.route.route) if report.route else None}
            if report
            else {}
        ),
    }


async def e2e_job(image: str, results: dict[str, Any]) -> None:
    """tests/test_files_e2e.py's first job, on `image`; raises when its outcome differs."""
    from bench.submitting import open_service
    from conclave.jobs.request import JobRequest
    from conclave.settings import Settings
    from tests.fakes.server import FakeProviders
    from tests.fakes.team import KEY_DESTINATION, TRIO, write_team
    from tests.test_files_e2e import DOCKER, ENV, NEW, OLD, editor, reviewer

    with tempfile.TemporaryDirectory() as tmp, FakeProviders() as fakes:
        project = Path(tmp) / "proj"
        project.mkdir()
        (project / "calc.py").write_bytes(OLD)
        fakes.script.set_default("ann", editor)
        fakes.script.set_default("bob", reviewer)
        fakes.script.set_default("cy", reviewer)
        team = str(write_team(Path(tmp) / "team.yaml", fakes, TRIO, sandbox={**DOCKER, "image": image}))
        async with open_service(
            Settings(home=Path(tmp) / "state", key_destinations=(KEY_DESTINATION,)), ENV
        ) as service:
            view = await service.submit(
                JobRequest(task="Fix add() in calc.py", team=team, context_paths=[{"path": str(project)}])
            )
            with anyio.fail_after(900):
                while not view.done:
                    view = await service.wait(view.job_id, 10)
            final = await service.lookup.read(view.job_id, "proj/calc.py", "final", 0, 1000)
        looked = [r for r in fakes.script.requests_of("bob") if "--- stdout ---" in r.text()]
        stdout = looked[0].text().split("--- stdout ---", 1)[1][:300] if looked else ""
        results["e2e_job"] = {
            "state": view.state,
            "consensus": bool(view.result and view.result.consensus),
            "winner_file_is_the_fix": final.content == NEW.decode(),
            "peer_read_the_snapshot_in_the_container": "return a + b" in stdout,
        }
        assert view.state == "completed" and final.content == NEW.decode(), view.text()


if __name__ == "__main__":
    chosen = tuple(sys.argv[1:]) or STEPS
    if not set(chosen) <= set(STEPS):
        raise SystemExit(f"steps: {' '.join(STEPS)} (default: all, in that order)")
    write_results(RESULTS, anyio.run(main, chosen))
