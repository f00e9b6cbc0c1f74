"""Malformed work-tool arguments from a model (wrong types, unhashable values, lone surrogates, unknown
keys) come back to it as tool errors; the job goes on and completes."""

from __future__ import annotations

from pathlib import Path

import pytest

from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.script import Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, install, voter, write_team
from tests.fakes.waits import until_done

pytestmark = pytest.mark.anyio
SOLO = (("openai", "ann"),)
BAD_CALLS = [
    ("write_file", {"path": ["a.txt"], "content": 1}),
    ("read_file", {"path": "a.txt", "peer": ["B"]}),  # unhashable where a letter belongs
    ("read_file", {"path": "a.txt", "peer": {"B": 1}}),
    ("read_file", {"path": "\ud800.txt"}),  # a lone surrogate, sent as the JSON escape \ud800
    ("write_file", {"path": "b.txt", "content": "x\udfff"}),
    ("write_file", {"path": "a.txt", "content": "x", "mode": 511}),  # a key no tool takes
    ("list_files", {"path": {"x": 1}}),
    ("search", {"pattern": ["a"]}),
    ("edit_file", {"path": "a.txt", "old_text": "", "new_text": 3}),
    ("read_file", {"path": "a.txt", "start_line": "first"}),
]


async def test_malformed_tool_arguments_are_tool_errors_and_the_job_completes(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "a.txt").write_text("hello\n")
    install(fakes.script, SOLO, voter())
    fakes.script.enqueue("ann", Reply(tool_calls=list(BAD_CALLS)))
    team = str(write_team(tmp_path / "team.yaml", fakes, SOLO, coordination={"final": "reuse"}))
    async with JobService.serve(
        environment_of(Settings(home=tmp_path / "state"), {KEY_ENV: "k-0123456789"})
    ) as service:
        view = await until_done(
            service,
            await service.submit(
                JobRequest(task="Look at a.txt", team=team, context_paths=[{"path": str(project)}])
            ),
        )
    assert view.state == "completed", view.text()
    answered = fakes.script.requests_of("ann")[1].text()
    assert answered.count("bad arguments for") == len(BAD_CALLS), answered
    assert "is not an argument of write_file" in answered and "lone surrogate" in answered
    assert not (project / "b.txt").exists() and (project / "a.txt").read_text() == "hello\n"
