"""The compose lane (not a unit test): docs/deploy/compose.yaml, as shipped, brought up as an operator would.

    python bench/compose_lane.py [--out bench/results/compose-lane.json] [--keep]

What it does, each step timed, the result in bench/results/compose-lane.json:
1. the images compose.yaml names: Redis and PostgreSQL made from Debian's packages where no registry is
   reachable (tests/fakes/service_images.py; an image already in the engine is kept), and Conclave's
   own (docs/deploy/build-image.sh, run on a `git archive` of HEAD, so others' uncommitted edits in the
   checkout stay out of it);
2. the operator's steps of compose.yaml's header: /srv/conclave (0700, uid 10001) and /srv/projects,
   the secrets (http-tokens.json with two callers, the PostgreSQL and Redis passwords), an env file
   with the passwords, DOCKER_GID and the fakes' key, and a team file in the fronts' team folder
   (/srv/conclave/teams) only. The team's endpoints are the fakes', and a provider's own key variable
   goes only to that provider, so the key is a variable of its own (LANE_PROVIDER_KEY), which an
   override file (`OVERRIDE`, the operator's way to add to a shipped compose file) gives the workers;
3. a byte-identical copy of compose.yaml (its sha256 recorded) `docker-compose up -d` (its replicas):
   Redis, PostgreSQL, the sandbox images, two fronts and three workers;
4. the fake providers (tests/fakes/server.py) on this machine, listening only on the compose network's
   gateway address, which the containers reach and nothing outside this machine does; every reply
   takes 1.5 s, so a job runs long enough to be killed mid-vote;
5. a job through each front (the official MCP client over HTTP, each front's caller's token), named by
   the team's name, which only the fronts' team folder holds;
6. the worker that runs the first job `docker kill`ed once every agent has answered; the operator's
   clock from the kill: the job's owner changed in the store, its `resumed` event, and `get_status`
   through the front saying it completed; the second job completed too;
7. `docker-compose down -v`, and the folders of step 2 removed (the lane makes them only where /srv
   holds none of its own: it never touches an operator's).

Workers in their own containers have host names of their own, so a dead worker is judged by its lease
(CONCLAVE_STALE_AFTER_S, 15 s, then the next heartbeat, 5 s): the takeover an operator of this layout
sees. Needs root (the folders' owner), Docker, docker-compose and mmdebstrap (.ci/test-env.sh).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
from fastmcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from conclave.jobs.read.views import JobView
from tests.fakes.debian_base import ensure_public_base
from tests.fakes.server import FakeProviders
from tests.fakes.service_images import ensure_service_images
from tests.fakes.team import TRIO, install, voter, write_team

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docs" / "deploy" / "compose.yaml"
PROJECT = "conclave-lane"
SRV = Path("/srv")
STATE, PROJECTS = SRV / "conclave", SRV / "projects"
TEAMS = STATE / "teams"  # the fronts' team folder (compose.yaml mounts it there)
MARK = ".conclave-compose-lane"  # the lane made this folder: it may remove it
USER = 10001  # the image's user
TEAM = "lane-trio"
# A team's own endpoint gets a key variable of its own (a provider's key goes only to that provider:
# config/models.py), which the shipped file does not pass; so an override file, the operator's way to add
# to a shipped compose file, gives it to the workers only
KEY = "LANE_PROVIDER_KEY"
OVERRIDE = f"""services:
  worker:
    environment:
      {KEY}: ${{{KEY}:?}}
"""
REPLY_S = 1.5
WORKERS = 3
LIMIT_S = 600.0  # a hang guard, not a speed


class Clock:
    """Steps and their seconds, for the result file."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []

    @contextmanager
    def step(self, name: str) -> Iterator[dict[str, Any]]:
        record: dict[str, Any] = {"step": name}
        print(f"== {name}", flush=True)
        started = time.monotonic()
        try:
            yield record
        finally:
            record["seconds"] = round(time.monotonic() - started, 2)
            self.steps.append(record)
            print(f"   {record}", flush=True)


def run(*argv: str, env: dict[str, str] | None = None, check: bool = True) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, env=env)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result.stdout


class Compose:
    """`docker-compose` of the copied file, the project's name and the operator's env file."""

    def __init__(self, folder: Path, env_file: Path) -> None:
        self.base = [
            "docker-compose",
            "-p",
            PROJECT,
            "--env-file",
            str(env_file),
            "-f",
            str(folder / "compose.yaml"),
            "-f",
            str(folder / "lane.override.yaml"),
        ]

    def __call__(self, *args: str, check: bool = True) -> str:
        return run(*self.base, *args, check=check)

    def containers(self, service: str) -> list[str]:
        names = run(
            "docker",
            "ps",
            "-a",
            "--format",
            "{{.Names}}",
            "--filter",
            f"label=com.docker.compose.project={PROJECT}",
            "--filter",
            f"label=com.docker.compose.service={service}",
        )
        return sorted(names.split())

    def sql(self, query: str) -> str:
        [postgres] = self.containers("postgres")
        return run(
            "docker", "exec", postgres, "psql", "-U", "conclave", "-d", "conclave", "-Atc", query
        ).strip()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_folders() -> None:
    for folder in (STATE, PROJECTS):
        if folder.exists() and not (folder / MARK).exists():
            raise SystemExit(
                f"{folder} exists and is not the lane's: the lane uses an operator's paths, move it"
            )
        if folder.exists():
            shutil.rmtree(folder)
    STATE.mkdir(mode=0o700)
    PROJECTS.mkdir()
    TEAMS.mkdir()
    for folder in (STATE, PROJECTS):
        (folder / MARK).touch()
        os.chown(folder, USER, USER)


def write_secrets(folder: Path, tokens: dict[str, str]) -> dict[str, str]:
    """compose.yaml's header, step by step: the secrets and the env file's values."""
    secrets_dir = folder / "secrets"
    secrets_dir.mkdir(mode=0o700)
    (secrets_dir / "http-tokens.json").write_text(json.dumps(tokens))
    os.chown(secrets_dir / "http-tokens.json", USER, 0)
    values = {"POSTGRES_PASSWORD": secrets.token_urlsafe(24), "REDIS_PASSWORD": secrets.token_hex(24)}
    (secrets_dir / "postgres-password").write_text(values["POSTGRES_PASSWORD"] + "\n")
    (secrets_dir / "redis-password").write_text(values["REDIS_PASSWORD"] + "\n")
    for name in ("http-tokens.json", "postgres-password", "redis-password"):
        (secrets_dir / name).chmod(0o400)
    values["DOCKER_GID"] = str(os.stat("/var/run/docker.sock").st_gid)
    values[KEY] = "lane-provider-key-0123456789"
    return values


def network() -> str:
    """The project's one network (compose names it after the project, normalised its own way)."""
    [name] = run(
        "docker", "network", "ls", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}"
    ).split()
    return name


def gateway(network: str) -> str:
    config = json.loads(run("docker", "network", "inspect", network))[0]["IPAM"]["Config"]
    return str(config[0]["Gateway"])


def until(what: str, probe: Any, limit_s: float = LIMIT_S, every: float = 0.25) -> Any:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(every)  # a condition polled under a limit
    raise TimeoutError(f"{what}: not within {limit_s} s")


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


async def status(client: Client, job_id: str, wait: float = 0) -> JobView:
    result = await client.call_tool("get_status", {"job_id": job_id, "wait_seconds": wait})
    return JobView.model_validate(result.structured_content)


async def ask(port: int, token: str) -> str:
    async with Client(f"http://127.0.0.1:{port}/mcp", auth=token) as client:
        result = await client.call_tool(
            "ask_team", {"task": "What is 6 * 7?", "team": TEAM, "wait_seconds": 0}
        )
        return str(JobView.model_validate(result.structured_content).job_id)


async def answers(port: int, token: str, job_id: str) -> int:
    async with Client(f"http://127.0.0.1:{port}/mcp", auth=token) as client:
        view = await status(client, job_id)
        return 0 if view.progress is None else sum(agent.answers for agent in view.progress.agents)


async def done(port: int, token: str, job_id: str) -> JobView:
    """The job's view once `get_status` through the front says it is done (polled, as an operator's
    client would, every 0.25 s, so the time it reports is the front's word, not a long poll's)."""
    async with Client(f"http://127.0.0.1:{port}/mcp", auth=token) as client:
        with anyio.fail_after(LIMIT_S):
            while not (view := await status(client, job_id)).done:
                await anyio.sleep(0.25)
    return view


def lane(out: Path, keep: bool) -> dict[str, Any]:
    clock = Clock()
    result: dict[str, Any] = {
        "commit": run("git", "-C", str(ROOT), "rev-parse", "HEAD").strip(),
        "compose_sha256": sha256(COMPOSE),
        "load_before": round(os.getloadavg()[0], 2),
        "reply_s": REPLY_S,
    }
    with clock.step("images: redis and postgres from Debian's packages (kept when present)") as record:
        ensure_public_base()
        record["images"] = ensure_service_images()
        record["versions"] = {
            "redis": run(
                "docker", "run", "--rm", "--entrypoint", "redis-server", "redis:7-bookworm", "--version"
            ).split()[2],
            "postgres": run(
                "docker", "run", "--rm", "--entrypoint", "postgres", "postgres:16-bookworm", "--version"
            ).strip(),
        }
    with (
        clock.step("image: conclave:0.1.0 by docs/deploy/build-image.sh from HEAD") as record,
        tempfile.TemporaryDirectory(prefix="conclave-lane-src-") as src,
    ):
        # git archive's files are 0664 by default, a clone's 0644 (umask 022): with a clone's modes the
        # wheel has the bytes .ci/test-env.sh's build of the same commit had, and the engine reuses
        # every layer of that image (a build from scratch took a minute of the lane)
        export = ["git", "-C", str(ROOT), "-c", "tar.umask=022", "archive", "HEAD"]
        archive = subprocess.run(export, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", src], input=archive.stdout, check=True)
        env = {**os.environ, "PYTHON": str(ROOT / ".venv" / "bin" / "python")}
        record["tag"] = run("bash", f"{src}/docs/deploy/build-image.sh", env=env).strip()
    tokens = {"alice": "alice-" + secrets.token_hex(16), "bob": "bob-" + secrets.token_hex(16)}
    with tempfile.TemporaryDirectory(prefix="conclave-lane-") as tmp:
        folder = Path(tmp)
        shutil.copyfile(COMPOSE, folder / "compose.yaml")
        assert sha256(folder / "compose.yaml") == result["compose_sha256"]
        (folder / "lane.override.yaml").write_text(OVERRIDE)
        result["override"] = OVERRIDE
        with clock.step("operator: folders, secrets, env file (compose.yaml's header)"):
            make_folders()
            values = write_secrets(folder, tokens)
            env_file = folder / "conclave.env"
            env_file.write_text("".join(f"{name}={value}\n" for name, value in values.items()))
            env_file.chmod(0o600)
        compose = Compose(folder, env_file)
        try:
            # `up --no-start` would wait for sandbox-images to complete (the workers' condition): so
            # Redis first, which makes the network and depends on nothing
            with clock.step("docker-compose up -d redis (the project's network)"):
                compose("up", "-d", "redis")
                address = gateway(network())
            result["fakes_address"] = address
            with FakeProviders(host=address) as fakes:
                install(fakes.script, TRIO, voter(delay=REPLY_S))
                team = write_team(TEAMS / f"{TEAM}.yaml", fakes, TRIO, name=TEAM, key_env=KEY)
                team.chmod(0o644)
                with clock.step("docker-compose up -d, until both fronts are ready") as record:
                    compose("up", "-d")
                    until("front-1 ready", lambda: ready(8765))
                    until("front-2 ready", lambda: ready(8766))
                    record["workers"] = compose.containers("worker")
                    # the file's own deploy.replicas, which docker-compose 1.29 honours
                    assert len(record["workers"]) == WORKERS, record["workers"]
                result["layout"] = layout(compose)
                result["jobs"] = anyio.run(jobs_and_kill, compose, tokens, clock)
                result["fake_calls"] = {agent: len(fakes.script.requests_of(agent)) for _, agent in TRIO}
        except BaseException:
            (out.parent / "compose-lane.log").write_text(
                compose("logs", "--no-color", check=False)[-200_000:]
            )
            raise
        finally:
            if not keep:
                with clock.step("docker-compose down -v, folders removed"):
                    # a stopped worker drains for up to stop_grace_period (15 min): not the lane's business
                    compose("down", "-v", "--remove-orphans", "--timeout", "10", check=False)
                    for path in (STATE, PROJECTS):
                        shutil.rmtree(path, ignore_errors=True)
    result["steps"] = clock.steps
    result["load_after"] = round(os.getloadavg()[0], 2)
    return result


def layout(compose: Compose) -> dict[str, Any]:
    """What each process holds, as `docker inspect` and the containers' own file systems say."""
    found: dict[str, Any] = {}
    for service in ("front-1", "front-2", "worker"):
        for name in compose.containers(service):
            env = json.loads(run("docker", "inspect", name))[0]["Config"]["Env"]
            teams = run(
                "docker",
                "exec",
                name,
                "sh",
                "-c",
                "ls /var/lib/conclave/.config/conclave/teams 2>/dev/null || echo none",
            ).split()
            found[name] = {
                "provider_key": any(item.startswith(f"{KEY}=") and item != f"{KEY}=" for item in env),
                "team_folder": teams,
            }
    return found


async def jobs_and_kill(compose: Compose, tokens: dict[str, str], clock: Clock) -> dict[str, Any]:
    with clock.step("a job through each front (official MCP client over HTTP)") as record:
        first = await ask(8765, tokens["alice"])
        second = await ask(8766, tokens["bob"])
        record["jobs"] = [first, second]
    with clock.step("until every agent of the first job has answered (its vote in flight)"):
        with anyio.fail_after(LIMIT_S):
            while await answers(8765, tokens["alice"], first) < len(TRIO):
                await anyio.sleep(0.25)
    owner = compose.sql(f"SELECT owner_host FROM jobs WHERE id = '{first}'")
    victim = next(name for name in compose.containers("worker") if container_host(name) == owner)
    killed = time.time()
    run("docker", "kill", victim)
    print(f"   killed {victim} (host {owner}) running {first}", flush=True)
    takeover: dict[str, Any] = {"killed": victim}

    def claimed() -> str | None:
        now = compose.sql(f"SELECT owner_host FROM jobs WHERE id = '{first}'")
        return now if now and now != owner else None

    new_owner = await anyio.to_thread.run_sync(lambda: until("claimed", claimed, every=0.1))
    takeover["to_claimed_s"] = round(time.time() - killed, 2)
    takeover["by"] = next(name for name in compose.containers("worker") if container_host(name) == new_owner)
    view = await done(8765, tokens["alice"], first)
    takeover["to_completed_s"] = round(time.time() - killed, 2)
    resumed_at = compose.sql(
        f"SELECT j.started_at + e.at FROM events e JOIN jobs j ON j.id = e.job_id "
        f"WHERE e.job_id = '{first}' AND e.kind = 'resumed' ORDER BY e.seq LIMIT 1"
    )
    takeover["to_resumed_s"] = round(float(resumed_at) - killed, 2) if resumed_at else None
    takeover["state"] = view.state
    takeover["final"] = view.answer
    other = await done(8766, tokens["bob"], second)
    return {
        "first": {"id": first, "front": "front-1", **takeover},
        "second": {
            "id": second,
            "front": "front-2",
            "state": other.state,
            "final": other.answer,
            "ran_on": compose.sql(f"SELECT owner_host FROM jobs WHERE id = '{second}'") or None,
        },
        "killed_state": run(
            "docker", "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", victim
        ).strip(),
    }


def container_host(name: str) -> str:
    return run("docker", "inspect", "--format", "{{.Config.Hostname}}", name).strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "compose-lane.json")
    parser.add_argument("--keep", action="store_true", help="leave the deployment up (and /srv) after it")
    args = parser.parse_args()
    result = lane(args.out, args.keep)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["jobs"], indent=2))


if __name__ == "__main__":
    main()
