"""jobs/run/gc_freeze.py: a warm server's objects are frozen once per provider, so full collections skip
them."""

from __future__ import annotations

import gc

from conclave.jobs.run.gc_freeze import Heap


def test_the_heap_is_frozen_once_per_new_provider() -> None:
    heap = Heap()
    try:
        gc.unfreeze()
        kept = [object() for _ in range(100)]  # alive when the first job ends: frozen with the rest
        gc.collect()
        assert gc.get_freeze_count() == 0
        assert heap.settle(["openai", "anthropic"])
        frozen = gc.get_freeze_count()
        assert frozen > len(kept)
        assert not heap.settle(["anthropic", "openai"])  # nothing new: nothing frozen
        assert gc.get_freeze_count() == frozen
        assert heap.settle(["anthropic", "gemini"])  # one new provider: its SDK's objects join
    finally:
        gc.unfreeze()
