"""A job's sandbox overhead on each lane, as ratios to today's code on the local engine (issue 29's goal:
at most 1.3x), all measured in one run.

    python bench/bench_lanes.py [--baseline REF] [--start START] [--rounds N] [--lanes local,podman,...]

The lanes (each skipped, and said so, when its engine does not answer):
- local: the engine chosen as usual (this machine's dockerd on its unix socket);
- podman: Podman 4.3 through its Docker API socket (.ci/test-env.sh starts it);
- shared-nothing: the second dockerd of .ci/shared-nothing-engine.sh, API over TCP, folders through bindfs
  (the run's temporary folders live in its shared folder, as its tests' do).
The baseline, "today's local engine", is the code at REF (default 79cd6b7, before issue 29: a member's
proxy on a unix socket bind-mounted into its container) on the local engine; the code at START (default
4550119, this branch's start: the relay over the engine's API) runs there too, and this checkout on every
lane. Each measurement runs in a child process (bench/bench_checks.py's way of importing an exported
tree), the children alternating, `--rounds` times, so the machine's load hits all alike. Per child,
against the real engine and the fake providers:
- start: a plain sandbox's `start` (container up, its command runner ready) and its `stop`;
- copy in: `Workspaces.prepare` and `create` of a 1,000-file project (the agent's working copy);
- command: one `run_command` in the agent's container that edits 10 files (through the lane's file sharing);
- snapshot: `Workspaces.snapshot` after it; copy out: `finalize` and `diffs`;
- one check: `Verifier.run` of `true` on the answer, the job's check container warmed ahead;
- a CLI member's egress start: its proxy, `MemberSandbox.start` until the relay listens, and its stop;
- one proxied request: an Anthropic Messages request from inside the member, through the relay and the
  proxy to the fake on the host, each on a new connection (20 a round).
Each figure is the median of its samples over all rounds; `job_overhead_s` sums start, copy in, one
command, snapshot, copy out and one check, the steps the issue lists for a job.
Ratios are the point; the absolute numbers are this shared 2-core machine's, and noisy.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_checks import PACKAGES, _Tree, job_folder  # noqa: E402
from bench.request_loop import LOOP  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "sandbox-lanes.json"
LANES = {
    "local": (None, None),
    "podman": ("unix:///tmp/podman-lane/podman.sock", None),
    "shared-nothing": ("tcp://127.0.0.1:7500", "/tmp/egress-shared/tmp"),
}
FILES, CHANGED, STARTS, COMMANDS, CHECKS, REQUESTS = 1000, 10, 4, 4, 4, 20
GOAL = 1.3
# The keys of a child's result, each a list of samples; the job's overhead is the sum of the first six
STEPS = (
    "start_s",
    "copy_in_s",
    "command_ms",
    "snapshot_s",
    "copy_out_s",
    "check_s",
    "stop_s",
    "egress_start_s",
    "egress_stop_s",
    "request_ms",
)


def _project(folder: Path) -> list[str]:
    names = []
    for i in range(FILES):
        rel = f"pkg{i % 10}/mod{i % 7}/file{i}.py"
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text("".join(f"def f{i}_{n}(x):\n    return x + {n}\n" for n in range(20)))
        names.append(rel)
    return names


async def _timed(step: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    value = await step
    return time.perf_counter() - started, value


async def job_round() -> dict[str, list[float]]:
    """One job's sandbox steps on the tree this child imported, on the engine DOCKER_HOST names."""
    import anyio

    from conclave.config.models import SandboxSpec
    from conclave.coordination.verification import Verifier
    from conclave.files.contexts import ContextPath
    from conclave.files.workspaces import Workspaces
    from conclave.sandbox.container import Sandbox, container_user
    from conclave.sandbox.engine import connect

    client, found = connect(), dict[str, list[float]]()
    starts, stops = [], []
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp, "proj")
        project.mkdir()
        names = await anyio.to_thread.run_sync(_project, project)
        for _ in range(STARTS):
            sandbox = Sandbox(client)
            seconds, _ = await _timed(sandbox.start(Path(tmp), {}, "cj-bench", "A", SandboxSpec()))
            starts.append(seconds)
            seconds, _ = await _timed(sandbox.stop())
            stops.append(seconds)
        workspaces = Workspaces(job_folder(Path(tmp), "job"), agent_owner=container_user())
        started = time.perf_counter()
        await workspaces.prepare([ContextPath(path=str(project), permission="write")])
        agent = (await workspaces.create(["A"]))["A"]
        found["copy_in_s"] = [time.perf_counter() - started]
        sandbox = Sandbox(client)
        try:
            await sandbox.start(agent, {}, "cj-bench", "A", SandboxSpec())
            edits = " ".join(f"proj/{rel}" for rel in names[:: FILES // CHANGED][:CHANGED])
            command = f"for f in {edits}; do echo '# changed' >> $f; done"
            found["command_ms"] = []
            for _ in range(COMMANDS):
                seconds, result = await _timed(sandbox.exec(command, timeout_s=60))
                assert result.exit_code == 0, result.as_text()
                found["command_ms"].append(seconds * 1000)
        finally:
            await sandbox.stop()
        found["snapshot_s"] = [(await _timed(workspaces.snapshot("A", "A1")))[0]]
        started = time.perf_counter()
        await workspaces.finalize("A1")
        patches = await workspaces.diffs()
        found["copy_out_s"] = [time.perf_counter() - started]
        assert len(patches["proj"].files) == CHANGED, patches["proj"].files
        verifier = Verifier(
            "cj-bench", "true", workspaces, SandboxSpec(), timeout_s=60, limiter=anyio.CapacityLimiter(1)
        )
        checks = []
        try:
            await verifier.warm()
            for _ in range(CHECKS):
                seconds, run = await _timed(verifier.run("A1"))
                assert run.check.passed, run.output
                checks.append(seconds)
        finally:
            await verifier.close()
    found.update(start_s=starts, stop_s=stops, check_s=checks)
    return {**found, **await _member_round()}


async def _member_round() -> dict[str, list[float]]:
    """A CLI member's egress: its start until the relay listens, its stop, and requests through it."""
    from conclave.config.models import SandboxSpec
    from conclave.sandbox.allowlist import allowlist_for
    from conclave.sandbox.egress import egress_proxy
    from conclave.sandbox.engine import connect
    from conclave.sandbox.member import MemberSandbox
    from tests.fakes.script import Reply
    from tests.fakes.server import FakeProviders

    client, starts, stops = connect(), [], []
    with tempfile.TemporaryDirectory() as tmp, FakeProviders() as fakes:
        fakes.script.set_default("A", Reply(text="ok"))
        url = fakes.base_url("anthropic", "A") + "/v1/messages"
        workspace = Path(tmp, "workspace")
        workspace.mkdir()
        (workspace / "loop.py").write_text(LOOP)
        allow = allowlist_for("claude-code", base_url=url)
        takes_socket = "socket" in inspect.signature(egress_proxy).parameters  # before issue 29's relay
        # a route is named from the jobs' environment on (the trees before it default one)
        routed = _direct_route() if "route" in inspect.signature(egress_proxy).parameters else {}

        def proxy_for() -> Any:
            return egress_proxy(Path(tmp, "A.sock"), allow) if takes_socket else egress_proxy(allow, **routed)

        for _ in range(STARTS):
            async with proxy_for() as proxy:
                box = MemberSandbox(client, egress=proxy)
                seconds, _ = await _timed(box.start(workspace, {}, "cj-bench", "A", SandboxSpec()))
                starts.append(seconds)
                seconds, _ = await _timed(box.stop())
                stops.append(seconds)
        async with proxy_for() as proxy:
            box = MemberSandbox(client, egress=proxy)
            try:
                await box.start(workspace, {}, "cj-bench", "A", SandboxSpec())
                result = await box.exec(f"python3 loop.py {url} {REQUESTS}", timeout_s=300)
                assert result.exit_code == 0, result.as_text()[-2000:]
                requests = json.loads(result.stdout)
            finally:
                await box.stop()
    return {"egress_start_s": starts, "egress_stop_s": stops, "request_ms": requests}


def child(tree: Path) -> None:
    import anyio

    sys.meta_path.insert(0, _Tree(tree))
    print(json.dumps(anyio.run(job_round)))


def run_child(tree: Path, host: str | None, tmpdir: str | None) -> dict[str, Any] | str:
    environment = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    environment.pop("DOCKER_CONTEXT", None)
    if host is not None:
        environment["DOCKER_HOST"] = host
    if tmpdir is not None:
        Path(tmpdir).mkdir(parents=True, exist_ok=True)
        environment["TMPDIR"] = tmpdir
    done = subprocess.run(
        [sys.executable, __file__, "--child", "--tree", str(tree)],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
        env=environment,
    )
    if done.returncode != 0:
        return (done.stderr or done.stdout)[-800:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _answers(host: str | None) -> str | None:
    """None when the lane's engine answers, else why not."""
    import docker

    try:
        (docker.DockerClient(base_url=host, timeout=10) if host else docker.from_env(timeout=10)).ping()
    except docker.errors.DockerException as exc:
        return str(exc)
    return None


def _medians(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """Each step's median over every sample of every round, and the job's overhead: the sum of the
    medians of start, copy in, one command, snapshot, copy out and one check."""
    found = {step: round(statistics.median(x for r in rounds for x in r[step]), 4) for step in STEPS}
    job = sum(found[step] / (1000 if step.endswith("_ms") else 1) for step in STEPS[:6])
    return {**found, "job_overhead_s": round(job, 4)}


def _dump(result: dict[str, Any]) -> str:
    """JSON with two-space indents, each list of numbers on one line (the samples)."""
    text = json.dumps(result, indent=2)
    return re.sub(r"\[\s+([-0-9.e,\s]+?)\s+\]", lambda m: "[" + " ".join(m[1].split()) + "]", text) + "\n"


def _export(ref: str, folder: Path) -> Path:
    """The code at `ref` (its packages only) in `folder`."""
    archive = subprocess.run(
        ["git", "archive", ref, *sorted(set(PACKAGES.values()))], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def _direct_route() -> dict[str, object]:
    from conclave.sandbox.route import DirectRoute

    return {"route": DirectRoute()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", default="79cd6b7", help="today's code, run on the local engine")
    parser.add_argument("--start", default="4550119", help="this branch's start, on the local engine too")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lanes", default=",".join(LANES))
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--tree")
    args = parser.parse_args()
    if args.child:
        child(Path(args.tree))
        return
    lanes = {name: LANES[name] for name in args.lanes.split(",")}
    missing = {name: why for name, (host, _) in lanes.items() if (why := _answers(host)) is not None}
    for name, why in missing.items():
        print(f"lane {name} skipped: its engine does not answer ({why})", flush=True)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [
            ("baseline", _export(args.baseline, Path(tmp, "baseline")), None, None),
            (f"local at {args.start}", _export(args.start, Path(tmp, "start")), None, None),
            *((name, ROOT, *lanes[name]) for name in lanes if name not in missing),
        ]
        found: dict[str, list[Any]] = {name: [] for name, *_ in runs}
        for index in range(args.rounds):
            for name, tree, host, tmpdir in runs if index % 2 == 0 else runs[::-1]:
                found[name].append(run_child(tree, host, tmpdir))
                print(name, str(found[name][-1])[:400], flush=True)
    result: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "baseline": f"{args.baseline} on the local engine: the code before issue 29 (the member's proxy on a "
        "unix socket bind-mounted into its container)",
        "this_branch": "local, podman, shared-nothing",
        "rounds": args.rounds,
        "steps": {"files": FILES, "changed": CHANGED, "requests": REQUESTS},
        "skipped": missing,
        "medians": {},
        "failed": {},
    }
    result["samples"] = {}
    for name, rounds in found.items():
        ok = [r for r in rounds if isinstance(r, dict)]
        if ok:
            result["medians"][name] = _medians(ok)
            result["samples"][name] = {step: [round(x, 4) for r in ok for x in r[step]] for step in STEPS}
        if len(ok) < len(rounds):
            result["failed"][name] = next(r for r in rounds if not isinstance(r, dict))
    base = result["medians"].get("baseline")
    if base:
        result["to_baseline"] = {
            name: {step: round(values[step] / base[step], 2) for step in values if base[step]}
            for name, values in result["medians"].items()
            if name != "baseline"
        }
        result["over_goal"] = {
            name: [step for step, ratio in ratios.items() if ratio > GOAL]
            for name, ratios in result["to_baseline"].items()
        }
    result["load_average_1_5_15"] = {"at_start": load, "at_end": os.getloadavg()}
    result["samples"] = result.pop("samples")  # last: the long lists
    args.out.write_text(_dump(result))
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=2))


if __name__ == "__main__":
    main()
