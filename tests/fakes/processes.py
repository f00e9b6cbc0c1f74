"""`conclave serve --http` as a real child process for a test, stopped with SIGTERM afterwards.

    with http_server(tmp_path, {"CONCLAVE_HOME": ...}) as url:   # http://127.0.0.1:<port>/mcp
        ...
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx2

from tests.fakes.server import free_port


@contextmanager
def http_server(tmp_path: Path, env: Mapping[str, str]) -> Iterator[str]:
    """Start `python -m conclave serve --http` on a free port with `env` over os.environ; yield its URL.

    CONCLAVE_HTTP_TOKEN is dropped unless `env` sets it. The log is in tmp_path/server.log and is shown
    when the server dies before answering. Stopped with SIGTERM, the server must exit 0: its JobService
    closes too (see app.serve_http).
    """
    port = free_port()
    environ = {key: value for key, value in os.environ.items() if key != "CONCLAVE_HTTP_TOKEN"}
    environ.update({"FASTMCP_LOG_LEVEL": "WARNING", **env})
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "conclave", "serve", "--http", "--port", str(port)],
            env=environ, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}/mcp"
        try:
            deadline = time.monotonic() + 30
            while True:
                assert process.poll() is None, log_path.read_text()
                try:
                    httpx2.get(url, timeout=1)
                    break
                except httpx2.TransportError:
                    assert time.monotonic() < deadline, "the HTTP server did not start"
                    time.sleep(0.1)
            yield url
            process.terminate()
            assert process.wait(timeout=20) == 0, log_path.read_text()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
