"""Both sandbox images for linux/arm64 by the Dockerfile route, as a user types it, under qemu-user-static,
compared with the arm64 images of the mmdebstrap route (bench/arm64_images.py).

bash bench/arm64_engine.sh start                      # as root; an engine and a registry of its own
python bench/arm64_dockerfile.py [base plain clis compare e2e]   # default: all, in that order
bash bench/arm64_engine.sh stop

1. base: an arm64 bookworm root made by mmdebstrap as Debian makes `debian:bookworm-slim`
   (tests/fakes/debian_base.py), its image configuration given the architecture the engine's
   `import --platform` leaves out (Docker 20.10 records amd64), and pushed to the engine's Docker Hub
   mirror as library/debian:bookworm-slim; the engine keeps no local copy, so the build pulls it.
2. plain, clis: `conclave sandbox build [--clis] --route dockerfile --platform linux/arm64
   --apt-mirror http://deb.debian.org` against that engine (DOCKER_HOST), its output and time kept.
3. compare: against the mmdebstrap route's arm64 images in the main engine (`-arm64bench` tags, made by
   bench/arm64_images.py): packages and versions, the user, the image configuration, the smoke test,
   the CLI image's files and every CLI's `--version` (tests/test_image_routes.py's equality on amd64).
4. e2e: bench/arm64_images.py's end-to-end job on the Dockerfile route's arm64 plain image.
Results: bench/results/arm64-dockerfile.json. Timings are wall-clock on a shared, busy machine (two
cores, six engineers): read them as orders of magnitude.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from hashlib import sha256
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, tests/

from bench.arm64_images import e2e_job, enable_binfmt
from bench.results_file import write_results
from conclave.sandbox.clis_image import clis_tag
from conclave.sandbox.image import default_tag
from conclave.sandbox.recipe import BASE_IMAGE, ROUTE_LABEL, SMOKE_TEST
from tests.fakes.debian_base import ensure_public_base

RESULTS = Path(__file__).parent / "results" / "arm64-dockerfile.json"
PLATFORM = "linux/arm64"
ENGINE = os.environ.get("ARM64_ENGINE", "unix:///tmp/arm64-engine/docker.sock")  # bench/arm64_engine.sh
MAIN = os.environ.get("ARM64_MAIN_ENGINE", "unix:///var/run/docker.sock")
REGISTRY = os.environ.get("ARM64_REGISTRY", "127.0.0.1:7801")  # the engine's --registry-mirror
MIRROR = "http://deb.debian.org"
CONCLAVE = str(Path(sys.executable).with_name("conclave"))
MMDEBSTRAP_PLAIN = "conclave-sandbox:5863efb8-arm64bench"  # bench/results/arm64-images.json
MMDEBSTRAP_CLIS = "conclave-sandbox-clis:e7b96612-arm64bench"
PACKAGES = "dpkg-query -W -f '${Package} ${Version}\\n' | sort"
FILES = "find /opt/conclave-clis /usr/local/bin | sort"
VERSIONS = "for c in node claude codex gemini copilot; do printf '%s: ' $c; $c --version | head -1; done"
USER = "id -un; getent passwd sandbox"
CLI_ENV = {"HOME": "/tmp", "GEMINI_CLI_NO_RELAUNCH": "true", "DISABLE_AUTOUPDATER": "1"}
STEPS = ("base", "plain", "clis", "compare", "e2e")


def docker(host: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", "-H", host, *args], capture_output=True, text=True, check=True, **kwargs)


def publish_base(results: dict[str, Any]) -> None:
    """The arm64 `debian:bookworm-slim` in the engine's Docker Hub mirror, and not in the engine."""
    local = "conclave-arm64bench/debian:bookworm-slim"
    os.environ["DOCKER_HOST"] = ENGINE  # debian_base.py's `docker` commands
    ensure_public_base(PLATFORM, local)
    results["base_import_records"] = docker(
        ENGINE, "image", "inspect", local, "--format", "{{.Architecture}}"
    ).stdout.strip()
    remote = f"{REGISTRY}/library/{BASE_IMAGE}"
    with tempfile.TemporaryDirectory(prefix="arm64-base-") as tmp:
        saved = Path(tmp) / "saved.tar"
        docker(ENGINE, "save", "-o", str(saved), local)
        fixed = with_architecture(saved, Path(tmp), remote)
        loaded = docker(ENGINE, "load", "-i", str(fixed)).stdout.strip()
    results["base_loaded"] = loaded
    results["base_recorded"] = docker(
        ENGINE, "image", "inspect", remote, "--format", "{{.Os}}/{{.Architecture}}/{{.Variant}}"
    ).stdout.strip()
    docker(ENGINE, "push", remote)
    docker(ENGINE, "rmi", remote, local)


def with_architecture(saved: Path, folder: Path, name: str) -> Path:
    """`saved` (a `docker save` tarball) with its configuration saying arm64 v8, tagged `name`."""
    unpacked = folder / "unpacked"
    with tarfile.open(saved) as tar:
        tar.extractall(unpacked, filter="tar")
    manifest = json.loads((unpacked / "manifest.json").read_text())
    old = unpacked / manifest[0]["Config"]
    config = json.loads(old.read_text())
    config.update(architecture="arm64", variant="v8")
    text = json.dumps(config).encode()
    new_name = f"{sha256(text).hexdigest()}.json"
    old.unlink()
    (unpacked / new_name).write_bytes(text)
    manifest[0].update(Config=new_name, RepoTags=[name])
    (unpacked / "manifest.json").write_text(json.dumps(manifest))
    (unpacked / "repositories").unlink(missing_ok=True)
    fixed = folder / "fixed.tar"
    with tarfile.open(fixed, "w") as tar:
        for entry in sorted(unpacked.iterdir()):
            tar.add(entry, arcname=entry.name)
    return fixed


def conclave_build(results: dict[str, Any], step: str, *extra: str) -> None:
    """`conclave sandbox build ... --route dockerfile --platform linux/arm64` against the engine."""
    argv = [CONCLAVE, "sandbox", "build", *extra, "--route", "dockerfile", "--platform", PLATFORM]
    argv += ["--apt-mirror", MIRROR]
    started = time.monotonic()  # wall-time: the build's time is the figure this bench reports
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "DOCKER_HOST": ENGINE})
    results[f"{step}_build_s"] = round(time.monotonic() - started, 1)  # wall-time: as above
    results[f"{step}_command"] = " ".join(["conclave", *argv[1:]])
    lines = (done.stdout + done.stderr).splitlines()
    results[f"{step}_output"] = [line for line in lines if not line.startswith("Step ")][-12:]
    results[f"{step}_exit"] = done.returncode
    print("\n".join(lines[-40:]), flush=True)


def run(host: str, image: str, script: str) -> list[str]:
    argv = ["run", "--rm", "--network", "none", "--user", "1000:1000", "--tmpfs", "/tmp:rw,exec,size=1g"]
    for key, value in CLI_ENV.items():
        argv += ["-e", f"{key}={value}"]
    return docker(host, *argv, image, "sh", "-c", script).stdout.strip().splitlines()


def inspect(host: str, image: str) -> dict[str, Any]:
    attrs = json.loads(docker(host, "image", "inspect", image).stdout)[0]
    config = attrs["Config"]
    return {
        "user": config["User"],
        "workdir": config["WorkingDir"],
        "cmd": config["Cmd"],
        "env": sorted(config["Env"]),
        "labels": {k: v for k, v in (config["Labels"] or {}).items() if k != ROUTE_LABEL},
        "route": (config["Labels"] or {}).get(ROUTE_LABEL),
        "recorded": f"{attrs['Os']}/{attrs['Architecture']}",
        "size_mb": round(attrs["Size"] / 1e6, 1),
    }


def compare(results: dict[str, Any]) -> None:
    pairs = {
        "plain": ((ENGINE, default_tag(PLATFORM)), (MAIN, MMDEBSTRAP_PLAIN)),
        "clis": ((ENGINE, clis_tag(PLATFORM)), (MAIN, MMDEBSTRAP_CLIS)),
    }
    smoke = " ".join(f"'{part}'" for part in SMOKE_TEST)
    checks = {
        "packages": PACKAGES,
        "user": USER,
        "uname_m": "uname -m",
        "smoke_test": f"{smoke} && echo passed",
    }
    for image, ((host, tag), (other_host, other)) in pairs.items():
        seen = {"dockerfile": inspect(host, tag), "mmdebstrap": inspect(other_host, other)}
        results[f"{image}_images"] = {
            "dockerfile": {"tag": tag, **seen["dockerfile"]},
            "mmdebstrap": {"tag": other, **seen["mmdebstrap"]},
        }
        # what differs by design: the route label, the size, and the architecture the engine records
        # (Docker 20.10's `import --platform` records its own: bench/results/arm64-images.json)
        results[f"{image}_recorded"] = {route: seen[route]["recorded"] for route in seen}
        ours_config, their_config = (
            {k: v for k, v in seen[route].items() if k not in ("route", "size_mb", "recorded")}
            for route in seen
        )
        results[f"{image}_same_config"] = ours_config == their_config
        if ours_config != their_config:
            results[f"{image}_config_differences"] = {
                k: (v, their_config.get(k)) for k, v in ours_config.items() if v != their_config.get(k)
            }
        extra = {"files": FILES, "versions": VERSIONS} if image == "clis" else {}
        for what, script in {**checks, **extra}.items():
            ours, theirs = run(host, tag, script), run(other_host, other, script)
            results[f"{image}_same_{what}"] = ours == theirs
            if ours != theirs:
                results[f"{image}_{what}_differences"] = sorted(set(ours) ^ set(theirs))[:40]
            if what in ("versions", "uname_m", "smoke_test"):
                results[f"{image}_{what}"] = ours


async def main(steps: tuple[str, ...]) -> dict[str, Any]:
    results: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results.update(
        {
            "date": datetime.date.today().isoformat(),
            "engine": docker(ENGINE, "version", "--format", "{{.Server.Version}}").stdout.strip(),
            "host": os.uname().machine,
            "binfmt": enable_binfmt(),
        }
    )
    for step in steps:
        print(f"== {step} ({time.strftime('%H:%M:%S')})", flush=True)  # wall-time: progress shown
        started = time.monotonic()  # wall-time: each step's time is reported
        try:
            if step == "base":
                publish_base(results)
            elif step == "plain":
                conclave_build(results, "plain")
            elif step == "clis":
                conclave_build(results, "clis", "--clis")
            elif step == "compare":
                compare(results)
            elif step == "e2e":
                os.environ["DOCKER_HOST"] = ENGINE
                await e2e_job(default_tag(PLATFORM), results)
        except Exception as exc:
            detail = getattr(exc, "stderr", "") or ""
            results[f"{step}_error"] = f"{type(exc).__name__}: {exc} {detail}"[:2000]
            print(results[f"{step}_error"], flush=True)
            continue
        results[f"{step}_s"] = round(time.monotonic() - started, 1)  # wall-time: as above
        write_results(RESULTS, results)
    return results


if __name__ == "__main__":
    chosen = tuple(sys.argv[1:]) or STEPS
    if not set(chosen) <= set(STEPS):
        raise SystemExit(f"steps: {' '.join(STEPS)} (default: all, in that order)")
    write_results(RESULTS, anyio.run(main, chosen))
