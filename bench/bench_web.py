"""Benchmark (not a test): the web view in a real headless Chromium, against `conclave web`.

    python bench/bench_web.py [--loads 20] [--events 40] [--out bench/results/web.json]

- page load: from navigation start to the first render of a job's page (the `conclave:first-render`
  mark app.js sets once the first snapshot from the event stream is on screen), for a job of three agents
  with three answers of about 1.5 KB each, 40 votes and a 60 KB diff; median and p90 of `--loads` loads.
- event to screen: this process writes one event to the shared store (as any server process does) and
  the page, loaded once, is watched by a MutationObserver for the event's line on the timeline; the delay
  is the observer's wall-clock time minus the write's. The stream looks at the store every POLL_S
  seconds (server/web/routes.py), so the expected delay is about half of that plus the render; the
  ratio to POLL_S is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests helpers: web_server, chromium

from bench.submitting import store_job
from conclave.coordination.reports import AgentProgress, AnswerEvent, Progress, VoteEvent
from conclave.jobs.derived import ContextChanges, FilesResult, JobOptions
from conclave.jobs.store.sql import Store
from conclave.web.routes import POLL_S
from tests.fakes.processes import web_server
from tests.web_browser import chromium, missing, until

RESULTS = Path(__file__).parent / "results" / "web.json"
JOB = "cj-0000000000be"
LETTERS = "ABC"


def progress() -> Progress:
    agents = [AgentProgress(letter=x, model=f"openai/model-{x.lower()}", state="working") for x in LETTERS]
    return Progress(phase="voting", agents=agents)


def build_job(home: Path) -> Store:
    store = Store(home / "conclave.db")
    options = JobOptions.model_validate({"context_paths": [{"path": str(home), "permission": "read"}]})
    store_job(store, JOB, "Fix the parser and explain the bug.", options)
    store.set_state(JOB, "running", "voting")
    at = 0.0
    for revision in (1, 2, 3):
        for letter in LETTERS:
            at += 1
            content = f"Answer {letter}{revision}: " + "the parser drops the last token. " * 45
            store.record(
                JOB,
                AnswerEvent(
                    letter=letter, at=at, label=f"{letter}{revision}", revision=revision, content=content
                ),
                progress(),
                None,
            )
    for n in range(40):
        voter = LETTERS[n % 3]
        store.record(
            JOB,
            VoteEvent(letter=voter, at=at + n, label="A3", reason=f"r{n}"),
            progress(),
            None,
        )
    patch = home / "jobs" / JOB / "diff.patch"
    patch.parent.mkdir(parents=True, exist_ok=True)
    patch.write_text(
        "diff --git a/p.py b/p.py\n--- a/p.py\n+++ b/p.py\n@@ -1,400 +1,400 @@\n"
        + "".join(f"-old line {i}\n+new line {i}\n" for i in range(2000))
    )
    store.set_files(JOB, FilesResult(contexts=[ContextChanges(name="p", path=str(home), permission="read")]))
    return store


WATCH = """
window.__seen = {};
new MutationObserver(() => {
  for (const li of document.querySelectorAll('#timeline li')) {
    const m = /bench-(\\d+)/.exec(li.textContent);
    if (m && !(m[1] in window.__seen)) window.__seen[m[1]] = performance.timeOrigin + performance.now();
  }
}).observe(document.getElementById('timeline'), {childList: true, subtree: true, characterData: true});
"""


def measure(loads: int, events: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        store = build_job(home)
        process, login = web_server(home)
        try:
            with chromium() as driver:
                driver.get(f"{login}&next=/jobs/{JOB}")  # a one-time link: confirmed on the page
                until(driver, lambda d: d.find_element("id", "confirm").is_displayed(), 60)
                driver.find_element("id", "confirm-button").click()
                until(driver, lambda d: d.current_url.endswith(f"/jobs/{JOB}"), 60)
                first: list[float] = []
                for _ in range(loads):
                    driver.get(driver.current_url)
                    until(
                        driver,
                        lambda d: d.execute_script(
                            "return performance.getEntriesByName('conclave:first-render').length"
                        ),
                        60,
                    )
                    first.append(
                        driver.execute_script(
                            "return performance.getEntriesByName('conclave:first-render')[0].startTime"
                        )
                    )
                driver.execute_script(WATCH)
                delays: list[float] = []
                for n in range(events):
                    written = time.time()
                    store.record(
                        JOB,
                        VoteEvent(letter="B", at=100.0 + n, label="A3", reason=f"bench-{n}"),
                        progress(),
                        None,
                    )
                    key = str(n)
                    seen = until(
                        driver, lambda d, key=key: d.execute_script("return window.__seen[arguments[0]]", key)
                    )
                    delays.append(seen / 1000 - written)
        finally:
            process.terminate()
            process.wait(timeout=20)
            store.close()
    return {
        "page_load_ms": {
            "median": round(statistics.median(first), 1),
            "p90": round(_p90(first), 1),
            "loads": loads,
        },
        "event_to_screen_ms": {
            "median": round(1000 * statistics.median(delays), 1),
            "p90": round(1000 * _p90(delays), 1),
            "max": round(1000 * max(delays), 1),
            "events": events,
        },
        "poll_interval_ms": POLL_S * 1000,
        "event_to_screen_over_poll_interval": round(statistics.median(delays) / POLL_S, 2),
        "job": "3 agents, 9 answers of ~1.5 KB, 40 votes, a 60 KB diff (a page of ~100 KB JSON)",
        "browser": "Debian chromium, headless, through chromium-driver",
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared with other work)",
    }


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", type=int, default=20)
    parser.add_argument("--events", type=int, default=40)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if reason := missing():
        sys.exit(reason)
    result = measure(args.loads, args.events)
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
