"""`conclave status`, `show` and `teams` read through jobs/lookup.py, the lookup the MCP tools use: a bad
job id gets the same error on both surfaces, and whose job is whose is decided in one place."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from fastmcp import Client

from conclave.app.server import create_app
from conclave.cli.main import main
from conclave.errors import JobNotFound
from conclave.jobs.lookup import JobLookup
from conclave.jobs.service import JobService
from conclave.jobs.store.sql import Store
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.new_jobs import new_job

# Each of these reached the store as a job id through the CLI, which then said "no job ... here".
BAD_IDS = (
    "not a job",
    "cj-XYZ",
    "../../etc/passwd",
    "cj-0123456789ab/../x",
    "cj-0123456789AB",
    "' OR 1=1 --",
)
FIX = "job ids look like cj-1a2b3c4d5e6f; see"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(os.environ):
        if name.startswith("CONCLAVE_"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CONCLAVE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    return tmp_path / "home"


async def _mcp_errors(home: Path) -> dict[tuple[str, str], str]:
    """What get_status and read_workspace answer over MCP for each bad id."""
    settings = Settings(home=home)
    found: dict[tuple[str, str], str] = {}
    async with (
        JobService.serve(environment_of(settings, {})) as jobs,
        Client(create_app(jobs, settings)) as client,
    ):
        for bad in BAD_IDS:
            for tool in ("get_status", "read_workspace"):
                result = await client.call_tool(tool, {"job_id": bad}, raise_on_error=False)
                assert result.is_error, (tool, bad)
                found[tool, bad] = result.content[0].text  # type: ignore[union-attr]
    return found


def test_a_bad_job_id_gets_the_same_error_from_the_cli_as_over_mcp(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    over_mcp = anyio.run(_mcp_errors, home)
    capsys.readouterr()  # FastMCP's own log of those errors
    for bad in BAD_IDS:
        for tool in ("get_status", "read_workspace"):
            expected = f"job_id={bad!r} is not valid: {FIX} a job_id from ask_team's result"
            assert expected in over_mcp[tool, bad]
        for argv in (["status", bad], ["show", bad], ["show", bad, "--diff"], ["show", bad, "--file", "a"]):
            assert main(argv) == 2, argv
            captured = capsys.readouterr()
            assert captured.out == "", argv
            assert captured.err == f"conclave: JOB {bad!r}: {FIX} `conclave status`\n", argv


def test_an_id_with_blanks_around_it_reads_the_job_on_both_surfaces(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home.mkdir(parents=True)
    store = Store.of(Settings(home=home))
    store.create_job(new_job("cj-0123456789ab", "What is 6 x 7?", team="some-team"), os.getpid(), "gone")
    store.set_state("cj-0123456789ab", "failed", "failed: test", error="test")
    store.close()
    assert main(["status", " cj-0123456789ab\n"]) == 0
    assert capsys.readouterr().out.startswith("Job cj-0123456789ab (some-team): failed")
    assert main(["show", " cj-0123456789ab "]) == 0
    assert "\n  transcript\n" in capsys.readouterr().out


@pytest.mark.anyio
async def test_a_caller_sees_only_its_own_jobs_and_the_cli_sees_every_one(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    store = Store.of(settings)
    store.create_job(new_job("cj-00000000a11c", "alice's task", team="t", caller="alice"), os.getpid(), "o")
    store.create_job(new_job("cj-00000000b0b0", "bob's task", team="t", caller="bob"), os.getpid(), "o")
    store.close()
    async with JobLookup.open(settings, {}) as jobs:
        assert (await jobs.view("cj-00000000a11c", "alice")).task == "alice's task"
        assert (await jobs.view("cj-00000000a11c")).task == "alice's task"  # the CLI: caller None
        with pytest.raises(JobNotFound):
            await jobs.view("cj-00000000a11c", "bob")
        with pytest.raises(JobNotFound):
            await jobs.read("cj-00000000a11c", "", None, 0, 100, caller="bob")
        assert [line.job_id for line in await jobs.lines("bob")] == ["cj-00000000b0b0"]
        assert {view.job_id for view in await jobs.recent()} == {"cj-00000000a11c", "cj-00000000b0b0"}
