"""One type per idea, and the splits along responsibilities, hold in the code (issue 19).

A result is built once from the protocol's outcome and what shows it embeds it; a reason code branches
on is an enum; the protocol's `apply` matches every event; mypy is strict on coordination/ and jobs/
with no `type: ignore`; the service's parts stay apart. Each check fails if the old shape comes back.
"""

from __future__ import annotations

import ast
import enum
import inspect
import re
import tomllib
import typing
from pathlib import Path

from pydantic import BaseModel

from conclave.coordination import protocol_events, reports
from conclave.coordination.reports import AgentProgress, JobResult, Progress
from conclave.coordination.tally import Answer, Outcome, Posted, StopReason
from conclave.files.diff import FileChange
from conclave.jobs import derived
from conclave.jobs.derived import ContextChanges, FilesResult
from conclave.jobs.read import views
from conclave.jobs.read.views import JobView
from conclave.jobs.store.sql import AnswerRow

ROOT = Path(__file__).resolve().parents[1]
STRICT = ("coordination", "jobs")  # the packages with no `type: ignore` and no mypy exception listed


def own_fields(model: type[BaseModel]) -> set[str]:
    """The fields `model` declares itself (not those it inherits)."""
    return set(inspect.get_annotations(model)) & set(model.model_fields)


def sources(*packages: str) -> list[Path]:
    return sorted(path for package in packages for path in (ROOT / "server" / package).rglob("*.py"))


def test_no_type_ignore_in_the_strict_packages() -> None:
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in sources(*STRICT)
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if "type: ignore" in line
    ]
    assert not found, f"strict mypy needs no `type: ignore` here; type the code instead: {found}"


def test_mypy_lists_no_exceptions_for_the_strict_packages() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    listed = [module for override in config.get("overrides", []) for module in override["module"]]
    loose = [m for m in listed if m.startswith(tuple(f"conclave.{package}" for package in STRICT))]
    assert not loose, f"fix what mypy reports in these instead of listing them: {loose}"


def test_the_result_is_the_outcome_plus_the_final_text() -> None:
    assert issubclass(JobResult, Outcome)
    assert own_fields(JobResult) == {"answer", "presented_by"}, (
        "JobResult must not re-declare Outcome's fields"
    )
    outcome = Outcome(
        winner="B1",
        consensus=True,
        reason="r",
        tally={"A1": 1, "B1": 2},
        votes=2,
        voters=3,
        agree=(("A1", "B1"),),
        pending=("C1",),
        stopped_by=StopReason.BUDGET,
    )
    result = JobResult.of(outcome, "42", "B")
    assert Outcome.model_validate(result.model_dump(exclude={"answer", "presented_by"})) == outcome
    assert (result.answer, result.presented_by, result.budget_reached) == ("42", "B", True)


def test_a_result_stored_before_stopped_by_reads_back() -> None:
    old = {
        "answer": "x",
        "winner": "A1",
        "consensus": False,
        "reason": "budget reached: 10 tokens",
        "agree": [["A1", "B1"]],
        "pending": [],
        "budget_reached": True,
    }
    assert JobResult.model_validate(old).stopped_by is StopReason.BUDGET
    assert JobResult.model_validate({**old, "budget_reached": False}).stopped_by is None


def test_views_embed_the_types_they_show() -> None:
    # the job's view: the result and the live picture embedded, none of their fields copied
    assert typing.get_args(JobView.model_fields["result"].annotation) == (JobResult, type(None))
    assert typing.get_args(JobView.model_fields["progress"].annotation) == (Progress, type(None))
    assert Progress.model_fields["agents"].annotation == list[AgentProgress]
    shared = set(JobView.model_fields) & set(JobResult.model_fields)
    assert not shared, f"JobView copies the result's {shared}: read them from `result`"
    # `phase` is the view's in words ("B posted B1"), `notes` with whether the agents saw them
    shared = set(JobView.model_fields) & set(Progress.model_fields)
    assert shared <= {"phase", "notes"}, f"JobView copies the picture's {shared}: read them from `progress`"
    assert typing.get_args(JobView.model_fields["diff_summary"].annotation) == (FilesResult, type(None))
    assert ContextChanges.model_fields["files"].annotation == list[FileChange]
    # an answer as stored and as the protocol keeps it: one declaration of what names it
    assert issubclass(AnswerRow, Posted) and issubclass(Answer, Posted)
    assert own_fields(AnswerRow) & set(Answer.model_fields) == set()
    copies = {
        name
        for module in (views, derived)
        for name in vars(module)
        if name in {"AgentView", "FileChangeView"}
    }
    assert not copies, f"{copies} came back: use the type they copied"


def test_the_stop_reason_is_data() -> None:
    assert issubclass(StopReason, enum.Enum)
    assert typing.get_args(Outcome.model_fields["stopped_by"].annotation) == (StopReason, type(None))
    substring = re.compile(r"\bin\s+[\w.]*\b(outcome|result)\.reason\b")
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in sources(*STRICT)
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if substring.search(line)
    ]
    assert not found, f"branch on Outcome.stopped_by, not on the reason's words: {found}"


def test_apply_matches_every_event_exhaustively() -> None:
    tree = ast.parse((ROOT / "server/coordination/protocol.py").read_text(encoding="utf-8"))
    functions = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    apply = functions["apply"]
    assert any(isinstance(node, ast.Match) for node in ast.walk(apply)), "apply is a `match` over the events"
    matched: set[str] = set()
    for function in functions.values():
        if not any(
            isinstance(n, ast.Call) and ast.unparse(n.func) == "assert_never" for n in ast.walk(function)
        ):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.MatchClass):
                matched.add(ast.unparse(node.cls))
    events = {cls.__name__ for cls in typing.get_args(protocol_events.ProtocolEvent)}
    assert events <= matched, f"events no exhaustive match takes: {events - matched}"
    assert "TurnEvent" not in events, "the union names each event class, so assert_never can check it"


def test_job_events_are_one_frozen_model_per_kind_in_a_discriminated_union() -> None:
    members = typing.get_args(typing.get_args(reports.JobEvent)[0])
    kinds = [cls.model_fields["kind"].default for cls in members]
    assert sorted(kinds) == sorted(typing.get_args(reports.EventKind)), "one model per kind, each kind once"
    for cls in members:
        assert cls.model_config.get("frozen") and cls.model_config.get("extra") == "forbid", cls.__name__
        assert "data" not in cls.model_fields, f"{cls.__name__} keeps a payload dict: give it typed fields"


# (file, function) that take every job event: the store's writer and the readers
EVENT_MATCHES = [
    ("server/jobs/store/sql.py", "record"),
    ("server/jobs/read/views.py", "phase_of"),
    ("server/jobs/read/reader.py", "_sentence"),
    ("server/web/snapshot.py", "_moment"),
]


def test_the_store_and_the_readers_match_every_job_event_exhaustively() -> None:
    events = {cls.__name__ for cls in typing.get_args(typing.get_args(reports.JobEvent)[0])}
    for path, name in EVENT_MATCHES:
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
        function = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
        assert any(
            isinstance(n, ast.Call) and ast.unparse(n.func) == "assert_never" for n in ast.walk(function)
        )
        matched = {ast.unparse(n.cls) for n in ast.walk(function) if isinstance(n, ast.MatchClass)}
        assert events <= matched, f"{path} {name} does not match {events - matched}"


def test_no_event_payload_is_read_as_a_dict() -> None:
    """An event's fields are read by name (`event.label`), never from a payload dict."""
    payload = re.compile(r"\b(?:e|event|taken|d)\.data\b|\bdata\[\"(?:label|content|reason|error|text)\"\]")
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in [*(ROOT / "server").rglob("*.py"), *(ROOT / "tools").rglob("*.py")]
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if payload.search(line)
    ]
    assert not found, f"job event payloads read as dicts: {found}"


def test_the_driver_carries_out_every_action_exhaustively() -> None:
    tree = ast.parse((ROOT / "server/coordination/orchestrator.py").read_text(encoding="utf-8"))
    execute = next(n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef) and n.name == "_execute")
    assert any(isinstance(n, ast.Call) and ast.unparse(n.func) == "assert_never" for n in ast.walk(execute))
    matched = {
        ast.unparse(n.cls).removeprefix("protocol.")
        for n in ast.walk(execute)
        if isinstance(n, ast.MatchClass)
    }
    actions = {cls.__name__ for cls in typing.get_args(protocol_events.Action)}
    assert actions <= matched, f"actions the driver does not match: {actions - matched}"


def test_the_service_is_split_into_admission_lifecycle_and_maintenance() -> None:
    tree = ast.parse((ROOT / "server/jobs/service.py").read_text(encoding="utf-8"))
    imported = {
        alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names
    }
    assert {"Admission", "Lifecycle", "watch", "take_over"} <= imported
    assert not imported & {
        "Orchestrator",
        "prepare",
        "collect",
        "check_runnable",
        "resolve_team",
        "StoreSink",
    }, "the service delegates: admission checks, lifecycle runs, maintenance watches"
    methods = {node.name for node in ast.walk(tree) if isinstance(node, ast.AsyncFunctionDef)}
    assert not methods & {"_run", "_watch", "_end_if_active"}
