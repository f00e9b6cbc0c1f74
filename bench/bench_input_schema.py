"""Benchmark (not a test): what a get_status call over streamable HTTP costs the front when the MCP
transport finds the called tool's input schema by a whole tools/list (FastMCP's own path) rather than
by a lookup the app installs on FastMCP's private low-level server.

    python bench/bench_input_schema.py [--calls 300] [--out bench/results/input-schema.json]

The transport checks a call's Mcp-Param-* headers against the tool's input schema; with no
`get_tool_input_schema` on the low-level server it runs the tools/list handler for every tools/call
that has arguments. One in-process front (create_app behind ServerTiming, as `serve --http` serves it)
answers `--calls` get_status calls after 30 warm-up calls, once per way, alternating in rounds so both
see the same machine; the front's own time per call is its Server-Timing header, and the process CPU
(client and front together) per call is process_time over the calls. The bench sets the private
attribute itself for the "lookup" way: the app does not (app/server.py says why). A third way, "cached",
answers the listing from FastMCP's public middleware hook (`on_list_tools`, the first listing kept): it
shows what a public hook can win back (the listing's own work, not its dispatch).
"""

from __future__ import annotations

import argparse
import logging
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import uvicorn
from fastmcp import Client, FastMCP
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools import Tool

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.results_file import write_results
from bench.submitting import open_service
from conclave.app.server import create_app
from conclave.app.server_timing import ServerTiming
from conclave.settings import Settings
from tests.fakes.server import free_port

RESULTS = Path(__file__).parent / "results" / "input-schema.json"
SERVER_TIMING = re.compile(r"\bapp;dur=([0-9.]+)")
WARMUP, ROUNDS = 30, 5
JOB_ID = "cj-0123456789ab"  # unknown: the call still walks the transport, the tool and one store read


class CachedListing(Middleware):
    """Answers tools/list from the first listing (the tools never change after create_app)."""

    def __init__(self) -> None:
        self.tools: Any = None

    async def on_list_tools(self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]) -> Any:
        if self.tools is None:
            self.tools = await call_next(context)
        return self.tools


async def schemas(app: FastMCP) -> dict[str, dict[str, Any]]:
    tools: list[Tool] = list(await app.list_tools())
    return {tool.name: tool.parameters for tool in tools}


async def calls(url: str, count: int) -> tuple[list[float], float]:
    """The front's time of each of `count` get_status calls (ms), and the process CPU per call (ms)."""
    front: list[float] = []

    async def kept(response: httpx2.Response) -> None:
        found = SERVER_TIMING.search(response.headers.get("server-timing", ""))
        if found and b'"method":"tools/call"' in response.request.content:
            front.append(float(found.group(1)))

    def factory(**options: Any) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(**options, event_hooks={"response": [kept]})

    async with Client(StreamableHttpTransport(url, httpx_client_factory=factory)) as client:
        for _ in range(WARMUP):
            await client.call_tool_mcp("get_status", {"job_id": JOB_ID})
        front.clear()
        began = time.process_time()
        for _ in range(count):
            await client.call_tool_mcp("get_status", {"job_id": JOB_ID})
        cpu = (time.process_time() - began) * 1000 / count
    return front, cpu


async def run(count: int) -> dict[str, Any]:
    front: dict[str, list[float]] = {"listing": [], "cached": [], "lookup": []}
    cpu: dict[str, list[float]] = {"listing": [], "cached": [], "lookup": []}
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(home=Path(tmp) / "home")
        async with open_service(settings, {}) as service:
            for _ in range(ROUNDS):
                for way in ("listing", "cached", "lookup"):
                    app = create_app(service, settings)
                    lookup = (await schemas(app)).get if way == "lookup" else None
                    app._mcp_server.get_tool_input_schema = lookup
                    if way == "cached":
                        app.add_middleware(CachedListing())
                    port = free_port()
                    config = uvicorn.Config(
                        ServerTiming(app.http_app(path="/mcp")),
                        host="127.0.0.1",
                        port=port,
                        log_level="warning",
                    )
                    server = uvicorn.Server(config)
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(server.serve)
                        while not server.started:
                            await anyio.sleep(0.02)
                        try:
                            timed, per_call = await calls(f"http://127.0.0.1:{port}/mcp", count // ROUNDS)
                        finally:
                            server.should_exit = True
                    front[way] += timed
                    cpu[way].append(per_call)
    result: dict[str, Any] = {
        "machine": platform.machine(),
        "python": platform.python_version(),
        "calls": count,
    }
    for way in ("listing", "cached", "lookup"):
        result[f"{way}_front_p50_ms"] = round(statistics.median(front[way]), 3)
        result[f"{way}_cpu_per_call_ms"] = round(statistics.median(cpu[way]), 3)
    result["front_ratio_listing_to_lookup"] = round(
        result["listing_front_p50_ms"] / result["lookup_front_p50_ms"], 3
    )
    result["cpu_ratio_listing_to_lookup"] = round(
        result["listing_cpu_per_call_ms"] / result["lookup_cpu_per_call_ms"], 3
    )
    result["front_extra_ms"] = round(result["listing_front_p50_ms"] - result["lookup_front_p50_ms"], 3)
    return result


def main() -> None:
    logging.getLogger("fastmcp").setLevel(logging.CRITICAL)  # each call's "job not found", by design
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    write_results(args.out, anyio.run(run, args.calls))


if __name__ == "__main__":
    main()
