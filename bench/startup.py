"""How fast Conclave is ready: cold starts of `conclave serve` and of `conclave ask`.

    serve        spawn `conclave serve` (stdio), send initialize, then notifications/initialized and
                 tools/list: milliseconds to the initialize answer and to the tools/list answer
    serve-direct the same with `--no-front` (the app answers the handshake itself once it is loaded)
    import-mcp   `python -c "import mcp"` to exit: the floor for any server built on the mcp SDK
    ask          spawn `conclave ask --json` with a one-agent team on a fake OpenAI server (the real
                 SDK over loopback HTTP): milliseconds to the fake's first request

Each is the median of --runs cold starts (20 by default), in ms and as a ratio to import-mcp. The
machine is shared, so the load average is recorded beside the numbers. Writes
bench/results/startup.json under --label (default "now"), keeping the other labels there.
Run: .venv/bin/python bench/startup.py [--runs 20] [--label now] [--only serve,ask]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.fakes: the fake provider servers

from tests.fakes.script import RecordedRequest, Reply  # noqa: E402
from tests.fakes.server import FakeProviders  # noqa: E402
from tests.fakes.team import KEY_DESTINATION, KEY_ENV, voter, write_team  # noqa: E402

CONCLAVE = str(Path(sys.executable).parent / "conclave")
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "bench", "version": "1"},
    },
}


def handshake(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(ms to the initialize answer, ms to the tools/list answer) from spawning `command`."""
    start = time.perf_counter()
    server = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
    )
    assert server.stdin is not None and server.stdout is not None
    server.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
    server.stdin.flush()
    assert json.loads(server.stdout.readline())["id"] == 0
    initialized = time.perf_counter()
    server.stdin.write(
        b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
        b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}\n'
    )
    server.stdin.flush()
    tools = json.loads(server.stdout.readline())
    listed = time.perf_counter()
    assert len(tools["result"]["tools"]) == 5, tools
    server.stdin.close()
    server.wait(timeout=60)
    return 1000 * (initialized - start), 1000 * (listed - start)


def bare(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return 1000 * (time.perf_counter() - start)


def first_call(fakes: FakeProviders, team: Path, env: dict[str, str], seen: list[float]) -> float:
    """ms from spawning `conclave ask` to the fake provider's first request."""
    seen.clear()
    start = time.perf_counter()
    subprocess.run(
        [CONCLAVE, "ask", "--json", "--team", str(team), "What is 6 * 7?"],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=120,
    )
    return 1000 * (seen[0] - start)


def median(samples: Callable[[], float], runs: int) -> dict[str, float]:
    values = [samples() for _ in range(runs)]
    return {
        "median_ms": round(statistics.median(values), 1),
        "min_ms": round(min(values), 1),
        "max_ms": round(max(values), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--label", default="now")
    parser.add_argument("--only", default="serve,serve-direct,import-mcp,ask")
    args = parser.parse_args()
    only = set(args.only.split(","))
    home = Path(tempfile.mkdtemp(prefix="conclave-bench-"))
    env = {
        **os.environ,
        "CONCLAVE_HOME": str(home / "state"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "FASTMCP_LOG_LEVEL": "WARNING",
        KEY_ENV: "bench-key",
        "CONCLAVE_KEY_DESTINATIONS": KEY_DESTINATION,  # its team file is not in the user's team folder
    }
    results: dict[str, dict[str, float]] = {}
    base = median(lambda: bare("import mcp"), args.runs)
    results["import-mcp"] = base
    for name, command in (
        ("serve", [CONCLAVE, "serve"]),
        ("serve-direct", [CONCLAVE, "serve", "--no-front"]),
    ):
        if name in only:
            pairs = [handshake(command, env) for _ in range(args.runs)]
            results[name] = {
                "initialize_median_ms": round(statistics.median(p[0] for p in pairs), 1),
                "median_ms": round(statistics.median(p[1] for p in pairs), 1),
                "min_ms": round(min(p[1] for p in pairs), 1),
                "max_ms": round(max(p[1] for p in pairs), 1),
            }
    if "ask" in only:
        seen: list[float] = []
        vote = voter()

        def reply(request: RecordedRequest) -> Reply:
            seen.append(time.perf_counter())
            return vote(request)

        with FakeProviders() as fakes:
            fakes.script.set_default("solo", reply)
            team = write_team(
                home / "solo.yaml", fakes, [("openai", "solo")], name="solo", coordination={"final": "reuse"}
            )
            results["ask"] = median(lambda: first_call(fakes, team, env, seen), args.runs)
    for row in results.values():
        row["ratio_to_import_mcp"] = round(row["median_ms"] / base["median_ms"], 2)
    print(f"{'':<14}{'median ms':>10}{'ratio':>8}{'min':>8}{'max':>8}   (load {os.getloadavg()[0]:.2f})")
    for name, row in results.items():
        print(
            f"{name:<14}{row['median_ms']:>10.0f}{row['ratio_to_import_mcp']:>8.2f}"
            f"{row['min_ms']:>8.0f}{row['max_ms']:>8.0f}"
        )
    out = ROOT / "bench" / "results" / "startup.json"
    saved = json.loads(out.read_text()) if out.exists() else {}
    saved[args.label] = {
        "runs": args.runs,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "results": results,
    }
    out.write_text(json.dumps(saved, indent=2) + "\n")


if __name__ == "__main__":
    main()
