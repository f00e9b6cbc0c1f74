"""A CLI member's way out, before and after issue 29, on the engine DOCKER_HOST names (measured together).

    python bench/bench_egress_path.py [--before REF] [--out FILE]
    DOCKER_HOST=tcp://127.0.0.1:7500 TMPDIR=/tmp/egress-shared/tmp python bench/bench_egress_path.py \
        --out bench/results/egress-path-shared-nothing.json    # the lane of .ci/shared-nothing-engine.sh

Before (REF, default 79cd6b7): the proxy's unix socket bind-mounted into the member, socat re-listening
on 127.0.0.1:3128. After (this checkout): the keeper's relay on 127.0.0.1:3128 carrying each connection
over one exec's stdin and stdout, through the engine's API (sandbox/egress_channel.py). Each tree runs in a
child process (bench/bench_checks.py's way of importing an exported tree), alternately, `ROUNDS` times:
- a member's start and stop (its proxy up, the container, `start` returning once 3128 listens);
- `REQUESTS` Anthropic Messages requests in a row from one Python process inside the member, each on a
  new connection through the proxy to the fake server on the host, and the same from the host directly;
- one 8 MB response through the proxy (throughput, where the relay's windows show).
On an engine where the socket cannot cross (the shared-nothing lane) the before side fails, and says so.
Ratios are the point; the absolute numbers are this shared 2-core machine's, and noisy.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
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

from bench.bench_checks import PACKAGES, _Tree  # noqa: E402
from bench.request_loop import TIMED  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "egress-path.json"
ROUNDS, STARTS, REQUESTS, BIG = 3, 3, 30, 8 * 1024 * 1024
# bench/request_loop.py's requests, then one big response (argv[3] is its url)
LOOP = (
    TIMED
    + r"""
big = sys.argv[3]
started = time.perf_counter()
with urllib.request.urlopen(big, timeout=120) as r:
    size = len(r.read())
print(json.dumps({"ms": times[1:], "big_s": time.perf_counter() - started, "big_bytes": size}))
"""
)


async def member_round() -> dict[str, Any]:
    """One round on the tree this child imported: starts, then requests from inside and from the host."""
    import http.server
    import threading

    import anyio
    import anyio.to_thread

    from conclave.config.models import SandboxSpec
    from conclave.sandbox.allowlist import allowlist_for
    from conclave.sandbox.egress import egress_proxy
    from conclave.sandbox.engine import connect
    from conclave.sandbox.member import MemberSandbox
    from tests.fakes.script import Reply
    from tests.fakes.server import FakeProviders

    class Big(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(BIG))
            self.end_headers()
            self.wfile.write(b"x" * BIG)

        def log_message(self, *args: object) -> None:
            pass

    big = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Big)
    threading.Thread(target=big.serve_forever, daemon=True).start()
    big_url = f"http://127.0.0.1:{big.server_address[1]}/big"
    client, starts = connect(), []
    takes_socket = "socket" in inspect.signature(egress_proxy).parameters  # the before tree's proxy
    # a route is named from the jobs' environment on (the trees before it default one)
    routed = _direct_route() if "route" in inspect.signature(egress_proxy).parameters else {}
    with tempfile.TemporaryDirectory() as tmp, FakeProviders() as fakes:
        fakes.script.set_default("A", Reply(text="ok"))
        url = fakes.base_url("anthropic", "A") + "/v1/messages"
        workspace, job = Path(tmp, "workspace"), Path(tmp, "job")
        workspace.mkdir()
        job.mkdir(mode=0o700)
        (workspace / "loop.py").write_text(LOOP)
        allow = allowlist_for("claude-code", base_url=url, extra=[f"127.0.0.1:{big.server_address[1]}"])

        def proxy() -> Any:
            return egress_proxy(job / "A.sock", allow) if takes_socket else egress_proxy(allow, **routed)

        for _ in range(STARTS):
            started = time.perf_counter()
            async with proxy() as served:
                box = MemberSandbox(client, egress=served)
                await box.start(workspace, {}, "cj-bench", "A", SandboxSpec())
                await box.stop()
            starts.append(time.perf_counter() - started)
        async with proxy() as served:
            box = MemberSandbox(client, egress=served)
            try:
                await box.start(workspace, {}, "cj-bench", "A", SandboxSpec())
                result = await box.exec(f"python3 loop.py {url} {REQUESTS} {big_url}", timeout_s=300)
                if result.exit_code != 0:
                    raise SystemExit(f"the requests from inside failed: {result.as_text()[-2000:]}")
                inside = json.loads(result.stdout)
            finally:
                await box.stop()
        host = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                [sys.executable, str(workspace / "loop.py"), url, str(REQUESTS), big_url],
                capture_output=True,
                text=True,
                check=True,
                env={"PATH": "/usr/bin:/bin", "NO_PROXY": "*"},
            )
        )
        direct = json.loads(host.stdout)
    big.shutdown()
    return {
        "start_stop_s": starts,
        "request_ms_inside": inside["ms"],
        "request_ms_direct": direct["ms"],
        "big_mb_per_s_inside": BIG / 2**20 / inside["big_s"],
        "big_mb_per_s_direct": BIG / 2**20 / direct["big_s"],
    }


def child(tree: Path) -> None:
    import anyio

    sys.meta_path.insert(0, _Tree(tree))
    print(json.dumps(anyio.run(member_round)))


def run_child(tree: Path) -> dict[str, Any] | str:
    done = subprocess.run(
        [sys.executable, __file__, "--child", "--tree", str(tree)],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    if done.returncode != 0:
        return (done.stderr or done.stdout)[-600:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    starts = [s for r in rounds for s in r["start_stop_s"]]
    inside = [s for r in rounds for s in r["request_ms_inside"]]
    direct = [s for r in rounds for s in r["request_ms_direct"]]
    return {
        "start_stop_s_median": round(statistics.median(starts), 3),
        "request_ms_p50_inside": round(statistics.median(inside), 2),
        "request_ms_p90_inside": round(statistics.quantiles(inside, n=10)[-1], 2),
        "request_ms_p50_direct": round(statistics.median(direct), 2),
        "proxy_hop_ms_p50": round(statistics.median(inside) - statistics.median(direct), 2),
        "big_mb_per_s_inside_median": round(statistics.median(r["big_mb_per_s_inside"] for r in rounds), 1),
        "big_mb_per_s_direct_median": round(statistics.median(r["big_mb_per_s_direct"] for r in rounds), 1),
    }


def _direct_route() -> dict[str, object]:
    from conclave.sandbox.route import DirectRoute

    return {"route": DirectRoute()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", default="79cd6b7")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--tree")
    args = parser.parse_args()
    if args.child:
        child(Path(args.tree))
        return
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "archive", args.before, *sorted(set(PACKAGES.values())), "tests", "bench"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        found: dict[str, list[Any]] = {"before": [], "after": []}
        load = os.getloadavg()
        for _ in range(ROUNDS):
            for name, tree in (("before", Path(tmp)), ("after", ROOT)):
                found[name].append(run_child(tree))
                print(name, str(found[name][-1])[:300], flush=True)
    result: dict[str, Any] = {
        "engine": os.environ.get("DOCKER_HOST", "the local engine (unix socket)"),
        "before": args.before,
        "after": "this branch",
    }
    for name, rounds in found.items():
        ok = [r for r in rounds if isinstance(r, dict)]
        result[name] = summary(ok) if ok else {"failed": rounds[0]}
    before, after = result["before"], result["after"]
    if "failed" not in before and "failed" not in after:
        result["after_to_before"] = {
            key: round(after[key] / before[key], 2) for key in after if before.get(key)
        }
    result["load_average_1_5_15"] = {"at_start": load, "at_end": os.getloadavg()}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
