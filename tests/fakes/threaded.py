"""A fake's uvicorn server on a daemon thread, so the real SDKs (in the test, or in a conclave subprocess)
reach it over real HTTP: tests/fakes/server.py, tests/fakes/login_hosts.py, tests/backends/test_tls.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn


@contextmanager
def serving(config: uvicorn.Config, name: str) -> Iterator[uvicorn.Server]:
    """`config`'s server for the block: started (and answering) before it, stopped after it."""
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        # wall-time: a guard against a fake that never starts, not a measurement
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the fake server {name} did not start")
        time.sleep(0.01)
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(timeout=10)
