"""The `conclave` command speaks to a person in its own words: flags and commands, never MCP argument
syntax or pydantic's phrasing; teams are called ready only when they can run; tallies count answers.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from conclave.cli.main import main
from conclave.cli.render import render, tally_by_answer
from conclave.coordination.reports import Leading
from conclave.coordination.tally import by_answer
from conclave.errors import TERMS, say, term
from conclave.jobs.derived import Estimate
from conclave.jobs.read.views import JobView
from conclave.jobs.request import JobRequest

# What only an MCP caller types: argument names, call syntax, tool names, pydantic's phrasing.
MCP_SYNTAX = re.compile(
    r"context_paths|force_binary|max_cost_usd|job_id|\w+=\[|\w+='|path='|read_workspace|get_status|ask_team|"
    r"cancel_job|list_teams|Value error|validation error|input_value|apply: \""
)


pytestmark = pytest.mark.usefixtures("isolated")  # tests/conftest.py: no real keys or state


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# No MCP syntax ------------------------------------------------------------------------------------
def test_every_term_has_a_cli_spelling_without_mcp_syntax() -> None:
    for name, (mcp, cli) in TERMS.items():
        assert say(term(name), "mcp") == mcp
        assert not MCP_SYNTAX.search(say(term(name), "cli")), (name, cli)


def test_no_cli_error_or_hint_carries_mcp_syntax(
    capsys: pytest.CaptureFixture[str], trio: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    keyless = tmp_path / "keyless.yaml"
    keyless.write_text(yaml.safe_dump({"agents": [{"model": "openai/gpt-5"}]}))
    _, out, _ = run(capsys, "ask", "What is six times seven?", "--team", str(trio), "--json")
    job = JobView.model_validate_json(out).job_id
    said: dict[str, str] = {}
    for argv in (
        ("ask", "t", "--team", str(trio), "--verify", "pytest -q"),
        ("ask", "t", "--team", str(trio), "--apply"),
        ("ask", "t", "--team", str(trio), "--context", "/no/such/dir"),
        ("ask", "t", "--team", str(trio), "--context", str(trio)),
        ("ask", "t", "--team", str(trio), "--context", str(home)),
        ("ask", "t", "--team", str(trio), "--max-cost", "1"),
        ("ask", "t", "--team", str(trio), "--max-tokens", "0"),
        ("ask", "t", "--team", str(keyless)),
        ("ask", "t", "--team", "nope"),
        ("ask", "   ", "--team", str(trio)),
        ("show", job, "--diff"),
        ("show", job, "--file", "nope.py"),
        ("show", job, "--file", "a.py", "--source", "Z9"),
        ("show", "cj-000000000000"),
        ("status", "cj-000000000000"),
        ("status", job),
        ("show", job),
    ):
        _code, out, err = run(capsys, *argv)
        said[" ".join(argv)] = err + "\n".join(line for line in out.splitlines() if line.startswith("Next:"))
    for argv, text in said.items():
        assert text.strip(), argv
        assert not MCP_SYNTAX.search(text), f"{argv}:\n{text}"
    assert "--context" in said[f"ask t --team {trio} --verify pytest -q"]
    assert "--max-tokens" in said[f"ask t --team {trio} --max-cost 1"]
    assert "--team local" in said[f"ask t --team {keyless}"]
    assert f"conclave show {job} --transcript" in said[f"status {job}"]
    assert "--allow-secret-folders" in said[f"ask t --team {trio} --context {home}"]


def test_the_mcp_error_keeps_the_mcp_names(trio: Path) -> None:
    import anyio

    from conclave.errors import InputError
    from conclave.jobs.service import JobService
    from conclave.settings import Settings

    async def submit() -> InputError:
        async with JobService.open(Settings()) as service:
            with pytest.raises(InputError) as caught:
                await service.submit(
                    JobRequest(task="t", team=str(trio), context_paths=[], verify="pytest -q")
                )
        return caught.value

    error = anyio.run(submit)
    assert str(error).startswith("verify='pytest -q' is not valid: ") and "context_paths=[{path:" in str(
        error
    )
    assert error.render("cli").startswith("--verify 'pytest -q': ") and "--context ./project" in error.render(
        "cli"
    )


# Usage ----------------------------------------------------------------------------------------------
def test_a_bad_flag_shows_that_commands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["ask", "x", "--bogus"])
    err = capsys.readouterr().err
    assert caught.value.code == 2 and err.startswith("usage: conclave ask ") and "--bogus" in err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["show", "cj-000000000000", "--source", "B1"], "--file"),
        (["ask", "t", "--force-binary"], "--apply"),
        (["ask", "t", "--allow-artifacts"], "--apply"),
        (["ask", "t", "--allow-autorun"], "--apply"),
        (["ask", "t", "--allow-secret-folders"], "--context"),
        (["serve", "--port", "9000"], "--http"),
        (["serve", "--http", "--no-front"], "--no-front"),
    ],
)
def test_inconsistent_flags_are_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    err = capsys.readouterr().err
    assert (
        caught.value.code == 2
        and err.startswith(f"usage: conclave {argv[0]} ")
        and named in err.splitlines()[-1]
    )


def test_ask_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["ask", "--help"])
    out = capsys.readouterr().out
    assert "examples:\n  conclave ask " in out and "--context ./src:write --apply" in out


def test_an_unknown_team_suggests_only_a_close_name(capsys: pytest.CaptureFixture[str]) -> None:
    _, _, err = run(capsys, "ask", "t", "--team", "nope")
    assert "did you mean" not in err and "no team named 'nope'" in err
    _, _, err = run(capsys, "ask", "t", "--team", "frontiers")
    assert "did you mean 'frontier'?" in err


# Honest readiness -----------------------------------------------------------------------------------
@pytest.fixture
def closed_port() -> Iterator[int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        yield probe.getsockname()[1]  # bound, never listening: a connect is refused


def test_teams_calls_an_unreachable_server_not_reachable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    url = f"http://127.0.0.1:{closed_port}/v1"
    monkeypatch.setenv("OLLAMA_BASE_URL", url)
    _, out, _ = run(capsys, "teams")
    assert f"ollama: not reachable at {url} (connection refused)\n" in out
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        monkeypatch.setenv("OLLAMA_BASE_URL", f"http://127.0.0.1:{listening.getsockname()[1]}/v1")
        _, out, _ = run(capsys, "teams")
    assert "ollama: ready\n" in out
    assert "local: ready (a demo of the protocol on a tiny model: not for real work)" in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_a_job_for_an_unreachable_server_is_refused_at_submit(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    monkeypatch.setenv("OLLAMA_BASE_URL", f"http://127.0.0.1:{closed_port}/v1")
    code, _out, err = run(capsys, "ask", "t", "--team", "ollama")
    assert code == 2 and f"not reachable at http://127.0.0.1:{closed_port}/v1" in err
    assert "no jobs yet" in run(capsys, "status")[1]


@pytest.mark.anyio
async def test_list_teams_says_not_reachable_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    from fastmcp import Client

    from conclave.app.server import create_app
    from conclave.jobs.service import JobService
    from conclave.settings import Settings

    monkeypatch.setenv("OLLAMA_BASE_URL", f"http://127.0.0.1:{closed_port}/v1")
    settings = Settings(home=tmp_path / "mcp-state")
    async with JobService.open(settings) as service, Client(create_app(service, settings)) as client:
        listed = await client.call_tool("list_teams", {})
    ollama = next(team for team in listed.structured_content["teams"] if team["name"] == "ollama")  # type: ignore[index]
    assert ollama["ready"] is False and list(ollama["unreachable"]) == [f"http://127.0.0.1:{closed_port}/v1"]
    local = next(team for team in listed.structured_content["teams"] if team["name"] == "local")  # type: ignore[index]
    assert local["demo"] is True


# Tallies by answer ----------------------------------------------------------------------------------
def a_view(**fields: object) -> JobView:
    """A running job's view; `tally`, `agree` and `leading` go into its live picture."""
    picture = {key: fields.pop(key) for key in ("tally", "agree", "leading") if key in fields}
    base: dict[str, object] = {
        "progress": {"phase": "coordinating", **picture},
        "job_id": "cj-000000000001",
        "state": "running",
        "phase": "voting",
        "elapsed_s": 3,
        "team": "t",
        "task": "What is 2 + 2?",
        "next": "-",
    }
    view = JobView.model_validate(base | fields)
    if "by_answer" in fields:
        return view
    return view.model_copy(update={"by_answer": by_answer(*view.votes())})  # as job_view serves it


def shown(view: JobView, texts: dict[str, str] | None = None, width: int = 100) -> str:
    console = Console(record=True, width=width)
    console.print(render(view, texts, width))
    return console.export_text()


def test_the_tally_groups_equivalent_answers() -> None:
    view = a_view(tally={"A1": 0, "C1": 3, "B1": 0}, agree=[["A1", "B1", "C1"]])
    texts = {"A1": "4", "B1": "The answer is 4.", "C1": "2 + 2 = 4"}
    assert [group.text() for group in tally_by_answer(view, texts)] == ['"4": A1 = B1 = C1, 3 votes']
    out = shown(view, texts)
    assert 'votes by answer: "4": A1 = B1 = C1, 3 votes' in out and "A1: 0" not in out
    split = a_view(tally={"A1": 1, "B1": 2, "C1": 0}, agree=[["A1", "C1"]])
    assert [group.text() for group in tally_by_answer(split, {})] == ["B1, 2 votes", "A1 = C1, 1 vote"]


def test_the_cli_shows_the_tally_as_served_and_adds_no_votes_up() -> None:
    """The grouping is the server's (JobView.by_answer): the CLI shows its groups and counts as they are,
    whatever the per-answer tally beside it says."""
    served = [{"labels": ["A1", "B1"], "votes": 7}, {"labels": ["C1"], "votes": 0}]
    view = a_view(tally={"A1": 1, "B1": 2, "C1": 0}, agree=[], by_answer=served)
    assert [group.text() for group in tally_by_answer(view, {"B1": "four"})] == [
        '"4": A1 = B1, 7 votes',
        "C1, 0 votes",
    ]
    assert 'votes by answer: "4": A1 = B1, 7 votes; C1, 0 votes' in shown(view, {"B1": "four"})


def test_no_zero_vote_leader_and_no_empty_estimate() -> None:
    view = a_view(
        tally={"A1": 0},
        leading=Leading(label="A1", votes=0, preview="x"),
        estimate=Estimate(jobs=0, note="no past job of this team on this server"),
    )
    out = shown(view)
    assert "leading" not in out and "estimate" not in out and "votes by answer" not in out
    view = a_view(tally={"A1": 1}, leading=Leading(label="A1", votes=1, preview="x"))
    assert "leading: A1 with 1 vote\n" in shown(view)


def test_lines_wrap_at_word_boundaries() -> None:
    result = {
        "winner": "C1",
        "consensus": True,
        "tally": {"A1": 1, "C1": 1, "B1": 1},
        "agree": [["A1", "C1"]],
        "reason": "every active agent voted for an answer after the last new answer was posted",
    }
    view = a_view(
        state="completed",
        result=result,
        majority="a majority: 2 of 3 votes (with A1: the same answer); every agent voted",
    )
    out = shown(view, width=50)
    assert all(len(line) <= 50 for line in out.splitlines())
    assert "2 of 3 votes" in out and "every agent voted" in out.replace("\n    ", " ")


def test_ask_closes_with_how_to_see_more_and_the_transcript_reads_as_sentences(
    capsys: pytest.CaptureFixture[str], trio: Path
) -> None:
    code, out, err = run(capsys, "ask", "What is six times seven?", "--team", str(trio))
    assert code == 0, err
    assert '"42": A1 = B1 = C1, 3 votes' in out  # the three answers say the same: one group
    job = re.search(r"cj-[0-9a-f]{12}", out)
    assert job and out.rstrip().endswith(f"See more: conclave show {job[0]} --answers | --transcript")
    _, transcript, _ = run(capsys, "show", job[0], "--transcript")
    lines = [line for line in transcript.splitlines() if line.startswith("[")]
    assert lines and not any("{" in line for line in lines), transcript
    assert any("The job started with agents " in line and "(openai/fake-ann)" in line for line in lines)
    assert any("The job finished: " in line for line in lines)
