"""The objects a warm server keeps for good, moved out of the garbage collector's way.

A full collection walks every object the process holds, stopping every thread meanwhile: with the
provider SDKs imported, a server holds about 380k objects, and one full collection took 0.3-0.9 s on
this 2-core machine, a stall every MCP call and every job felt (bench/bench_store.py: each such stall
was one get_status call's whole latency). Once a job with providers not seen before has ended, the
objects left are the server's own (modules, SDK types, schemas): `gc.freeze` moves them to the
permanent generation, so later collections walk only what the jobs made since. It happens once per
provider, so the objects of jobs running then that later become unreachable through a reference
cycle stay with it: a bounded cost, paid at most once per provider.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable


class Heap:
    """Which providers this process has run; `settle` freezes the heap when one is new."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def settle(self, providers: Iterable[str]) -> bool:
        """A job with these providers has ended: freeze what is alive if one is new; whether it froze."""
        new = set(providers) - self._seen
        if not new:
            return False
        self._seen |= new
        gc.freeze()
        return True
