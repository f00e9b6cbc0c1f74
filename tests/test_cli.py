"""The `conclave` command, run in-process through `main([...])`, plus one run of the installed script.

`ask` calls anyio.run itself, so these tests are plain (sync) tests; the fake providers run in a thread.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conclave.cli.main import main
from conclave.config.presets import preset_paths
from conclave.coordination.tally import by_answer
from conclave.jobs.read.views import JobView
from conclave.jobs.store.sql import Store
from conclave.settings import Settings
from tests.fakes.new_jobs import new_job
from tests.fakes.team import KEY_ENV, PROVIDER_KEYS

SHIPPED = ("frontier", "anthropic", "openai", "gemini", "ollama", "vllm", "openrouter")
COMMANDS = ("serve", "ask", "status", "show", "teams", "config", "install")
UNKNOWN_JOB = "cj-000000000000"


pytestmark = pytest.mark.usefixtures("isolated")  # tests/conftest.py: no real keys or state


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# Help ---------------------------------------------------------------------------------------------
def test_help_exits_0_and_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: conclave")
    for command in COMMANDS:
        assert f"\n    {command} " in out, command


def test_bare_conclave_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys)
    assert code == 0 and err == ""
    assert out.startswith("usage: conclave") and "conclave install claude-code --write" in out
    for command in COMMANDS:
        assert f"\n    {command} " in out, command


def test_installed_console_script_runs(tmp_path: Path) -> None:
    """The `conclave` script pip put beside this interpreter (the project installed into the venv the tests
    run in, as .ci/run does): it must exist and run; `python -m conclave` would hide a missing one."""
    script = Path(sys.executable).with_name("conclave")
    assert script.is_file(), f"no console script at {script}: install the project (pip install -e '.[test]')"
    command = [str(script), "--help"]
    env = {key: value for key, value in os.environ.items() if key not in PROVIDER_KEYS}
    env.update(CONCLAVE_HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path))
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "usage: conclave" in done.stdout
    for command_name in COMMANDS:
        assert command_name in done.stdout


# teams --------------------------------------------------------------------------------------------
def test_teams_lists_every_preset_and_the_keys_it_needs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "teams")
    assert code == 0
    lines = {line.split(":", 1)[0]: line for line in out.splitlines() if ":" in line}
    for name in SHIPPED:
        assert name in lines, f"{name} missing from:\n{out}"
    assert "openai: needs OPENAI_API_KEY\n  openai/gpt-5, " in out
    assert "anthropic: needs ANTHROPIC_API_KEY\n" in out
    assert "gemini: needs GEMINI_API_KEY\n" in out
    assert "frontier: needs ANTHROPIC_API_KEY, OPENAI_API_KEY, GEMINI_API_KEY\n" in out
    assert "openrouter: needs OPENROUTER_API_KEY\n" in out
    # anthropic and frontier each say it once; subscriptions once, in cli/claude-code's own line
    assert out.count("ANTHROPIC_API_KEY") == 3
    assert "subscriptions: needs a login to a coding-agent CLI" in out
    assert lines["local"].startswith("local: ready (a demo")
    assert "Default team: local" in out  # no key set: the offline team
    assert max(len(line) for line in out.splitlines()) <= 100


def test_teams_marks_a_team_ready_when_its_key_is_set(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    code, out, _ = run(capsys, "teams")
    assert code == 0
    assert "openai: ready\n  openai/gpt-5" in out
    assert "anthropic: needs ANTHROPIC_API_KEY" in out
    assert "frontier: needs ANTHROPIC_API_KEY, GEMINI_API_KEY" in out
    assert "Default team: openai" in out


def test_teams_shows_a_user_team(capsys: pytest.CaptureFixture[str], isolated: Path) -> None:
    user = isolated / "conclave" / "teams" / "mine.yaml"
    user.parent.mkdir(parents=True)
    user.write_text("description: my own team\nagents:\n  - model: anthropic/claude-x\n", encoding="utf-8")
    code, out, _ = run(capsys, "teams")
    assert code == 0
    assert "mine: needs ANTHROPIC_API_KEY\n  anthropic/claude-x\n  my own team\n" in out


# config check -------------------------------------------------------------------------------------
def test_config_check_accepts_a_good_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "good.yaml"
    text = "name: duo\nagents:\n  - model: openai/gpt-5\n  - model: gemini/gemini-2.5-pro\n"
    path.write_text(text, encoding="utf-8")
    code, out, err = run(capsys, "config", "check", str(path))
    assert code == 0, err
    assert f"{path}: ok - team 'duo', 2 agents: openai/gpt-5, gemini/gemini-2.5-pro" in out
    assert "note: to run it, set OPENAI_API_KEY, GEMINI_API_KEY" in out
    assert err == ""


def test_config_check_a_shipped_preset_with_its_keys_set(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    path = preset_paths(os.environ)["openai"]
    code, out, _ = run(capsys, "config", "check", str(path))
    assert code == 0
    assert "ok - team 'openai', 3 agents" in out
    assert "note:" not in out


def test_config_check_names_the_nearest_key_for_a_typo(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text("agents:\n  - model: openai/gpt-5\n    temprature: 0.3\n", encoding="utf-8")
    code, out, err = run(capsys, "config", "check", str(path))
    assert code == 2
    assert out == ""
    assert str(path) in err
    assert "'agents.0.temprature'" in err
    assert "did you mean 'temperature'?" in err


def test_config_check_malformed_yaml_names_the_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("agents:\n  - model: openai/x\n   oops: 1\n", encoding="utf-8")
    code, _, err = run(capsys, "config", "check", str(path))
    assert code == 2
    assert str(path) in err and "malformed YAML at line 3" in err


def test_config_check_a_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "config", "check", str(tmp_path / "absent.yaml"))
    assert code == 2
    assert "absent.yaml" in err and "cannot read" in err


# status -------------------------------------------------------------------------------------------
def test_status_with_no_jobs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "status")
    assert code == 0
    assert "no jobs yet" in out
    assert "conclave ask" in out


def test_status_json_with_no_jobs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "status", "--json")
    assert code == 0
    assert json.loads(out) == []


def test_status_of_an_unknown_job(capsys: pytest.CaptureFixture[str], isolated: Path) -> None:
    code, out, err = run(capsys, "status", UNKNOWN_JOB)
    assert code == 2
    assert out == ""
    assert UNKNOWN_JOB in err
    assert "conclave status" in err  # says how to list the jobs that exist
    assert err == f"conclave: no job {UNKNOWN_JOB!r} here; list recent jobs with `conclave status`\n"


# ask ----------------------------------------------------------------------------------------------
def test_ask_json_then_status(capsys: pytest.CaptureFixture[str], trio: Path) -> None:
    code, out, err = run(capsys, "ask", "What is six times seven?", "--team", str(trio), "--json")
    assert code == 0, err
    view = JobView.model_validate(json.loads(out))
    assert view.state == "completed"
    assert view.result.consensus is True
    assert view.result.winner is not None and view.result.winner in view.result.tally
    # the tally by answer is served, grouped from the result's tally and agree
    assert view.by_answer == by_answer(view.result.tally, view.result.agree) and view.by_answer
    assert view.answer is not None and view.answer.startswith("FINAL: the team's answer")
    assert view.team == "fake-team"
    assert view.task == "What is six times seven?"
    assert len(view.agents) == 3
    assert view.job_id.startswith("cj-")

    code, out, _ = run(capsys, "status", view.job_id)
    assert code == 0
    assert out.startswith(f"Job {view.job_id} (fake-team): completed")
    assert f"Winner: {view.result.winner} - a majority: 3 of 3 votes" in out and "every agent voted" in out
    assert "Final answer:" in out and view.answer in out

    code, out, _ = run(capsys, "status", view.job_id, "--json")
    assert code == 0
    again = JobView.model_validate(json.loads(out))
    assert (again.job_id, again.state, again.result.winner, again.answer) == (
        view.job_id,
        "completed",
        view.result.winner,
        view.answer,
    )

    code, out, _ = run(capsys, "status")
    assert code == 0
    listed = [line for line in out.splitlines() if line.startswith(view.job_id)]
    assert len(listed) == 1
    assert "completed" in listed[0] and "fake-team" in listed[0] and "What is six times seven?" in listed[0]
    assert "no jobs yet" not in out


def test_show_prints_what_read_workspace_serves(capsys: pytest.CaptureFixture[str], trio: Path) -> None:
    code, out, err = run(capsys, "ask", "What is six times seven?", "--team", str(trio), "--json")
    assert code == 0, err
    view = JobView.model_validate(json.loads(out))
    code, out, _ = run(capsys, "show", view.job_id)
    assert code == 0 and out.startswith(f"Job {view.job_id} (fake-team): completed")
    assert f"conclave show {view.job_id} --answers" in out and "\n  transcript\n  final\n" in out
    code, out, _ = run(capsys, "show", view.job_id, "--answers")
    assert code == 0 and out.count("\n## ") + out.startswith("## ") == 3
    winner = view.result.winner or ""
    votes = view.result.tally[winner]
    assert f"## {winner} (agent {winner[0]}, {votes} vote{'s' * (votes != 1)})\nAnswer from " in out
    code, out, _ = run(capsys, "show", view.job_id, "--transcript")
    assert code == 0 and view.job_id in out and "voted for" in out
    code, _, err = run(capsys, "show", view.job_id, "--diff")
    assert code == 2 and "no files" in err and "--context" in err and "context_paths" not in err
    code, _, show_err = run(capsys, "show", UNKNOWN_JOB)
    code, _, status_err = run(capsys, "status", UNKNOWN_JOB)
    assert code == 2 and show_err == status_err  # "job not found" is worded one way


def test_ask_prints_the_final_answer_after_a_rule(capsys: pytest.CaptureFixture[str], trio: Path) -> None:
    code, out, err = run(capsys, "ask", "What is six times seven?", "--team", str(trio))
    assert code == 0, err
    assert "Final answer" in out
    rule, _, after = out.rpartition("Final answer")
    assert "─" in rule.splitlines()[-1]  # the rule the title sits in
    assert "FINAL: the team's answer, 42, presented by" in after
    assert "a majority: 3 of 3 votes" in out and "winner" in out


def test_ask_with_an_unknown_team(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "ask", "hello", "--team", "fronteir", "--json")
    assert code == 2
    assert out == ""
    assert "'fronteir'" in err
    assert "did you mean 'frontier'?" in err
    for name in SHIPPED:
        assert name in err
    assert "Traceback" not in err


def test_ask_with_a_team_missing_its_key(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "keyless.yaml"
    agent = {"model": "openai/gpt-5", "base_url": "http://127.0.0.1:9/v1", "api_key_env": KEY_ENV}
    data = {"agents": [agent]}
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    code, out, err = run(capsys, "ask", "hello", "--team", str(path), "--json")
    assert code == 2
    assert out == ""
    assert KEY_ENV in err and "needs an API key" in err
    code, out, _ = run(capsys, "status")
    assert "no jobs yet" in out  # nothing was queued


def test_context_arguments_parse_permissions() -> None:
    from conclave.cli.commands import context_arguments

    assert context_arguments(["/a", "/b:write", "/c:d:read"]) == [
        {"path": "/a", "permission": "read", "allow_secrets": False},
        {"path": "/b", "permission": "write", "allow_secrets": False},
        {"path": "/c:d", "permission": "read", "allow_secrets": False},
    ]


def test_ask_with_context_and_apply_writes_nothing_without_changes(
    capsys: pytest.CaptureFixture[str], trio: Path, tmp_path: Path
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "main.py").write_text("print('hi')\n")
    code, out, err = run(
        capsys,
        "ask",
        "Review main.py",
        "--team",
        str(trio),
        "--json",
        "--context",
        f"{project}:write",
        "--apply",
    )
    assert code == 0, err
    view = JobView.model_validate_json(out)
    assert view.state == "completed" and view.diff_summary is not None
    assert (
        view.diff_summary.model_dump()["contexts"][0]["files"] == []
        and view.diff_summary.model_dump()["contexts"][0]["applied"] is False
    )
    assert (project / "main.py").read_text() == "print('hi')\n"
    code, out, _ = run(capsys, "show", view.job_id, "--file", "proj/main.py")
    assert code == 0 and out == "print('hi')\n"  # the final tree, as read_workspace serves it
    code, out, _ = run(capsys, "show", view.job_id, "--diff")
    assert code == 0 and out.strip() == ""  # nothing changed, so an empty patch
    code, out, _ = run(capsys, "show", view.job_id)
    assert "@diff" in out and "proj/main.py" in out


def test_ask_apply_without_a_write_context_is_refused(capsys: pytest.CaptureFixture[str], trio: Path) -> None:
    _code, _, err = run(capsys, "ask", "t", "--team", str(trio), "--apply")
    assert err == "conclave: --apply: applying needs a --context PATH:write folder\n"


def test_ask_budget_and_verify_flags_reach_the_job(capsys: pytest.CaptureFixture[str], trio: Path) -> None:
    code, _, err = run(capsys, "ask", "t", "--team", str(trio), "--max-cost", "0.5")
    assert code == 2 and err.startswith("conclave: --max-cost 0.5: a cost budget needs a price")
    assert "bound the job with --max-tokens instead" in err
    code, _, err = run(capsys, "ask", "t", "--team", str(trio), "--verify", "python3 -m unittest")
    assert code == 2 and err.startswith("conclave: --verify 'python3 -m unittest': ") and "--context" in err
    code, out, err = run(
        capsys, "ask", "What is six times seven?", "--team", str(trio), "--json", "--max-tokens", "1"
    )
    view = JobView.model_validate(json.loads(out))
    assert view.budget == {"max_tokens": 1} and (view.result.reason or "").startswith("budget reached: "), err


def test_teams_shows_typical_usage_once_a_team_has_run(
    capsys: pytest.CaptureFixture[str], trio: Path, isolated: Path
) -> None:
    mine = isolated / "conclave" / "teams" / "fake-team.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text(trio.read_text())
    assert "typically" not in run(capsys, "teams")[1]
    code, out, _ = run(capsys, "ask", "What is six times seven?", "--team", "fake-team", "--json")
    tokens = JobView.model_validate(json.loads(out)).usage.tokens
    code, out, _ = run(capsys, "teams")
    assert (
        code == 0
        and "fake-team: ready" in out
        and f"typically {tokens:,} tokens per job (1 past job here)" in out
    )


def test_ask_with_a_missing_context_folder(capsys: pytest.CaptureFixture[str], trio: Path) -> None:
    code, _, err = run(capsys, "ask", "t", "--team", str(trio), "--context", "/no/such/folder")
    assert code == 2 and err.startswith("conclave: --context '/no/such/folder': it does not exist; give an ")
    assert "Value error" not in err


def test_doctor_reports_each_check_with_its_fix(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "doctor")
    lines = out.splitlines()
    names = (
        "state directory",
        "job store",
        "docker engine",
        "openai key",
        "anthropic key",
        "gemini key",
        "local model",
    )
    for name in names:
        assert any(name in line for line in lines), (name, out)
    assert "OPENAI_API_KEY not set -> export OPENAI_API_KEY=" in out  # keys are cleared by `isolated`
    if "docker engine: version" in out:
        assert "CLI image: conclave-sandbox-clis:" in out, out
    failing = [line for line in lines if line.startswith("[FAIL]")]
    assert code == (1 if failing else 0)
    assert all("->" in line for line in lines if not line.startswith("[ok"))


def test_doctor_shows_the_store_and_each_callers_line(
    capsys: pytest.CaptureFixture[str], isolated: Path
) -> None:
    store = Store.of(Settings(home=isolated / "state"))  # the suite's database, when it runs on PostgreSQL
    try:
        for index, caller in enumerate(("alice", "alice", "bob")):
            store.create_job(new_job(f"cj-00000000000{index}", "t", caller=caller), 1, "owner")
        store.heartbeat("owner", 60.0)
    finally:
        store.close()
    _, out, _ = run(capsys, "doctor")
    line = next(line for line in out.splitlines() if "job store" in line)
    assert line.startswith("[ok  ] job store:") and "3 jobs, 3 queued" in line, line
    assert "queued per caller: alice 2, bob 1" in line and "lease run out" not in line, line


def test_the_live_view_says_whether_there_was_a_majority_and_by_how_many_votes() -> None:
    from rich.console import Console

    from conclave.cli.render import render
    from conclave.coordination.reports import JobResult
    from conclave.jobs.read.views import majority_text

    def shown(**result: object) -> str:
        outcome = JobResult(answer="x", reason="every active agent voted", **result)  # type: ignore[arg-type]
        view = JobView(
            job_id="cj-000000000001",
            state="completed",
            phase="done",
            elapsed_s=3,
            team="t",
            task="q",
            result=outcome,
            majority=majority_text(outcome),
            next="-",
        )
        console = Console(record=True, width=160)
        console.print(render(view))
        return console.export_text()

    tie = shown(
        winner="B1", consensus=False, tie=True, tally={"B1": 1, "A1": 1}, votes=1, voters=2, all_voted=True
    )
    assert (
        "winner B1: no majority: 1 of 2 votes, a tie broken by the earliest answer; every agent voted" in tie
    )
    won = shown(
        winner="C1",
        consensus=True,
        tally={"A1": 1, "C1": 1, "B1": 1},
        votes=2,
        voters=3,
        all_voted=True,
        agree=[["A1", "C1"]],
    )
    assert "winner C1: a majority: 2 of 3 votes (with A1: the same answer); every agent voted" in won
    late = shown(winner="A1", consensus=False, tally={"A1": 1, "B1": 0}, votes=1, voters=1, fallback=True)
    assert (
        "winner A1: no majority: the vote did not finish; the best-supported answer so far has 1 of 1 vote"
        in late
    )


def test_ask_follow_up_show_thread_and_steering_a_finished_job(
    capsys: pytest.CaptureFixture[str], trio: Path
) -> None:
    code, out, err = run(capsys, "ask", "What is six times seven?", "--team", str(trio), "--json")
    first = JobView.model_validate(json.loads(out))
    code, out, err = run(capsys, "ask", "Now say it in words.", "--follow-up", first.job_id, "--json")
    assert code == 0, err
    second = JobView.model_validate(json.loads(out))
    assert second.follow_up == first.job_id and second.thread == [first.job_id, second.job_id]
    code, out, _ = run(capsys, "show", second.job_id, "--thread")
    body = out.split("\n\n", 1)[1]  # after the heading, the jobs oldest first
    assert (
        code == 0
        and body.index(first.job_id) < body.index(f"*2. {second.job_id}")
        and "six times seven" in body
    )
    code, out, _ = run(capsys, "show", second.job_id)
    assert f"Thread: {first.job_id} -> {second.job_id}" in out
    code, _, err = run(capsys, "steer", first.job_id, "use French")
    assert code == 2 and "follow_up=" in err and "conclave ask --follow-up" in err
