"""HTTP needs a token, on loopback too, and a job belongs to whoever started it: an HTTP caller sees,
reads and cancels only its own jobs; the local user's CLI sees all.

Before (b4dce12): `serve --http` with no token answered an unauthenticated initialize with 200, and an
HTTP caller holding the server's token read, with get_status, a job the local user started with the CLI.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import httpx2
import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError

from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.processes import HTTP_TOKEN, http_server
from tests.fakes.raw_mcp import HEADERS, INIT
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, install, voter, write_team

pytestmark = pytest.mark.anyio
SOLO = (("openai", "ann"),)
ALICE, BOB = "alice-token-0123456789abcdef", "bob-token-0123456789abcdef"


async def test_with_no_token_set_the_server_makes_one_and_refuses_requests_without_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with http_server(tmp_path, {"CONCLAVE_HOME": str(home)}, token=None) as url:
        async with httpx2.AsyncClient(timeout=10) as http:
            assert (await http.post(url, json=INIT, headers=HEADERS)).status_code == 401
            made = home / "http-token"
            assert stat.S_IMODE(made.stat().st_mode) == 0o600 and made.stat().st_uid == os.geteuid()
            token = made.read_text().strip()
            authorized = {**HEADERS, "Authorization": f"Bearer {token}"}
            assert (await http.post(url, json=INIT, headers=authorized)).status_code == 200
    log = (tmp_path / "server.log").read_text()
    assert str(made) in log and "Authorization: Bearer" in log and token not in log


async def test_a_caller_sees_only_its_own_jobs_and_the_cli_sees_all(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    install(fakes.script, SOLO, voter())
    home = tmp_path / "home"
    config = tmp_path / "config"
    write_team(
        config / "conclave" / "teams" / "solo.yaml", fakes, SOLO, name="solo", coordination={"final": "reuse"}
    )
    home.mkdir(mode=0o700)
    tokens = home / "http-tokens.json"
    tokens.write_text(json.dumps({"alice": ALICE, "bob": BOB}))
    tokens.chmod(0o600)
    env = {"CONCLAVE_HOME": str(home), "XDG_CONFIG_HOME": str(config), KEY_ENV: "test-key"}
    settings = Settings(home=home)
    async with JobService.serve(environment_of(settings, {**env, "XDG_CONFIG_HOME": str(config)})) as cli:
        local = await cli.submit(
            JobRequest(task="What is 6 times 7?", team="solo")
        )  # the local user, at the terminal
        with http_server(tmp_path, env) as url:
            async with Client(url, auth=HTTP_TOKEN) as http:  # the server's own token: still not the CLI
                for tool, arguments in (
                    ("get_status", {}),
                    ("read_workspace", {"path": ""}),
                    ("cancel_job", {}),
                ):
                    with pytest.raises(ToolError, match="no such job"):
                        await http.call_tool(tool, {"job_id": local.job_id, **arguments})
            async with Client(url, auth=ALICE) as alice, Client(url, auth=BOB) as bob:
                with pytest.raises(ToolError, match="no such job"):
                    await alice.call_tool("get_status", {"job_id": local.job_id})
                started = await alice.call_tool("ask_team", {"task": "Q", "team": "solo", "wait_seconds": 30})
                job_id = started.structured_content["job_id"]
                own = await alice.call_tool("get_status", {"job_id": job_id})
                assert own.structured_content["job_id"] == job_id
                for tool in ("get_status", "cancel_job"):
                    with pytest.raises(ToolError, match="no such job"):
                        await bob.call_tool(tool, {"job_id": job_id})
                with pytest.raises(Exception, match="no such job"):
                    await bob.read_resource(f"conclave://jobs/{job_id}/transcript")
            assert (await cli.lookup.view(job_id)).job_id == job_id  # the CLI sees every caller's job
            assert (await cli.lookup.view(local.job_id)).job_id == local.job_id
