"""Model text cannot drive the user's terminal: `conclave show`, `status` and `ask` print answers, errors
and check output with escape sequences and control characters stripped (server/cli/terminal.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conclave.cli.main import main
from conclave.cli.terminal import printable
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_DESTINATION, KEY_ENV, TRIO, install, voter, write_team

# retitle the window, clear the screen, write the clipboard (OSC 52), hide text, overwrite the line
HOSTILE = "42 \x1b]0;pwned\x07\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07\x1b[8mhidden\x1b[0m\rfake prompt $ \x9b31m"


def test_printable_strips_sequences_and_controls_but_keeps_text() -> None:
    assert printable("a\x1b[31mred\x1b[0m\tb\nc") == "ared\tb\nc"
    assert printable("x\x1bP1;2|secret\x1b\\y\x07\x08\x00z") == "xyz"
    assert printable("é 中 \u202eevil") == "é 中 evil"
    assert "\x1b" not in printable(HOSTILE) and "\r" not in printable(HOSTILE) and "42 " in printable(HOSTILE)


def test_conclave_show_and_status_print_no_control_sequence(
    tmp_path: Path, fakes: FakeProviders, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in list(os.environ):
        if name.startswith("CONCLAVE_"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CONCLAVE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv(KEY_ENV, "test-key")
    monkeypatch.setenv("CONCLAVE_KEY_DESTINATIONS", KEY_DESTINATION)  # the fakes' URLs take the fake key
    install(
        fakes.script,
        TRIO,
        voter(
            answer=lambda request: f"{HOSTILE} ({request.agent})", final=lambda request: f"FINAL {HOSTILE}"
        ),
    )
    team = write_team(tmp_path / "trio.yaml", fakes, TRIO)
    assert main(["ask", "What is six times seven?", "--team", str(team), "--json"]) == 0
    job_id = json.loads(capsys.readouterr().out)["job_id"]
    for argv in (
        ["show", job_id],
        ["show", job_id, "--answers"],
        ["show", job_id, "--transcript"],
        ["status", job_id],
    ):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert "42 " in out, argv
        for control in ("\x1b", "\x07", "\r", "\x9b"):
            assert control not in out, (argv, control, out[:300])
