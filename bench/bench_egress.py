"""What the egress confinement of a CLI member costs: the CLI image, container start, and the proxy hop.

    python bench/bench_egress.py          # builds the CLI image first if it is missing (a few minutes)
    python bench/bench_egress.py --build  # also times a fresh build of it (under a throwaway tag)

- Container start: a CLI member's (egress proxy up, container with its relay, `start` returning once
  the bridge listens, then stop) against a plain agent's sandbox (start, stop).
- Proxy hop: the same Anthropic Messages request to the fake server, N times in a row from one Python
  process: from inside a member's container (the relay, the engine's API, the proxy, then TCP) against
  straight from the host. Ratios are the point; the absolute numbers are this shared 2-core machine's.
"""

from __future__ import annotations

import json
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/results_file.py, the tests' fakes

from bench.request_loop import LOOP
from bench.results_file import write_results
from conclave.config.models import SandboxSpec
from conclave.sandbox.allowlist import allowlist_for
from conclave.sandbox.clis_image import CLIS_REPO, build_clis_image
from conclave.sandbox.container import Sandbox
from conclave.sandbox.egress import egress_proxy
from conclave.sandbox.engine import connect, engine_status
from conclave.sandbox.image import BuildReport, build_image
from conclave.sandbox.member import MemberSandbox
from conclave.sandbox.route import DirectRoute
from tests.fakes.script import Reply
from tests.fakes.server import FakeProviders

RESULTS = Path(__file__).parent / "results" / "egress.json"
STARTS, REQUESTS = 5, 50


async def timed_build() -> BuildReport:
    """A fresh build of the CLI image under a throwaway tag (npm's own cache warm), then removed."""
    report = await build_clis_image(f"{CLIS_REPO}-bench:{secrets.token_hex(4)}")
    connect().images.remove(report.tag)
    return report


async def measure(fresh: bool) -> dict[str, object]:
    plain_build = await build_image()
    build = await build_clis_image()
    fresh_build = await timed_build() if fresh else None
    client = connect()
    plain, member, inside, direct = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp, FakeProviders() as fakes:
        fakes.script.set_default("A", Reply(text="ok"))
        url = fakes.base_url("anthropic", "A") + "/v1/messages"
        workspace, job = Path(tmp, "workspace"), Path(tmp, "job")
        workspace.mkdir()
        job.mkdir(mode=0o700)
        (workspace / "loop.py").write_text(LOOP)
        allow = allowlist_for("claude-code", base_url=url)
        for _ in range(STARTS):
            box = Sandbox(client)
            started = time.perf_counter()
            await box.start(workspace, {}, "cj-bench", "A", SandboxSpec())
            await box.stop()
            plain.append(time.perf_counter() - started)
            started = time.perf_counter()
            async with egress_proxy(allow, route=DirectRoute()) as proxy:
                box = MemberSandbox(client, egress=proxy)
                await box.start(workspace, {}, "cj-bench", "A", SandboxSpec())
                await box.stop()
            member.append(time.perf_counter() - started)
        async with egress_proxy(allow, route=DirectRoute()) as proxy:
            box = MemberSandbox(client, egress=proxy)
            try:
                await box.start(workspace, {}, "cj-bench", "A", SandboxSpec())
                result = await box.exec(f"python3 loop.py {url} {REQUESTS}", timeout_s=300)
                inside = json.loads(result.stdout)
            finally:
                await box.stop()
        host = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                [sys.executable, str(workspace / "loop.py"), url, str(REQUESTS)],
                capture_output=True,
                text=True,
                check=True,
                env={"PATH": "/usr/bin:/bin", "NO_PROXY": "*"},
            )
        )
        direct = json.loads(host.stdout)
    hop = statistics.median(inside) - statistics.median(direct)
    return {
        "engine": engine_status().version,
        "machine": platform.machine(),
        "plain_image": plain_build.tag,
        "plain_image_mb": round(plain_build.size_bytes / 1e6, 1),
        "clis_image": build.tag,
        "clis_image_mb": round(build.size_bytes / 1e6, 1),
        "clis_image_build_s": round(fresh_build.seconds, 1) if fresh_build else None,
        "clis_over_plain_image_size": round(build.size_bytes / max(plain_build.size_bytes, 1), 1),
        "plain_start_stop_s_median": round(statistics.median(plain), 3),
        "member_start_stop_s_median": round(statistics.median(member), 3),
        "member_over_plain_start": round(statistics.median(member) / statistics.median(plain), 2),
        "request_ms_p50_direct": round(statistics.median(direct), 2),
        "request_ms_p50_through_proxy": round(statistics.median(inside), 2),
        "request_ms_p90_through_proxy": round(statistics.quantiles(inside, n=10)[-1], 2),
        "proxy_hop_ms_p50": round(hop, 2),
        "proxy_over_direct_request": round(statistics.median(inside) / statistics.median(direct), 2),
    }


def main() -> None:
    if not engine_status().available:
        raise SystemExit(f"no Docker engine: {engine_status().error}")
    results = anyio.run(measure, "--build" in sys.argv)
    write_results(RESULTS, results, table=True)


if __name__ == "__main__":
    main()
