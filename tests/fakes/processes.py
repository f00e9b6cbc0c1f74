"""`conclave serve` as a real child process for a test: over HTTP (stopped with SIGTERM afterwards), or
the parameters the official `mcp` client needs to start it over stdio.

    with http_server(tmp_path, {"CONCLAVE_HOME": ...}) as url:   # http://127.0.0.1:<port>/mcp
        async with Client(url, auth=HTTP_TOKEN) as client: ...
    async with stdio_client(stdio_params(tmp_path)) as (read, write): ...
    process, link = web_server(home)   # `conclave web`, and the sign-in link it printed
    with worker_process(folder, env) as process: ...   # `conclave worker`, once it takes jobs
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
from mcp.client.stdio import StdioServerParameters

from tests.fakes.server import free_port
from tests.fakes.team import KEY_DESTINATION, KEY_ENV

HTTP_TOKEN = "conclave-test-token-0123456789"  # the server's token unless `env` sets CONCLAVE_HTTP_TOKEN


def official_http(url: str, token: str = HTTP_TOKEN) -> Any:
    """The official `mcp` client's transport to `url`, sending the server's token (HTTP always needs one)."""
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"}
    return streamable_http_client(
        url, http_client=httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300))
    )


@contextmanager
def http_process(
    tmp_path: Path, env: Mapping[str, str], token: str | None = HTTP_TOKEN
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Start `python -m conclave serve --http` on a free port with `env` over os.environ; yield its base
    URL (http://127.0.0.1:PORT) once /mcp answers, and the process, which the caller stops.

    HTTP always needs a token: CONCLAVE_HTTP_TOKEN is `token` unless `env` sets it (None: unset, so the
    server makes one under CONCLAVE_HOME or reads http-tokens.json there). Callers may name folders under
    tmp_path (CONCLAVE_ALLOWED_ROOTS) unless `env` says otherwise ("": no root). The log is in
    tmp_path/server.log and is shown when the server dies before answering; the process is killed if
    the caller left it running.
    """
    port = free_port()
    environ = {key: value for key, value in os.environ.items() if key != "CONCLAVE_HTTP_TOKEN"}
    environ.update(
        {
            "FASTMCP_LOG_LEVEL": "WARNING",
            # the operator's root, as a shared server needs one: over HTTP the working directory is none
            "CONCLAVE_ALLOWED_ROOTS": str(tmp_path),
            **({"CONCLAVE_HTTP_TOKEN": token} if token else {}),
            **env,
        }
    )
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "conclave", "serve", "--http", "--port", str(port)],
            env=environ,
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, log_path.read_text()
            try:
                httpx2.get(f"{base}/mcp", timeout=1)
                break
            except httpx2.TransportError:
                # wall-time: a start limit, not a speed
                assert time.monotonic() < deadline, "the HTTP server did not start"
                time.sleep(0.1)
        yield base, process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@contextmanager
def http_server(tmp_path: Path, env: Mapping[str, str], token: str | None = HTTP_TOKEN) -> Iterator[str]:
    """`http_process`, yielding the /mcp URL. Stopped with SIGTERM, the server must exit 0: its
    JobService closes too (see app.serve_http)."""
    with http_process(tmp_path, env, token) as (base, process):
        yield f"{base}/mcp"
        process.terminate()
        # a hang guard, not a speed: shutdown removes the jobs' and the check pool's containers
        assert process.wait(timeout=60) == 0, (tmp_path / "server.log").read_text()


def stdio_params(tmp_path: Path) -> StdioServerParameters:
    """`python -m conclave serve` over stdio, state under tmp_path/home, user teams under tmp_path/config
    (write the fake team there as a preset), the fake agents' key in the environment."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "conclave", "serve"],
        cwd=str(tmp_path),
        env={
            "CONCLAVE_HOME": str(tmp_path / "home"),
            "XDG_CONFIG_HOME": str(tmp_path / "config"),
            KEY_ENV: "test-key",
            "CONCLAVE_KEY_DESTINATIONS": KEY_DESTINATION,
            "FASTMCP_LOG_LEVEL": "WARNING",
        },
    )


def web_server(home: Path, env: Mapping[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """`conclave web` on a free port for the state folder `home`, with `env` over os.environ but without
    our CONCLAVE_HTTP_TOKEN unless `env` sets one: the process (the caller stops it) and the one-time
    sign-in link it printed."""
    environ = {key: value for key, value in os.environ.items() if key != "CONCLAVE_HTTP_TOKEN"}
    environ.update({"CONCLAVE_HOME": str(home), **(env or {})})
    process = subprocess.Popen(
        [sys.executable, "-m", "conclave", "web", "--port", str(free_port())],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    text = process.stdout.readline() + process.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:\d+/login\?code=\S+", text)
    if found is None:
        process.kill()
        process.wait(timeout=30)
        raise AssertionError(f"conclave web printed no sign-in link: {text!r}")
    return process, found.group(0)


@contextmanager
def worker_process(
    folder: Path, env: Mapping[str, str], prefix: Sequence[str] = ()
) -> Iterator[subprocess.Popen[bytes]]:
    """`python -m conclave worker` with `env` over os.environ, its log in folder/worker.log, once it says
    it takes jobs; killed if the caller left it running. `prefix`: a command it runs under (e.g.
    `unshare --uts` for a host name of its own)."""
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / "worker.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "conclave", "worker"],
            env={**os.environ, **env},
            cwd=folder,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60  # wall-time: a start limit, not a speed
        while b"taking up to" not in log_path.read_bytes():
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()  # wall-time: a start limit
            time.sleep(0.1)  # sleep-ok: until the worker says it takes jobs
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
