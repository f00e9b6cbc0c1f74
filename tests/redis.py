"""A real Redis for the queue's tests: Debian's `redis-server` (.ci/test-env.sh installs it), one per test
session in a folder of its own under /tmp, reached only through a unix socket there (no port shared
with anything else on the machine), emptied before each test that uses it.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr


def missing() -> str | None:
    """Why no Redis can run here, or None."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed: apt-get install -y redis-server (.ci/test-env.sh does it)"
    return None


@dataclass(frozen=True)
class Redis:
    """A running throwaway Redis: its socket."""

    socket: Path

    def url(self) -> SecretStr:
        return SecretStr(f"unix://{self.socket}")

    def flush(self) -> None:
        subprocess.run(["redis-cli", "-s", str(self.socket), "FLUSHALL"], check=True, capture_output=True)


@contextmanager
def redis_server() -> Iterator[Redis]:
    """Start redis-server on a unix socket (no TCP, nothing saved to disk), yield it, stop it."""
    folder = Path(tempfile.mkdtemp(prefix="queue-redis-", dir="/tmp"))
    socket = folder / "redis.sock"
    process = subprocess.Popen(
        [
            "redis-server",
            "--port",
            "0",
            "--unixsocket",
            str(socket),
            "--unixsocketperm",
            "700",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(folder),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10  # wall-time: a start limit, not a speed
        while not socket.exists():
            assert process.poll() is None, "redis-server exited at start"
            assert time.monotonic() < deadline, "no socket"  # wall-time: a start limit, not a speed
            time.sleep(0.05)  # sleep-ok: until redis-server opens its socket
        yield Redis(socket)
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
