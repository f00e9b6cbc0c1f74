"""`conclave doctor`: is this machine ready? Each check says what is wrong and how to fix it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass

import anyio

from conclave.backends.llama_server import check_installed
from conclave.backends.local import BUNDLED, model_file
from conclave.config.clis import CLIS, keychain_user, login_fix, login_source
from conclave.config.models import SandboxSpec
from conclave.config.providers import PROVIDERS
from conclave.errors import ConfigError, QueueUnavailable, SandboxUnavailable, StoreUnavailable
from conclave.jobs.lookup import store_summary
from conclave.jobs.worker import queue_report
from conclave.sandbox.clis_image import CLI_PINS, clis_tag
from conclave.sandbox.endpoint import choose_endpoint
from conclave.sandbox.engine import EngineFacts, connect, engine_facts, engine_status
from conclave.sandbox.image import image_tag
from conclave.settings import Settings


@dataclass(frozen=True)
class Probe:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    essential: bool = True  # a failing essential check makes `doctor` exit non-zero

    def line(self) -> str:
        mark = "ok  " if self.ok else ("FAIL" if self.essential else "note")
        fix = f" -> {self.fix}" if self.fix and not self.ok else ""
        return f"[{mark}] {self.name}: {self.detail}{fix}"


def run_checks(settings: Settings, environ: Mapping[str, str]) -> list[Probe]:
    return [
        _state_dir(settings),
        _store(settings),
        *_queue(settings),
        *_docker(settings),
        *_keys(environ),
        _local_model(),
        *_clis(environ),
    ]


def _store(settings: Settings) -> Probe:
    """The job store (the SQLite file, or CONCLAVE_DATABASE_URL's database with its jobs' folder) and its
    queue: what is active, each caller's line."""
    try:
        shown, summary = store_summary(settings)
    except StoreUnavailable as exc:
        detail, _, fix = str(exc).partition(": ")
        return Probe("job store", False, detail, fix)
    except Exception as exc:  # an unusable state folder or SQLite file: said, as the other checks say theirs
        return Probe(
            "job store", False, f"{type(exc).__name__}: {exc}", "check CONCLAVE_HOME (docs/deploy.md)"
        )
    return Probe("job store", True, f"{shown}; {summary.text()}; jobs' files in {settings.jobs_root}")


def _queue(settings: Settings) -> list[Probe]:
    """The job queue (CONCLAVE_QUEUE_URL): its messages, the jobs waiting for a worker, and each live
    worker (its id, host, engine, the jobs it runs)."""
    if settings.queue_url is None:
        return [
            Probe("job queue", True, "none: this process runs the jobs it admits (CONCLAVE_QUEUE_URL unset)")
        ]
    try:
        report = anyio.run(queue_report, settings)
    except (QueueUnavailable, StoreUnavailable) as exc:
        detail, _, fix = str(exc).partition(": ")
        return [Probe("job queue", False, detail, fix)]
    depth = report.depth
    detail = (
        f"Redis at {report.where}: {report.waiting_jobs} jobs waiting for a worker; {depth.waiting} messages"
        f" waiting, {depth.running} being run; {len(report.workers)} live workers"
    )
    fix = "start `conclave worker` processes with the same CONCLAVE_QUEUE_URL and CONCLAVE_DATABASE_URL"
    probes = [Probe("job queue", bool(report.workers), detail, fix)]
    for live in report.workers:
        info = live.info
        state = ", draining" if info.draining else ""
        probes.append(
            Probe(
                f"worker {info.id}",
                True,
                f"on {info.host} (pid {info.pid}), engine {info.engine}: {live.running} of {info.max_jobs}"
                f" jobs running{state}",
            )
        )
    return probes


def _state_dir(settings: Settings) -> Probe:
    try:
        settings.home.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=settings.home):
            pass
    except OSError as exc:
        return Probe(
            "state directory",
            False,
            f"{settings.home} is not writable ({exc.strerror})",
            "set CONCLAVE_HOME to a writable folder",
        )
    return Probe("state directory", True, f"{settings.home} is writable")


def _docker(settings: Settings) -> list[Probe]:
    tag = image_tag(SandboxSpec())
    status = engine_status(tag)
    endpoint = choose_endpoint(os.environ)
    if not status.available:
        fix = (
            "start the Docker engine (e.g. `dockerd &`, Docker Desktop, or Podman's "
            "`systemctl enable --now podman.socket`); teams with `sandbox: none` work without it"
        )
        detail = f"{status.error or 'unreachable'} (chosen by {endpoint.chosen_by})"
        return [Probe("docker engine", False, detail, fix, essential=False)]
    try:
        client = connect()
        try:
            facts = engine_facts(client)
        finally:
            client.close()
    except SandboxUnavailable as exc:
        return [Probe("docker engine", False, str(exc), "see the error", essential=False)]
    detail = f"{facts.name} {facts.version}, {facts.os} on {facts.arch}, chosen by {endpoint.chosen_by}"
    if facts.name in VM_ENGINES:  # workspaces are bind-mounted from the jobs' folder
        detail += f"; it sees {settings.jobs_root} only if that is in a folder it shares"
    checks = [Probe("docker engine", True, detail)]
    if status.image_present:
        checks.append(Probe("sandbox image", True, f"{tag} is present"))
    else:
        checks.append(
            Probe("sandbox image", False, f"{tag} is missing", "run `conclave sandbox build`", False)
        )
    clis = engine_status(clis_tag())
    detail = f"{clis_tag()} is {'present' if clis.image_present else 'missing'} (for cli/... members)"
    checks.append(
        Probe("CLI image", bool(clis.image_present), detail, "run `conclave sandbox build --clis`", False)
    )
    images = {"sandbox image": bool(status.image_present), "CLI image": bool(clis.image_present)}
    return [*checks, *works_here(facts, client.api.base_url, images)]


@dataclass(frozen=True)
class Feature:
    """Something jobs run on the engine, and the image it needs there (as that image's check names it).

    None needs more of an engine than its API and the folders it shares: a CLI member's way out is
    relayed over the engine's exec (sandbox/egress_channel.py), not a host socket, so an engine in a VM
    runs it as a local one does."""

    name: str
    covers: str
    image: str
    fix: str
    raw_stream: bool = False  # carried over an exec's raw stream, which TLS and SSH engines do not give


# What `doctor` reports per engine; one entry per feature, so a new one gets its line.
FEATURES: tuple[Feature, ...] = (
    Feature(
        "file work",
        "workspaces, run_command, verify and apply",
        "sandbox image",
        "run `conclave sandbox build`",
    ),
    Feature(
        "CLI members",
        "cli/... members, their egress relayed over the engine's API (no host socket)",
        "CLI image",
        "run `conclave sandbox build --clis`",
        raw_stream=True,
    ),
)
# Engines in a VM: they see this host's files only in the folders they share (virtiofs, 9p, sshfs).
VM_ENGINES = frozenset({"Docker Desktop", "OrbStack", "colima", "Rancher Desktop"})


def works_here(facts: EngineFacts, api_url: str, images: Mapping[str, bool]) -> list[Probe]:
    """What this engine runs, one line per feature: its image there, and for a relayed feature an API
    whose exec streams are plain sockets. `api_url` is docker-py's address of the engine's API."""
    # docker-py hands out an exec's raw socket over a unix socket (its address is then
    # http+docker://localhost) or plain TCP; over TLS or SSH it has no plain socket to give
    raw = api_url == "http+docker://localhost" or api_url.startswith("http://")
    probes = []
    for feature in FEATURES:
        present, detail, fix = images.get(feature.image, False), feature.covers, feature.fix
        if not present:
            detail += f": need the {feature.image}"
        elif feature.raw_stream and not raw:
            present = False
            detail = f"not over {api_url}: the relay needs the API on a unix socket or plain TCP"
            fix = "reach the engine through a local socket (an SSH tunnel, a docker context with a socket)"
        probes.append(Probe(f"{feature.name} on {facts.name}", present, detail, fix, essential=False))
    return probes


def _keys(environ: Mapping[str, str]) -> list[Probe]:
    checks = []
    for provider in PROVIDERS.values():
        variables = provider.key_variables
        if not variables:
            continue
        found = [name for name in variables if environ.get(name)]
        detail = f"{found[0]} is set" if found else f"{' or '.join(variables)} not set"
        checks.append(
            Probe(f"{provider.name} key", bool(found), detail, f"export {variables[0]}=...", essential=False)
        )
    return checks


def _local_model() -> Probe:
    try:
        check_installed()
        path = model_file(BUNDLED, None)
    except ConfigError as exc:
        return Probe("local model", False, "not available", str(exc), essential=False)
    size = os.path.getsize(path) >> 20
    return Probe("local model", True, f"llama.cpp's prebuilt server (xllamacpp) and {path.name} ({size} MB)")


def _clis(environ: Mapping[str, str]) -> list[Probe]:
    """Coding-agent CLIs as members: installed (the CLI image, pinned versions) and logged in."""
    tag = clis_tag()
    status = engine_status(tag)
    pins = ", ".join(CLI_PINS)
    detail = f"{tag} ({pins})" if status.image_present else f"{tag} is missing"
    fix = "run `conclave sandbox build --clis` for cli/ members"
    checks = [Probe("CLI image", bool(status.image_present), detail, fix, essential=False)]
    for facts in CLIS.values():
        source = login_source(facts, environ)
        user = None if source else keychain_user(facts, environ)
        detail = f"logged in ({source})" if source else "not logged in"
        detail = f"signed in as {user}, in the system keychain only" if user else detail
        fix = login_fix(facts, environ)
        checks.append(Probe(f"cli/{facts.name}", source is not None, detail, fix, essential=False))
    return checks
