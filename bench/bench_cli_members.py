"""The time a coding-agent CLI member adds per turn, against an API member on the same fake model.

    python bench/bench_cli_members.py      # needs Docker and the CLI image (`conclave sandbox build --clis`)

Both answer one short prompt with the fake's immediate text reply (no tool use), so what is measured is
the overhead, not a model's work:
- API member: one call through the backend (the provider SDK over HTTP to the fake).
- CLI member: one run as a turn makes it (`CliMember.run`: a `docker exec` in its warm member container,
  the CLI's start, its requests through the egress proxy to the same fake).
- Once per job per member: the member container's start (with its proxy and relay) and stop.
- The CLI's own start: `claude --version` / `codex --version` through the same exec.
Prints a table and writes bench/results/cli-members.json (medians, and ratios CLI / API).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from conclave.backends import create_backend
from conclave.backends.base import Endpoint, Message, Request
from conclave.backends.retry import complete
from conclave.clis.member import CliMember
from conclave.config.loading import parse_team
from conclave.config.models import SandboxSpec
from conclave.sandbox.allowlist import allowlist_for
from conclave.sandbox.clis_image import clis_tag
from conclave.sandbox.egress import egress_proxy
from conclave.sandbox.engine import engine_status
from conclave.sandbox.member import MemberSandbox
from conclave.sandbox.route import DirectRoute

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' fakes
from tests.fakes.script import Reply
from tests.fakes.server import FakeProviders

RESULTS = Path(__file__).parent / "results" / "cli-members.json"
RUNS, STARTS = 5, 3
PROMPT = "What is 6 * 7? Reply with the number."
PAIRS = {
    "claude-code": ("anthropic", "anthropic"),
    "codex": ("responses", "openai"),
}  # CLI wire, API provider


async def timed(runs: int, step: Callable[[], Awaitable[object]]) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        await step()
        times.append(time.perf_counter() - started)
    return times


async def measure_cli(fakes: FakeProviders, cli: str, root: Path) -> dict[str, float]:
    wire, api = PAIRS[cli]
    fakes.script.set_default(f"cli-{cli}", Reply(text="42")).set_default(f"api-{cli}", Reply(text="42"))
    url = fakes.base_url(wire, f"cli-{cli}")
    spec = parse_team(
        {"agents": [{"model": f"cli/{cli}", "base_url": url, "api_key_env": "K"}]}, "bench"
    ).agents[0]
    member = CliMember.for_spec(spec, {"K": "bench-key-0123456789"})
    workspace = root / cli
    workspace.mkdir()
    async with egress_proxy(allowlist_for(cli, base_url=url), route=DirectRoute()) as proxy:  # type: ignore[arg-type]

        async def start_stop() -> None:
            box = MemberSandbox(None, egress=proxy)
            await box.start(workspace, {}, "cj-benchclimember", "A", SandboxSpec())
            await box.stop()

        starts = await timed(STARTS, start_stop)
        box = MemberSandbox(None, egress=proxy)
        await box.start(workspace, {}, "cj-benchclimember", "A", SandboxSpec())
        try:
            member.bind(box)
            binary = member.adapter.facts.program
            exec_true = await timed(RUNS, lambda: box.exec("true", 30))
            version = await timed(RUNS, lambda: box.exec(f"{binary} --version", 60))
            await member.run(PROMPT)  # a first run writes its HOME; the turns after it are measured
            runs = await timed(RUNS, lambda: member.run(PROMPT))
        finally:
            await box.stop()
    backend = create_backend(
        Endpoint(provider=api, model="fake", api_key="bench-key", base_url=fakes.base_url(api, f"api-{cli}"))
    )
    request = Request(system="", messages=(Message("user", PROMPT),), max_tokens=64)
    api_calls = await timed(RUNS, lambda: complete(backend, request))
    await backend.aclose()
    median = statistics.median
    return {
        "member_container_start_stop_s": round(median(starts), 3),
        "exec_true_s": round(median(exec_true), 3),
        "cli_version_s": round(median(version), 3),
        "cli_turn_s": round(median(runs), 3),
        "api_turn_s": round(median(api_calls), 3),
        "cli_over_api_turn": round(median(runs) / median(api_calls), 1),
        "cli_turn_minus_api_turn_s": round(median(runs) - median(api_calls), 3),
    }


async def measure() -> dict[str, object]:
    tag = clis_tag()
    status = engine_status(tag)
    if not status.image_present:
        raise SystemExit(
            f"the CLI image {tag} is missing: run `conclave sandbox build --clis` ({status.error})"
        )
    load_before = os.getloadavg()
    with FakeProviders() as fakes, tempfile.TemporaryDirectory() as tmp:
        results = {cli: await measure_cli(fakes, cli, Path(tmp)) for cli in PAIRS}
    return {
        "load_average_1_5_15": {"before": list(load_before), "after": list(os.getloadavg())},
        "machine": platform.machine(),
        "engine": status.version,
        "clis_image": tag,
        "runs": RUNS,
        **results,
        "note": "medians on the shared 2-core machine while other engineers' builds and tests ran; the fake "
        "answers at once, so a turn here is pure overhead (exec, CLI start, its own system prompt "
        "of ~12-14k tokens sent through the egress proxy). API turns: the Anthropic SDK for Claude "
        "Code's pair, Chat Completions for Codex's (Conclave has no Responses backend). A CLI run is "
        "charged as its output arrives (clis/meter.py): the CLI turn includes that reading.",
    }


def main() -> None:
    results = anyio.run(measure)
    for cli in PAIRS:
        row = results[cli]
        assert isinstance(row, dict)
        print(f"{cli:12} " + "  ".join(f"{key}={value}" for key, value in row.items()))
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
