"""A folder of credentials is never sent to the providers by accident: ~/.ssh, ~/.aws, ~/.gnupg (or a
home folder that holds one) are refused as context paths unless the caller insists.

Before the refusal, `conclave ask "..." --context ~` queued a job that copied ~/.ssh/id_rsa into every
agent's workspace, where each agent's file tools read it and send it to its provider.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastmcp import Client

from conclave.app.server import create_app
from conclave.errors import InputError
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, install, voter, write_team

pytestmark = pytest.mark.anyio
ENV = {KEY_ENV: "test-key-0123456789"}
SOLO = (("openai", "ann"),)


def a_home(tmp_path: Path, secrets: str) -> Path:
    home = tmp_path / "home"
    (home / secrets).mkdir(parents=True)
    (home / secrets / "id_rsa").write_text("PRIVATE KEY\n")
    (home / "notes.txt").write_text("hello\n")
    return home


@pytest.mark.parametrize("secrets", [".ssh", ".aws", ".gnupg"])
async def test_a_credentials_folder_or_a_home_holding_one_is_refused(
    tmp_path: Path, fakes: FakeProviders, secrets: str
) -> None:
    home = a_home(tmp_path, secrets)
    team = str(write_team(tmp_path / "team.yaml", fakes, SOLO))
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV)) as service:
        for path in (home, home / secrets):
            with pytest.raises(InputError, match="holds credentials") as refused:
                await service.submit(JobRequest(task="task", team=team, context_paths=[{"path": str(path)}]))
            assert f"{home / secrets}" in str(refused.value)
            assert '"allow_secrets": true' in str(refused.value)  # the MCP caller's way to insist
            assert "--allow-secret-folders" in refused.value.render("cli")
    # no job's folder (on PostgreSQL the folder holds its .store-id: jobs/store/shared_files.py)
    assert not list((tmp_path / "state" / "jobs").glob("cj-*"))


async def test_the_caller_may_insist(tmp_path: Path, fakes: FakeProviders) -> None:
    install(fakes.script, SOLO, voter())
    home = a_home(tmp_path, ".ssh")
    team = str(write_team(tmp_path / "team.yaml", fakes, SOLO))
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV)) as service:
        view = await service.submit(
            JobRequest(task="task", team=team, context_paths=[{"path": str(home), "allow_secrets": True}])
        )
        assert view.job_id.startswith("cj-")


async def test_over_mcp_the_refusal_names_the_argument(tmp_path: Path, fakes: FakeProviders) -> None:
    home = a_home(tmp_path, ".ssh")
    team = str(write_team(tmp_path / "team.yaml", fakes, SOLO))
    settings = Settings(home=tmp_path / "state")
    async with (
        JobService.serve(environment_of(settings, ENV)) as service,
        Client(create_app(service, settings)) as client,
    ):
        refused = await client.call_tool(
            "ask_team",
            {"task": "t", "team": team, "context_paths": [{"path": str(home)}]},
            raise_on_error=False,
        )
    message = refused.content[0].text  # type: ignore[union-attr]
    assert refused.is_error and "holds credentials" in message and "allow_secrets" in message
