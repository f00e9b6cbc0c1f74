"""What the adversarial battery shares: a real container over a real workspace, and a call that must
return in time even when the code under test blocks forever (it runs in a thread the test can leave)."""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from conclave.config.models import SandboxSpec
from conclave.sandbox.container import Sandbox
from conclave.sandbox.engine import Owner, connect

SPEC = SandboxSpec(memory="256m", cpus=1, pids=128)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


@pytest.fixture
async def box(docker_image: str, workspace: Path) -> AsyncIterator[Sandbox]:
    """A started sandbox whose /workspace is `workspace`."""
    sandbox = Sandbox(connect(), Owner("security-" + os.urandom(4).hex()))
    try:
        await sandbox.start(workspace, {}, "cj-security", "A", SPEC)
        yield sandbox
    finally:
        with anyio.CancelScope(shield=True):
            await sandbox.stop()


def within(seconds: float, call: Callable[[], Awaitable[Any]]) -> Any:
    """Run `call` on its own event loop in a daemon thread; fail if it has not returned after `seconds`.

    A blocked call (e.g. an open() on a FIFO) cannot be cancelled, so the test leaves its thread behind
    rather than hang with it.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = anyio.run(call)
        except BaseException as exc:  # reported to the test below
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the call was still blocked after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["result"]
