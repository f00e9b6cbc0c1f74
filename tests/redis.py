"""A real Redis for the queue's tests: Debian's `redis-server` (.ci/test-env.sh installs it), one per test
session in a folder of its own under /tmp, reached only through a unix socket there (no port shared
with anything else on the machine), emptied before each test that uses it. It asks for a password, as
the shipped deploy files' Redis does (fronts and workers refuse a queue without one: jobs/queue.py);
`redis_server(password=None)` starts one that asks for none.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

NEW = "new"  # redis_server's default: a fresh random password


def missing() -> str | None:
    """Why no Redis can run here, or None."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed: apt-get install -y redis-server (.ci/test-env.sh does it)"
    return None


@dataclass(frozen=True)
class Redis:
    """A running throwaway Redis: its socket and its password (None: it asks for none)."""

    socket: Path
    password: str | None

    def url(self) -> SecretStr:
        auth = f":{self.password}@" if self.password else ""
        return SecretStr(f"unix://{auth}{self.socket}")

    def cli(self, *command: str) -> subprocess.CompletedProcess[bytes]:
        """`redis-cli` on this Redis (its password given), for one command."""
        auth = ["-a", self.password, "--no-auth-warning"] if self.password else []
        return subprocess.run(["redis-cli", "-s", str(self.socket), *auth, *command], capture_output=True)

    def flush(self) -> None:
        self.cli("FLUSHALL").check_returncode()


@contextmanager
def redis_server(password: str | None = NEW) -> Iterator[Redis]:
    """Start redis-server on a unix socket (no TCP, nothing saved to disk), yield it, stop it."""
    password = secrets.token_hex(16) if password == NEW else password
    folder = Path(tempfile.mkdtemp(prefix="queue-redis-", dir="/tmp"))
    socket = folder / "redis.sock"
    auth = ["--requirepass", password] if password else []
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
            *auth,
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
        yield Redis(socket, password)
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
