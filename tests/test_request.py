"""One request type: `JobRequest` is ask_team's input schema, submit's argument and what the store keeps;
a value of the wrong shape is an InputError naming the field; a job stored before requests still reads."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from pydantic import ValidationError

from conclave.app.server import create_app
from conclave.errors import InputError
from conclave.jobs.derived import JobOptions
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.jobs.store.sql import Store
from conclave.settings import Settings
from conclave.tools.ask_team import AskTeam
from tests.fakes.environment import environment_of
from tests.fakes.new_jobs import new_job
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, install, voter, write_team

pytestmark = pytest.mark.anyio
JOB = "cj-0123456789ab"


async def test_ask_teams_input_schema_is_the_request_model(tmp_path: Path) -> None:
    """Every field of JobRequest is a parameter of ask_team, described and bounded as the model says."""
    settings = Settings(home=tmp_path / "home")
    async with (
        JobService.serve(environment_of(settings, {})) as service,
        Client(create_app(service, settings)) as client,
    ):
        tools = {tool.name: tool for tool in await client.list_tools()}
    published = tools["ask_team"].input_schema
    model = AskTeam.model_json_schema()
    assert set(published["properties"]) == set(JobRequest.model_fields) | {"wait_seconds"}
    assert published["required"] == model["required"] == ["task"]
    assert published.get("additionalProperties") is False
    for name, field in published["properties"].items():
        expected = model["properties"][name]
        assert field["description"] == expected["description"] == AskTeam.model_fields[name].description
        for bound in ("minimum", "maximum", "exclusiveMinimum", "default"):
            assert field.get(bound) == expected.get(bound), (name, bound)


def test_a_request_takes_keywords_only() -> None:
    """Two swapped positional booleans cannot pass: there are no positional fields."""
    with pytest.raises(TypeError):
        JobRequest("task", "team")  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("apply", "yes", '"force"'),
        ("apply", 1, '"force"'),
        ("force_binary", "yes", "true or false"),
        ("allow_autorun", 1, "true or false"),
        ("max_tokens", 0, "positive whole number"),
        ("max_tokens", 1.5, "positive whole number"),
        ("max_cost_usd", -1.0, "US dollars"),
        ("context_paths", "/abs/project", '[{"path":'),
        ("no_such_field", True, "no such argument"),
    ],
)
def test_a_value_of_the_wrong_shape_is_an_input_error_naming_the_field(
    field: str, value: object, words: str
) -> None:
    with pytest.raises(InputError) as caught:
        JobRequest.model_validate({"task": "t", field: value})
    assert caught.value.field == field and caught.value.value == value
    assert words in caught.value.fix


def test_a_context_path_of_the_wrong_shape_names_its_item() -> None:
    with pytest.raises(InputError) as caught:
        JobRequest.model_validate(
            {"task": "t", "context_paths": [{"path": "/a"}, {"path": "/b", "permission": "rw"}]}
        )
    assert caught.value.field == "context_paths[1]" and "permission" in caught.value.fix


async def test_the_store_keeps_the_request_as_submitted(tmp_path: Path, fakes: FakeProviders) -> None:
    install(fakes.script, TRIO, voter())
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    project = tmp_path / "project"
    project.mkdir()
    asked = JobRequest(
        task="What is 6 times 7?",
        team=team,
        context_paths=[{"path": str(project), "permission": "write"}],  # type: ignore[list-item]
        apply="force",
        allow_autorun=True,
        max_tokens=10**6,
    )
    async with JobService.serve(
        environment_of(Settings(home=tmp_path / "home"), {KEY_ENV: "test-key"})
    ) as service:
        view = await service.submit(asked, caller="someone")
        await service.cancel(view.job_id)
        row = await service.store.job(view.job_id)
    assert row is not None and row.request == asked and row.caller == "someone"
    assert [c.name for c in row.options.context_paths] == ["project"]  # derived: named and pinned
    assert "apply" not in row.options.model_dump()  # the request's, not copied


def test_a_job_stored_before_requests_reads_its_request_from_its_options(tmp_path: Path) -> None:
    """A row written before migration 6: no request_json, apply and its consents in options_json."""
    store = Store(tmp_path / "conclave.db")
    store.create_job(new_job(JOB, "the old task"), 1, "owner")
    store.close()
    old: dict[str, Any] = {
        "context_paths": [{"path": "/old/project", "permission": "write", "name": "project"}],
        "apply": "force",
        "commands": True,
        "force_binary": True,
        "allow_artifacts": False,
        "allow_autorun": True,
        "estimate": None,
    }
    db = sqlite3.connect(tmp_path / "conclave.db")
    db.execute(
        "UPDATE jobs SET options_json = ?, request_json = NULL, follow_up = 'cj-000000000001'",
        (json.dumps(old),),
    )
    db.commit()
    db.close()
    again = Store(tmp_path / "conclave.db")
    try:
        row = again.job(JOB)
    finally:
        again.close()
    assert row is not None
    request = row.request
    assert (request.task, request.apply, request.force_binary, request.allow_autorun) == (
        "the old task",
        "force",
        True,
        True,
    )
    assert request.follow_up == "cj-000000000001" and request.allow_artifacts is False
    assert [c.path for c in request.context_paths or []] == ["/old/project"]
    assert row.options.commands and [c.name for c in row.options.context_paths] == ["project"]


def test_options_hold_no_copy_of_the_request() -> None:
    """apply and its consents are the request's: options given them refuse, rather than keep a copy."""
    with pytest.raises(ValidationError, match="apply"):
        JobOptions(apply=True)  # type: ignore[call-arg]
