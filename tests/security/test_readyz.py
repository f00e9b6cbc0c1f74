"""The unauthenticated /readyz says whether the server can take jobs and, for each part, a coarse reason,
never where a part is: no engine address, no database or queue URL, no driver's message (the server's
log has those). Before: it answered the engine's error, naming DOCKER_HOST's address."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest

from tests.fakes.processes import http_server
from tests.fakes.server import free_port

pytestmark = pytest.mark.anyio


async def test_readyz_names_no_address_of_a_part_that_failed(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    home = tmp_path / "home"
    engine = f"tcp://10.255.255.1:{port}"
    env = {"CONCLAVE_HOME": str(home), "DOCKER_HOST": engine, "CONCLAVE_CHECK_POOL": "0"}
    with http_server(tmp_path, env) as url:
        async with httpx2.AsyncClient(timeout=30) as http:
            answer = await http.get(url.replace("/mcp", "/readyz"))
    assert answer.status_code == 503
    body = answer.json()
    assert body == {
        "ready": False,
        "store": "ok",
        "engine": "failed",
        "queue": "not configured",
        "errors": ["the Docker engine did not answer"],
    }, body
    for named in ("10.255.255.1", str(port), "tcp://", str(home)):
        assert named not in answer.text
    assert "10.255.255.1" in (tmp_path / "server.log").read_text()  # the operator's log says where
