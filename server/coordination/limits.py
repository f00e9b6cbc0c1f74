"""Requests in flight per provider, one limiter per provider shared by every job of a server.

A server runs many jobs at once (settings.max_jobs); what bounds the load on a provider is how many
requests it has open, whichever jobs they belong to.
"""

from __future__ import annotations

import anyio

DEFAULT_PER_PROVIDER = 64


class ProviderLimits:
    """A CapacityLimiter per provider name, made on first use, `slots` each."""

    def __init__(self, slots: int = DEFAULT_PER_PROVIDER) -> None:
        self.slots = slots
        self._limiters: dict[str, anyio.CapacityLimiter] = {}
        # Backends are built one at a time: building an SDK client (its TLS context above all) is CPU
        # work in a worker thread, and dozens at once (16 jobs starting) hold the GIL in turns long
        # enough to stall the event loop for seconds (bench/bench_store.py).
        self.building = anyio.CapacityLimiter(1)

    def of(self, provider: str) -> anyio.CapacityLimiter:
        limiter = self._limiters.get(provider)
        if limiter is None:
            limiter = self._limiters[provider] = anyio.CapacityLimiter(self.slots)
        return limiter
