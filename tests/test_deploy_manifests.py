"""The deployment files in docs/deploy/ (the image, the compose file, the Kubernetes manifests) say only what
Conclave does: every `conclave ...` command in them is one the CLI's own parser takes, every CONCLAVE_*
variable is a setting, the probes are routes a real front serves on the port it listens on, the workers'
engine sees their folders where they are, and the files validate with a real compose implementation and
Kubernetes' API schemas. The image itself (built by docs/deploy/build-image.sh, which .ci/test-env.sh runs)
serves a front on PostgreSQL with per-caller tokens from a mounted secret.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2
import psycopg
import pytest
import yaml
from fastmcp import Client

from conclave import __version__
from conclave.app.tokens import load_tokens
from conclave.cli.main import build_parser
from conclave.config.presets import user_teams_dir
from conclave.jobs.admission.access import Access
from conclave.settings import Settings
from tests.fakes.processes import http_process
from tests.fakes.raw_mcp import HEADERS, INIT
from tests.fakes.server import FakeProviders, free_port
from tests.fakes.team import KEY_ENV, TRIO, install, voter, write_team
from tests.postgres import Cluster

DEPLOY = Path(__file__).resolve().parent.parent / "docs" / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
K8S = sorted((DEPLOY / "k8s").glob("*.yaml"))
IMAGE = f"conclave:{__version__}"  # what build-image.sh tags and every manifest runs
COMPOSE_ENV = {
    "POSTGRES_PASSWORD": "compose-check-password",
    "REDIS_PASSWORD": "compose-check-redis-password",
    "DOCKER_GID": "999",
}
IMAGE_UID = 10001  # the Dockerfile's user
OLDEST_KUBERNETES = "1.29.0"  # native sidecars (an init container with restartPolicy: Always)


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def k8s_documents() -> list[dict[str, Any]]:
    return [doc for path in K8S for doc in yaml.safe_load_all(path.read_text()) if doc]


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in k8s_documents():
        if doc["kind"] in ("Deployment", "StatefulSet"):
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def our_containers() -> Iterator[tuple[str, list[str], dict[str, str]]]:
    """(where, conclave's argv, literal environment) of every container that runs Conclave's image."""
    for name, service in compose()["services"].items():
        if service.get("image") == IMAGE:
            yield f"compose {name}", [str(arg) for arg in service["command"]], service.get("environment", {})
    for pod, spec in pod_specs():
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            if container["image"] == IMAGE:
                env = {item["name"]: item.get("value", "") for item in container.get("env", [])}
                yield f"k8s {pod}/{container['name']}", [str(arg) for arg in container["args"]], env


def parsed(argv: list[str]) -> argparse.Namespace:
    """The CLI's own parse of argv, with the command's own checks (as `conclave` runs them)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    assert not extra, f"conclave {' '.join(argv)}: not flags of ours: {extra}"
    assert args.command is not None, argv
    check = getattr(args, "_check", None)
    if check is not None:
        check(args._parser, args)
    return args


def image_cmd() -> list[str]:
    """The Dockerfile's ENTRYPOINT and CMD, from their JSON forms."""
    text = (DEPLOY / "Dockerfile").read_text()
    entry = re.search(r"^ENTRYPOINT (\[.*\])$", text, re.MULTILINE)
    cmd = re.search(r"^CMD (\[.*\])$", text, re.MULTILINE)
    assert entry and cmd, "the Dockerfile needs ENTRYPOINT and CMD in JSON form"
    return [*json.loads(entry[1]), "--", *json.loads(cmd[1])]


def test_the_image_runs_conclave_with_the_manifests_arguments() -> None:
    """The entrypoint hands its arguments to `conclave`, so a manifest's command/args are conclave's argv."""
    entry, _, cmd = " ".join(image_cmd()).partition(" -- ")
    assert entry == "conclave-entrypoint"
    assert (DEPLOY / "entrypoint.sh").read_text().rstrip().endswith('exec conclave "$@"')
    assert parsed(cmd.split()).http


def test_every_conclave_command_and_flag_is_the_cli_s_own() -> None:
    seen = {}
    for where, argv, _ in our_containers():
        try:
            seen[where] = parsed(argv).command
        except SystemExit:  # argparse has printed why
            pytest.fail(f"{where}: `conclave {' '.join(argv)}` is not a command the CLI takes")
    # fronts, workers and the sandbox image builds, on both
    assert {"serve", "worker", "sandbox"} <= {
        command for where, command in seen.items() if "compose" in where
    }
    assert {"serve", "worker", "sandbox"} <= {command for where, command in seen.items() if "k8s" in where}


def test_every_conclave_variable_is_a_setting_and_every_value_validates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = {f"CONCLAVE_{name.upper()}" for name in Settings.model_fields}
    for path in [COMPOSE, *K8S, DEPLOY / "Dockerfile", DEPLOY / "entrypoint.sh"]:
        for variable in sorted(set(re.findall(r"\bCONCLAVE_[A-Z0-9_]+", path.read_text()))):
            assert variable in settings, f"{path.name}: {variable} is not a Conclave setting"
    for where, _, env in our_containers():
        for name in settings:
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            if name.startswith("CONCLAVE_"):
                monkeypatch.setenv(name, str(value).replace("${", "{"))  # compose interpolates its own
        try:
            Settings()
        except ValueError as exc:
            pytest.fail(f"{where}: {exc}")


def test_the_compose_file_validates_with_docker_compose(tmp_path: Path) -> None:
    found = shutil.which("docker-compose")
    if found is None:
        pytest.skip("needs Debian's docker-compose (apt-get install docker-compose; .ci/test-env.sh does)")
    environ = {**os.environ, **COMPOSE_ENV}
    checked = subprocess.run(
        [found, "-f", str(COMPOSE), "config"], env=environ, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stderr
    resolved = yaml.safe_load(checked.stdout)
    assert resolved["services"]["worker"]["deploy"]["replicas"] == 3
    url = resolved["services"]["front-1"]["environment"]["CONCLAVE_DATABASE_URL"]
    assert url == f"postgresql://conclave:{COMPOSE_ENV['POSTGRES_PASSWORD']}@postgres:5432/conclave"
    # a missing secret is an error that names it, not an empty password
    del environ["POSTGRES_PASSWORD"]
    refused = subprocess.run([found, "-f", str(COMPOSE), "config", "-q"], env=environ, capture_output=True)
    assert refused.returncode != 0 and b"POSTGRES_PASSWORD" in refused.stderr


def test_the_kubernetes_manifests_validate_against_the_api_schemas() -> None:
    import kubernetes_validate

    for version in (OLDEST_KUBERNETES, kubernetes_validate.latest_version()):
        for doc in k8s_documents():
            kubernetes_validate.validate(doc, version, strict=True)
    # the validator is no formality: a misspelt field fails it
    broken = next(doc for doc in k8s_documents() if doc["kind"] == "Deployment")
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, OLDEST_KUBERNETES, strict=True)


def front_ports() -> Iterator[tuple[str, int, int]]:
    """(where, the port the front's args listen on, a port a manifest says it listens on)."""
    service = compose()["services"]
    for name in ("front-1", "front-2"):
        listens = parsed([str(arg) for arg in service[name]["command"]]).port
        for mapping in service[name]["ports"]:
            yield f"compose {name} ports", listens, int(mapping.split(":")[-1])
        health = " ".join(service[name]["healthcheck"]["test"])
        yield f"compose {name} healthcheck", listens, int(re.findall(r"127\.0\.0\.1:(\d+)/", health)[0])
    fronts = [
        container
        for _, spec in pod_specs()
        for container in spec["containers"]
        if container["image"] == IMAGE and container["args"][0] == "serve"
    ]
    assert fronts, "no front among the Kubernetes manifests"
    for container in fronts:
        listens = parsed(container["args"]).port
        named = {port["name"]: port["containerPort"] for port in container["ports"]}
        yield "k8s front containerPort", listens, named["http"]
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            port = container[probe]["httpGet"]["port"]
            yield f"k8s front {probe}", listens, named.get(port, port)
        for doc in k8s_documents():
            if doc["kind"] == "Service" and doc["metadata"]["name"] == "conclave-front":
                for port in doc["spec"]["ports"]:
                    yield "k8s Service conclave-front", listens, named.get(port["targetPort"], -1)


def probe_paths() -> set[str]:
    paths = set()
    for name in ("front-1", "front-2"):
        test = " ".join(compose()["services"][name]["healthcheck"]["test"])
        paths |= {urlsplit(url).path for url in re.findall(r"http://[^'\" ]+", test)}
    for _, spec in pod_specs():
        for container in spec["containers"]:
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                if "httpGet" in container.get(probe, {}):
                    paths.add(container[probe]["httpGet"]["path"])
    return paths


def test_the_probes_are_routes_a_front_serves_on_the_port_it_listens_on(tmp_path: Path) -> None:
    for where, listens, said in front_ports():
        assert said == listens, f"{where}: port {said}, but the front listens on {listens}"
    paths = probe_paths()
    assert {"/healthz", "/readyz"} <= paths, paths  # liveness and readiness, both probed
    with http_process(tmp_path, {"CONCLAVE_HOME": str(tmp_path / "home"), "CONCLAVE_CHECK_POOL": "0"}) as (
        base,
        _,
    ):
        for path in sorted(paths):
            answer = httpx2.get(f"{base}{path}", timeout=30)
            assert answer.status_code == 200, (path, answer.text)


def test_the_tokens_secret_has_the_shape_the_front_reads(tmp_path: Path) -> None:
    secret = next(doc for doc in k8s_documents() if doc["kind"] == "Secret")
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    tokens = home / "http-tokens.json"
    tokens.write_text(secret["stringData"]["http-tokens.json"])
    tokens.chmod(0o600)
    assert sorted(load_tokens(Settings(home=home)).callers.values()) == ["alice", "bob"]
    url = urlsplit(secret["stringData"]["database-url"])
    assert (url.scheme, url.hostname, url.port) == ("postgresql", "postgres", 5432)


def test_team_files_go_on_the_fronts_and_provider_keys_on_the_workers_only(tmp_path: Path) -> None:
    """docs/deploy.md's "What each process needs": a front resolves a job's team from its team folder and
    stores it with the job, a worker runs the stored copy with its provider keys. So in compose as
    docker-compose resolves it, each front mounts a team folder at its user's team folder and holds no
    provider key, each worker is given every provider's key variable and no team folder."""
    found = shutil.which("docker-compose")
    if found is None:
        pytest.skip("needs Debian's docker-compose (apt-get install docker-compose; .ci/test-env.sh does)")
    keys = {"ANTHROPIC_API_KEY": "sk-ant-check", "OPENAI_API_KEY": "sk-check", "GEMINI_API_KEY": "g-check"}
    checked = subprocess.run(
        [found, "-f", str(COMPOSE), "config"],
        env={**os.environ, **COMPOSE_ENV, **keys},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr
    services = yaml.safe_load(checked.stdout)["services"]
    teams = str(user_teams_dir({"HOME": image_home()}))

    def team_mounts(service: dict[str, Any]) -> list[str]:
        mounts = [
            volume if isinstance(volume, str) else f"{volume['source']}:{volume['target']}"
            for volume in service.get("volumes", [])
        ]
        return [mount for mount in mounts if mount.split(":")[1] == teams]

    for name in ("front-1", "front-2"):
        front = services[name]
        assert not any(variable.endswith("_API_KEY") for variable in front["environment"]), name
        assert team_mounts(front), f"{name} mounts no team folder at {teams}"
    worker = services["worker"]
    assert {name: worker["environment"].get(name) for name in keys} == keys
    assert team_mounts(worker) == [], "a worker reads no team file: it runs the team stored with the job"


def image_home() -> str:
    """The home of the image's user (the Dockerfile's useradd), where its team folder lies."""
    found = re.search(r"--home-dir (\S+)", (DEPLOY / "Dockerfile").read_text())
    assert found, "the Dockerfile's user has no --home-dir"
    return found[1]


def test_a_worker_s_engine_sees_its_folders_at_the_same_paths() -> None:
    """The engine bind-mounts workspaces and check folders by their path in the worker, so every folder a
    worker writes is at the same path where its engine runs: the dind sidecar, or the compose host."""
    for pod, spec in pod_specs():
        workers = [c for c in spec["containers"] if c["image"] == IMAGE and c["args"][0] == "worker"]
        for worker in workers:
            engine = next(c for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always")
            engine_mounts = {(m["name"], m["mountPath"]) for m in engine["volumeMounts"]}
            worker_mounts = {(m["name"], m["mountPath"]) for m in worker["volumeMounts"]}
            assert worker_mounts <= engine_mounts, pod
            env = {item["name"]: item.get("value") for item in worker["env"]}
            folders = {path for _, path in worker_mounts}
            assert env["CONCLAVE_JOBS_DIR"] in folders
            socket = urlsplit(env["DOCKER_HOST"]).path
            assert any(Path(socket).parent == Path(path) for path in folders), socket
            assert f"--host=unix://{socket}" in engine["args"]
    service = compose()["services"]["worker"]
    env = {**compose()["x-conclave"]["environment"], **service["environment"]}
    shared = [volume.split(":") for volume in service["volumes"] if not volume.endswith("docker.sock")]
    for name in ("CONCLAVE_HOME", "CONCLAVE_JOBS_DIR"):
        assert any(env[name].startswith(inside + "/") and host == inside for host, inside in shared), name
    assert "/var/run/docker.sock:/var/run/docker.sock" in service["volumes"]


def image_env() -> tuple[dict[str, str], Path]:
    """The Dockerfile's ENV (the CONCLAVE_* ones) and WORKDIR: what every container starts with."""
    text = (DEPLOY / "Dockerfile").read_text()
    block = re.search(r"^ENV (.*?)(?<!\\)$", text, re.MULTILINE | re.DOTALL)
    assert block, "the Dockerfile sets no ENV"
    pairs = re.findall(r"(CONCLAVE_[A-Z_]+)=(\S*)", block[1])
    workdir = re.findall(r"^WORKDIR (\S+)$", text, re.MULTILINE)
    return dict(pairs), Path(workdir[-1])


def test_no_caller_can_name_what_a_front_or_worker_keeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every front and worker, as the files start it: its roots are the operator's (the working directory
    is none), and no root is, holds or lies inside its home or its jobs folder."""
    defaults, workdir = image_env()
    for where, argv, env in our_containers():
        if argv[0] not in ("serve", "worker"):
            continue
        for name in Settings.model_fields:
            monkeypatch.delenv(f"CONCLAVE_{name.upper()}", raising=False)
        for name, value in {**defaults, **env}.items():
            if name.startswith("CONCLAVE_"):
                monkeypatch.setenv(name, str(value).replace("${", "{"))
        settings = Settings()
        roots = Access.http(settings, {}, workdir).folders
        assert roots is not None, where
        for root in roots:
            for kept in (settings.home, settings.jobs_root):
                touches = root == kept or root.is_relative_to(kept) or kept.is_relative_to(root)
                assert not touches, f"{where}: the root {root} and the state folder {kept}"


@pytest.fixture(scope="module")
def conclave_image() -> str:
    """Conclave's image in the local engine: .ci/test-env.sh builds it (docs/deploy/build-image.sh)."""
    found = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True)
    if found.returncode != 0:
        pytest.skip(f"needs the image {IMAGE}: bash docs/deploy/build-image.sh (.ci/test-env.sh runs it)")
    return IMAGE


@dataclass(frozen=True)
class ImageHost:
    """What the host gives the image's container: a secret file as compose mounts one (root's, 0644), a
    jobs folder the image's user owns, and the throwaway PostgreSQL's socket and a fresh schema's URL."""

    tokens: Path
    jobs: Path
    socket: Path
    url: str  # as seen inside the container, the socket under /run/postgresql
    host_url: str  # the same database as seen from this host


@pytest.fixture
def image_host(tmp_path: Path, postgres_cluster: Cluster) -> Iterator[ImageHost]:
    tokens = tmp_path / "http-tokens.json"
    tokens.write_text(json.dumps({"alice": "alice-token-0123456789", "bob": "bob-token-0123456789ab"}))
    tokens.chmod(0o644)
    jobs = tmp_path / "jobs"
    jobs.mkdir(mode=0o700)
    os.chown(jobs, IMAGE_UID, IMAGE_UID)
    socket = next(postgres_cluster.socket_dir.glob(".s.PGSQL.*"))
    with postgres_cluster.schema() as url:
        inside = url.get_secret_value().replace(str(postgres_cluster.socket_dir), "/run/postgresql")
        yield ImageHost(tokens, jobs, socket, inside, url.get_secret_value())


@pytest.mark.anyio
async def test_the_image_serves_a_front_on_postgresql_with_per_caller_tokens(
    conclave_image: str, image_host: ImageHost
) -> None:
    front = compose()["services"]["front-1"]
    argv = [str(arg) for arg in front["command"]]
    inside = parsed(argv).port
    jobs_dir = front["environment"]["CONCLAVE_JOBS_DIR"]
    run = [
        "docker", "run", "-d", "--rm", "--label", "conclave-test=deploy-image",
        "-p", f"127.0.0.1::{inside}",
        "-e", f"CONCLAVE_DATABASE_URL={image_host.url}",
        "-e", f"CONCLAVE_JOBS_DIR={jobs_dir}",
        "-v", f"{image_host.tokens}:/run/secrets/http-tokens.json:ro",
        "-v", f"{image_host.jobs}:{jobs_dir}",
        "-v", f"{image_host.socket}:/run/postgresql/{image_host.socket.name}",
        conclave_image, *argv,
    ]  # fmt: skip
    container = subprocess.run(run, capture_output=True, text=True, check=True).stdout.strip()
    try:
        port = (
            subprocess.run(
                ["docker", "port", container, str(inside)], capture_output=True, text=True, check=True
            )
            .stdout.split(":")[-1]
            .strip()
        )
        base = f"http://127.0.0.1:{port}"
        async with httpx2.AsyncClient(timeout=10) as http:
            with anyio.fail_after(90):  # a start limit, not a speed
                while True:
                    try:
                        live = await http.get(f"{base}/healthz")
                        break
                    except httpx2.TransportError:
                        await anyio.sleep(0.2)
            assert live.json() == {"status": "ok"}
            ready = (await http.get(f"{base}/readyz")).json()
            assert (ready["ready"], ready["store"]) == (True, "ok"), ready
            for token, status in (("alice-token-0123456789", 200), ("not-a-token-0123456789", 401)):
                headers = {**HEADERS, "Authorization": f"Bearer {token}"}
                assert (await http.post(f"{base}/mcp", json=INIT, headers=headers)).status_code == status
        # the first host on the database marked the shared jobs folder as its own (docs/deploy.md)
        assert (image_host.jobs / ".store-id").exists()
    finally:
        logs = subprocess.run(["docker", "logs", container], capture_output=True, text=True).stderr
        subprocess.run(["docker", "rm", "-f", container], capture_output=True)
    assert "Traceback" not in logs, logs


def test_the_image_reaches_the_host_s_engine_as_the_compose_workers_do(
    conclave_image: str, docker_image: str, clis_image: str
) -> None:
    """compose's sandbox-images service, as it runs: the socket mounted, the image's user in the socket's
    group (DOCKER_GID). It finds the sandbox images this checkout's code names, already built here."""
    service = compose()["services"]["sandbox-images"]
    argv = [str(arg) for arg in service["command"]]
    assert "/var/run/docker.sock:/var/run/docker.sock" in service["volumes"]
    assert [group.split(":")[0] for group in service["group_add"]] == ["${DOCKER_GID"]
    group = str(os.stat("/var/run/docker.sock").st_gid)
    run = subprocess.run(
        ["docker", "run", "--rm", "--label", "conclave-test=deploy-image",
         "-v", "/var/run/docker.sock:/var/run/docker.sock", "--group-add", group, conclave_image, *argv],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert f"{docker_image}: already present" in run.stdout and f"{clis_image}: already present" in run.stdout


REDIS_PASSWORD = secrets.token_hex(16)  # the test Redis asks for it, as compose's does


@contextmanager
def redis_on_a_socket(folder: Path) -> Iterator[Path]:
    """Debian's redis-server on a unix socket any user may open (the image's user too), no TCP, nothing
    saved, asking for REDIS_PASSWORD: the compose file's Redis, reached the way a container reaches a
    mounted socket."""
    socket = folder / "redis.sock"
    process = subprocess.Popen(
        ["redis-server", "--port", "0", "--unixsocket", str(socket), "--unixsocketperm", "777",
         "--save", "", "--appendonly", "no", "--dir", str(folder), "--requirepass", REDIS_PASSWORD],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10  # wall-time: a start limit, not a speed
        while not socket.exists():
            assert process.poll() is None, "redis-server exited at start"
            assert time.monotonic() < deadline, "no socket"  # wall-time: a start limit, not a speed
            time.sleep(0.05)  # sleep-ok: until redis-server opens its socket
        yield socket
    finally:
        process.terminate()
        process.wait(timeout=10)


def container(name: str, mounts: dict[Path, str], env: dict[str, str], argv: list[str]) -> str:
    """A container of Conclave's image on the host's network (the fakes listen on 127.0.0.1), as a
    deployment runs it: its args the manifest's, `mounts` host path -> path inside."""
    run = [
        "docker",
        "run",
        "-d",
        "--network",
        "host",
        "--name",
        name,
        "--label",
        "conclave-test=deploy-image",
    ]
    for host, inside in mounts.items():
        run += ["-v", f"{host}:{inside}"]
    for key, value in env.items():
        run += ["-e", f"{key}={value}"]
    return subprocess.run([*run, IMAGE, *argv], capture_output=True, text=True, check=True).stdout.strip()


def logs(name: str) -> str:
    found = subprocess.run(["docker", "logs", name], capture_output=True, text=True)
    return found.stdout + found.stderr


@pytest.mark.anyio
async def test_a_front_and_a_worker_from_the_image_run_a_job_on_postgresql_and_redis(
    conclave_image: str, image_host: ImageHost, tmp_path: Path, fakes: FakeProviders
) -> None:
    """compose's front-1 and worker, their args and variables as the file says (the front on a free port:
    the host's network), Redis and PostgreSQL on sockets; a job asked at the front runs on the worker."""
    services = compose()["services"]
    install(fakes.script, TRIO, voter())
    config = tmp_path / "config"
    write_team(config / "conclave" / "teams" / "fake-trio.yaml", fakes, TRIO, name="fake-trio")
    for folder in [config, *config.rglob("*")]:
        folder.chmod(0o755 if folder.is_dir() else 0o644)
    redis_dir, srv = tmp_path / "redis", tmp_path / "srv"
    redis_dir.mkdir()
    srv.mkdir(mode=0o700)
    os.chown(srv, IMAGE_UID, IMAGE_UID)
    port = free_port()
    front_argv = [str(arg) for arg in services["front-1"]["command"]]
    front_argv[front_argv.index("--port") + 1] = str(port)
    names = [f"conclave-deploy-{role}-{secrets.token_hex(3)}" for role in ("front", "worker")]
    with redis_on_a_socket(redis_dir) as redis:
        shared = {
            **{k: str(v) for k, v in services["worker"]["environment"].items() if k.startswith("CONCLAVE_")},
            "CONCLAVE_DATABASE_URL": image_host.url,  # compose's own: the password from POSTGRES_PASSWORD
            "CONCLAVE_QUEUE_URL": f"unix://:{REDIS_PASSWORD}@/run/redis/redis.sock",  # compose's: a password
            "CONCLAVE_CHECK_POOL": "0",  # the fake team runs no commands: no engine here
            "XDG_CONFIG_HOME": "/var/lib/conclave/config",
            KEY_ENV: "test-key",
        }
        mounts = {
            srv: "/srv/conclave",  # compose's one folder for state and jobs, shared as on its host
            image_host.socket: f"/run/postgresql/{image_host.socket.name}",
            redis: "/run/redis/redis.sock",
            config: "/var/lib/conclave/config",
        }
        try:
            container(names[1], mounts, shared, [str(arg) for arg in services["worker"]["command"]])
            container(
                names[0], {**mounts, image_host.tokens: "/run/secrets/http-tokens.json"}, shared, front_argv
            )
            with anyio.fail_after(90):  # a start limit, not a speed
                while "taking up to" not in logs(names[1]):
                    await anyio.sleep(0.2)
                async with httpx2.AsyncClient(timeout=10) as http:
                    while True:
                        try:
                            await http.get(f"http://127.0.0.1:{port}/healthz")
                            break
                        except httpx2.TransportError:
                            await anyio.sleep(0.2)
            async with Client(f"http://127.0.0.1:{port}/mcp", auth="alice-token-0123456789") as client:
                asked = await client.call_tool("ask_team", {"task": "What is 6 * 7?", "team": "fake-trio"})
                job_id = asked.structured_content["job_id"]
                with anyio.fail_after(120):  # a hang guard, not a speed
                    while True:
                        status = await client.call_tool("get_status", {"job_id": job_id, "wait_seconds": 30})
                        if status.structured_content["state"] not in ("queued", "running", "presenting"):
                            break
            assert status.structured_content["state"] == "completed", (logs(names[0]), logs(names[1]))
            assert len(fakes.script.requests) >= 6  # three answers and three votes at least
            # the worker ran it (a front with a queue runs no job): the job's owner is the worker's id
            with psycopg.connect(image_host.host_url) as db:
                row = db.execute("SELECT owner_id FROM jobs WHERE id = %s", (job_id,)).fetchone()
            assert row is not None and f"conclave worker {row[0]} on " in logs(names[1])
        finally:
            seen = {name: logs(name) for name in names}
            subprocess.run(["docker", "rm", "-f", *names], capture_output=True)
    for name, text in seen.items():
        assert "Traceback" not in text, (name, text)


def test_redis_and_postgresql_take_connections_only_from_fronts_and_workers() -> None:
    """The network policies select the pods the manifests make, by their labels, and let in exactly the
    pods that run `conclave serve` and `conclave worker`, on the ports those services listen on."""
    labels = {
        name: spec_labels
        for doc in k8s_documents()
        if doc["kind"] in ("Deployment", "StatefulSet")
        for name, spec_labels in [(doc["metadata"]["name"], doc["spec"]["template"]["metadata"]["labels"])]
    }
    conclave = {
        labels[pod]["app.kubernetes.io/name"]
        for pod, spec in pod_specs()
        if any(c["image"] == IMAGE and c["args"][0] in ("serve", "worker") for c in spec["containers"])
    }
    ports = {
        doc["spec"]["selector"]["app.kubernetes.io/name"]: {p["port"] for p in doc["spec"]["ports"]}
        for doc in k8s_documents()
        if doc["kind"] == "Service"
    }
    guarded = set()
    for policy in (doc for doc in k8s_documents() if doc["kind"] == "NetworkPolicy"):
        target = policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"]
        assert any(pod_labels.get("app.kubernetes.io/name") == target for pod_labels in labels.values())
        (rule,) = policy["spec"]["ingress"]
        (source,) = rule["from"]
        (expression,) = source["podSelector"]["matchExpressions"]
        assert (expression["key"], expression["operator"]) == ("app.kubernetes.io/name", "In")
        assert set(expression["values"]) == conclave, policy["metadata"]["name"]
        assert {port["port"] for port in rule["ports"]} == ports[target]
        guarded.add(target)
    assert guarded == {"redis", "postgres"}
