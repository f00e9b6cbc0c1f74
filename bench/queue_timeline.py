"""Where the time of bench/bench_queue.py's many-jobs parts goes: what the jobs' rows say (each job's
run, the gap between a slot freeing on a worker and its next job starting, how full the slots were)
and what the CPU did meanwhile (the machine's 2 cores, and each of our processes' share).

The rows' times are the workers' clocks (epoch seconds, one machine here); `started_at` is set when a
job turns `running`, after its worker took it from the store and prepared its files, so a slot's gap
holds the end of one job's lifecycle, the take (`Store.take_queued`) and the next one's start.
"""

from __future__ import annotations

import os
import resource
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from conclave.jobs.store.sql import JobRow, Store

TICKS = os.sysconf("SC_CLK_TCK")


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _figures(values: Sequence[float], name: str) -> dict[str, float]:
    if not values:
        return {}
    return {
        f"{name}_mean": round(statistics.mean(values), 3),
        f"{name}_median": round(statistics.median(values), 3),
        f"{name}_p90": round(_quantile(values, 0.9), 3),
        f"{name}_max": round(max(values), 3),
    }


def slot_gaps(rows: Iterable[JobRow]) -> list[float]:
    """Per worker, seconds from each job's end to the next job's start there, counted only while a job
    was waiting on the queue (asked before the end, started after it): a slot idle with work to do."""
    by_owner: dict[str, list[JobRow]] = defaultdict(list)
    done = [r for r in rows if r.started_at is not None and r.finished_at is not None]
    for row in done:
        by_owner[row.owner_id].append(row)
    gaps = []
    for jobs in by_owner.values():
        starts = sorted(r.started_at for r in jobs if r.started_at is not None)
        for row in jobs:
            end = row.finished_at
            assert end is not None
            waiting = any(r.created_at <= end < (r.started_at or 0) for r in done)
            later = [s for s in starts if s >= end]
            if waiting and later:
                gaps.append(later[0] - end)
                starts.remove(later[0])  # each start fills one freed slot
    return gaps


def timeline(store: Store, rows: Sequence[JobRow], slots: int) -> dict[str, Any]:
    """What the rows say: each job's run, the slots' gaps, and how busy the slots were over the span;
    `set_up_s`: from a job turning `running` to its orchestrator's `started` event (building its
    agents: a worker's first jobs import the provider SDKs unless it preloaded them)."""
    runs = [r.finished_at - r.started_at for r in rows if r.finished_at and r.started_at]
    set_ups = [started[0].at for r in rows if (started := store.events(r.id, "started"))]
    starts = [r.started_at for r in rows if r.started_at]
    ends = [r.finished_at for r in rows if r.finished_at]
    span = max(ends) - min(starts)
    gaps = slot_gaps(rows)
    return {
        **_figures(runs, "run_s"),
        **_figures(set_ups, "set_up_s"),
        **_figures(gaps, "slot_gap_s"),
        "slot_gaps": len(gaps),
        # the share of the slots' time the jobs ran: span x slots against the sum of the runs
        "slots_busy": round(sum(runs) / (span * slots), 3),
        # the jobs at the median run spread evenly over the slots, back to back (a last round only
        # partly full is not counted: 64 jobs on 6 slots take 11 rounds, not 10.7)
        "ideal_span_s": round(len(runs) * statistics.median(runs) / slots, 2),
    }


@dataclass
class CpuClock:
    """CPU seconds spent since it was made: the machine's (every core, every process) and ours."""

    pids: dict[str, int]

    def __post_init__(self) -> None:
        self._machine = _machine()
        self._ours = self._processes()

    def _processes(self) -> dict[str, float]:
        seconds = {name: process_cpu_s(pid) for name, pid in self.pids.items()}
        usage = resource.getrusage(resource.RUSAGE_SELF)
        seconds["bench (fakes, clients)"] = usage.ru_utime + usage.ru_stime
        return seconds

    def read(self, wall_s: float) -> dict[str, Any]:
        busy, total = (now - then for now, then in zip(_machine(), self._machine, strict=True))
        ours = {name: round(s - self._ours.get(name, 0.0), 1) for name, s in self._processes().items()}
        return {
            "cpu_busy_fraction": round(busy / total, 3),  # of every core, every process on the machine
            "cpu_cores": os.cpu_count(),
            "cpu_s_by_process": ours,
            "cpu_s_machine": round(busy / TICKS, 1),
            "cpu_s_others": round(busy / TICKS - sum(ours.values()), 1),  # postgres, redis, other work
            "wall_s": round(wall_s, 1),
        }


def _machine() -> tuple[float, float]:
    """(busy, total) clock ticks over every core since boot, from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [float(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def process_cpu_s(pid: int) -> float:
    """A live process's CPU seconds (user + system); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except FileNotFoundError:
        return 0.0
    return (float(fields[11]) + float(fields[12])) / TICKS  # utime, stime


def slowest_jobs(store: Store, rows: Sequence[JobRow], count: int = 3) -> list[dict[str, Any]]:
    """The `count` longest runs, each with its events (seconds into the run, kind, letter): where a
    long one spent its time."""
    done = [r for r in rows if r.started_at is not None and r.finished_at is not None]
    done.sort(key=lambda r: (r.finished_at or 0) - (r.started_at or 0))
    return [
        {
            "run_s": round((row.finished_at or 0) - (row.started_at or 0), 2),
            "events": [f"{e.at:.2f} {e.kind} {e.letter or ''}".rstrip() for e in store.events(row.id)],
        }
        for row in done[-count:]
    ]
