"""Context paths a caller names: never a pseudo filesystem, never past the size the listing saw, and over
HTTP only under the allowed roots (CONCLAVE_ALLOWED_ROOTS, which the operator sets: tests/security/
test_server_state.py has a server without it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError

from conclave.errors import InputError
from conclave.files.trees import copy_tree, list_tree
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.processes import HTTP_TOKEN, http_server
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, install, voter, write_team

pytestmark = pytest.mark.anyio
ENV = {KEY_ENV: "test-key-0123456789"}
SOLO = (("openai", "ann"),)


@pytest.mark.parametrize("pseudo", ["/proc/sys/kernel/random", "/proc/self", "/sys/kernel", "/dev"])
async def test_pseudo_filesystems_are_refused_before_anything_is_read(
    tmp_path: Path, fakes: FakeProviders, pseudo: str
) -> None:
    team = str(write_team(tmp_path / "team.yaml", fakes, SOLO))
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV)) as service:
        with pytest.raises(InputError, match="pseudo filesystem") as refused:
            await service.submit(JobRequest(task="task", team=team, context_paths=[{"path": pseudo}]))
    assert "context_paths[0]" in str(refused.value)
    # no job's folder (on PostgreSQL the folder holds its .store-id: jobs/store/shared_files.py)
    assert not list((tmp_path / "state" / "jobs").glob("cj-*"))


def test_a_copy_reads_at_most_the_size_the_listing_saw(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "log.txt").write_text("first line\n")
    listing = list_tree(source)
    with open(source / "log.txt", "a") as grown:  # it grows after the listing (as a /proc file would)
        grown.write("x" * 100_000)
    copy_tree(source, tmp_path / "copy", listing)
    assert (tmp_path / "copy" / "log.txt").read_text() == "first line\n"


async def test_over_http_a_caller_names_folders_only_under_the_operators_roots(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    install(fakes.script, SOLO, voter())
    served = tmp_path / "served"
    (served / "project").mkdir(parents=True)
    (served / "project" / "a.txt").write_text("inside\n")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "id_rsa").write_text("PRIVATE KEY\n")
    (served / "project" / "escape").symlink_to(outside)
    config = tmp_path / "config"
    write_team(config / "conclave" / "teams" / "solo.yaml", fakes, SOLO, name="solo")
    env = {
        "CONCLAVE_HOME": str(tmp_path / "home"),
        "CONCLAVE_ALLOWED_ROOTS": str(served),
        "XDG_CONFIG_HOME": str(config),
        **ENV,
    }
    with http_server(served, env) as url:
        async with Client(url, auth=HTTP_TOKEN) as client:
            for folder in (outside, served / "project" / "escape", Path("/etc")):
                with pytest.raises(ToolError, match="CONCLAVE_ALLOWED_ROOTS"):
                    await client.call_tool(
                        "ask_team",
                        {
                            "task": "read it",
                            "team": "solo",
                            "context_paths": [{"path": str(folder)}],
                            "wait_seconds": 0,
                        },
                    )
            allowed = await client.call_tool(
                "ask_team",
                {
                    "task": "read it",
                    "team": "solo",
                    "context_paths": [{"path": str(served / "project")}],
                    "wait_seconds": 0,
                },
            )
            assert allowed.structured_content["job_id"].startswith("cj-")
