"""`conclave serve --http` on an address other than loopback without CONCLAVE_HTTP_TOKEN refuses to start
and says how to set one; with a token, or on loopback, it serves. No traffic leaves the machine: the
server binds the wildcard address, and the test connects only over loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest

from tests.fakes.server import free_port


def serve(tmp_path: Path, host: str, token: str | None) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key != "CONCLAVE_HTTP_TOKEN"}
    env["CONCLAVE_HOME"] = str(tmp_path / "home")
    if token:
        env["CONCLAVE_HTTP_TOKEN"] = token
    process = subprocess.Popen(
        [sys.executable, "-m", "conclave", "serve", "--http", "--host", host, "--port", str(port)],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    return process, port


def answers(port: int, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            httpx2.get(f"http://127.0.0.1:{port}/mcp", timeout=1)
            return True
        except httpx2.TransportError:
            time.sleep(0.1)
    return False


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_a_non_loopback_bind_without_a_token_refuses_to_start(tmp_path: Path, host: str) -> None:
    process, _ = serve(tmp_path, host, None)
    try:
        code = process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail(f"the server started on {host} without a token")
    output = process.stdout.read().decode() if process.stdout else ""
    assert code != 0
    assert "CONCLAVE_HTTP_TOKEN" in output and "127.0.0.1" in output, output


def test_with_a_token_or_on_loopback_it_serves(tmp_path: Path) -> None:
    for host, token in (("0.0.0.0", "a-long-random-token-0123456789"), ("127.0.0.1", None)):
        process, port = serve(tmp_path, host, token)
        try:
            assert answers(port), (
                process.stdout.read().decode() if process.poll() is not None else "no answer"
            )
        finally:
            process.terminate()
            process.wait(timeout=20)
