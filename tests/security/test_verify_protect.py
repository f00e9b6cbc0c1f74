"""Checks test the answer, not the answer's tests: three answers leave calc.py wrong and try to pass the
caller's `python3 -m pytest -q` anyway (by rewriting the test to `assert True`, by adding a conftest.py
that skips everything, by adding a json.py that shadows the standard library and exits 0); a fourth
fixes calc.py. Real Docker, the fake providers through the real SDKs (files/protect.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from conclave.files.protect import DEFAULT_PROTECT, Protection, restore, shadows
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.calc_task import CALC, TESTS, label_of
from tests.fakes.environment import environment_of
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, decide, write_team

pytestmark = pytest.mark.anyio
CHECK = "python3 -m pytest -q"
QUARTET = (("openai", "ann"), ("anthropic", "bob"), ("gemini", "cy"), ("openai", "dan"))
SKIP_ALL = (
    "import pytest\n\n\ndef pytest_collection_modifyitems(items):\n"
    "    for item in items:\n        item.add_marker(pytest.mark.skip(reason='not today'))\n"
)
SHADOW = "import os\nprint('1 passed in 0.01s')\nos._exit(0)\n"
EXIT = "import os\nos._exit(0)\n"
MOVES: dict[str, tuple[str, dict[str, Any]]] = {
    "ann": ("write_file", {"path": "test_calc.py", "content": "def test_add():\n    assert True\n"}),
    "bob": ("write_file", {"path": "conftest.py", "content": SKIP_ALL}),
    "cy": ("write_file", {"path": "json.py", "content": SHADOW}),
    "dan": ("edit_file", {"path": "calc.py", "old_text": "return a - b", "new_text": "return a + b"}),
}


def agent(request: RecordedRequest) -> Reply:
    """Makes its move, answers, then votes for ann's answer (the test-editing one); dan votes for its own."""
    me = request.agent
    if label_of(request, me) is None:
        if "wrote " not in request.text() and "replaced 1 occurrence" not in request.text():
            name, arguments = MOVES[me]
            return Reply(tool_calls=[(name, arguments)])
        return decide("new_answer", {"content": f"add() now passes its tests ({me})."}, request)
    target = (me != "dan" and label_of(request, "ann")) or label_of(request, me)
    return decide("vote", {"answer": target, "reason": "its tests pass"}, request)


@pytest.mark.usefixtures("docker_image")
async def test_editing_skipping_or_shadowing_the_tests_does_not_make_a_wrong_answer_pass(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "calc.py").write_text(CALC)
    (project / "test_calc.py").write_text(TESTS)
    for _, name in QUARTET:
        fakes.script.set_default(name, agent)
    team = str(write_team(tmp_path / "team.yaml", fakes, QUARTET, coordination={"final": "reuse"}))
    async with JobService.serve(
        environment_of(
            Settings(home=tmp_path / "state", verify_concurrency=2), {KEY_ENV: "test-key-0123456789"}
        )
    ) as service:
        view = await service.submit(
            JobRequest(
                task="Fix add() in calc.py.", team=team, context_paths=[{"path": str(project)}], verify=CHECK
            )
        )
        with anyio.fail_after(240):
            while not view.done:
                view = await service.wait(view.job_id, 10)
        letters = {a.model.rsplit("-", 1)[1]: a.letter for a in view.agents}
        label = {name: f"{letters[name]}1" for name in letters}
        shadow_output = (
            await service.lookup.read(view.job_id, f"verify/{label['cy']}", None, 0, 100_000)
        ).content
    checks = view.checks()
    assert checks[label["dan"]].startswith("passed in "), checks
    assert "(1 test passed; the original files ran 1)" in checks[label["dan"]]  # the runner's count
    for name, protected in (("ann", "test_calc.py"), ("bob", "conftest.py"), ("cy", "json.py")):
        assert checks[label[name]].startswith("failed (exit 1)"), (name, checks[label[name]])
        assert f"this answer changed protected files {protected}" in checks[label[name]]
    assert "1 passed in 0.01s" not in shadow_output and "put back before the check: json.py" in shadow_output
    # the voters' favourite (ann's, 3 votes) failed its check
    assert view.result.winner == label["dan"], view.text()


def test_restore_puts_back_and_removes_only_what_the_patterns_and_shadowing_name(tmp_path: Path) -> None:
    base, copy = tmp_path / "base", tmp_path / "copy"
    for root in (base, copy):
        (root / "tests").mkdir(parents=True)
        (root / "tests" / "test_a.py").write_text("assert 1\n")
        (root / "pkg").mkdir()
        (root / "pkg" / "json.py").write_text("# not at the top level: never imported instead of json\n")
    (base / "package.json").write_text('{"scripts": {"test": "jest"}}\n')
    (copy / "package.json").write_text('{"scripts": {"test": "true"}}\n')
    (copy / "tests" / "test_a.py").unlink()
    (copy / "tests" / "test_new.py").write_text("assert 1\n")
    (copy / "unittest").mkdir()
    (copy / "unittest" / "__init__.py").write_text("raise SystemExit(0)\n")
    (copy / "html").mkdir()  # a folder without __init__.py never wins over the standard module
    (copy / "app.py").write_text("print('the answer')\n")
    changed = restore(copy, base, Protection(DEFAULT_PROTECT))
    assert changed == ["package.json", "tests/test_a.py", "tests/test_new.py", "unittest/__init__.py"]
    assert (copy / "package.json").read_text() == '{"scripts": {"test": "jest"}}\n'
    assert (copy / "tests" / "test_a.py").exists() and not (copy / "tests" / "test_new.py").exists()
    assert not (copy / "unittest" / "__init__.py").exists() and (copy / "html").is_dir()
    assert (copy / "pkg" / "json.py").exists() and (copy / "app.py").exists()
    assert shadows("json.py", False) and shadows("_pytest", True, True) and not shadows("json.md", False)
    assert shadows("_pytest.abi3.so", False) and shadows("attr.py", False) and shadows("py.py", False)
    assert shadows("json.cpython-311-x86_64-linux-gnu.so", False) and not shadows("calc.py", False)


def test_restore_puts_back_runner_files_and_shadowing_whether_or_not_the_folder_was_there(
    tmp_path: Path,
) -> None:
    base, copy = tmp_path / "base", tmp_path / "copy"
    for root in (base, copy):
        (root / "json").mkdir(parents=True)
        (root / "json" / "data.json").write_text("{}\n")  # a folder of data, not a package
        (root / "queue").mkdir()
        (root / "queue" / "__init__.py").write_text("# the project's own package, shadowing from the start\n")
    (copy / "json" / "__init__.py").write_text(EXIT)
    (copy / "queue" / "__init__.py").write_text("# the answer's change to the project's own package\n")
    (copy / ".pytest.ini").write_text("[pytest]\naddopts = --collect-only\n")
    (copy / "__init__.py").write_text(EXIT)
    (copy / "sub").mkdir()
    (copy / "sub" / "__init__.py").write_text("# a package below the root: the answer's own\n")
    (copy / "sub" / "types.py").write_text("# sub.types, never imported as types\n")
    for root in (base, copy):  # checks beside their code: pytest puts lib/ first on sys.path
        (root / "lib").mkdir()
        (root / "lib" / "test_lib.py").write_text("import json\n")
    (copy / "lib" / "json.py").write_text(EXIT)
    changed = restore(copy, base, Protection([]))  # whatever the patterns
    assert changed == ["json/__init__.py", "lib/json.py"]
    assert (copy / ".pytest.ini").exists() and (copy / "sub" / "types.py").exists()
    changed = restore(copy, base, Protection(DEFAULT_PROTECT))
    assert changed == [".pytest.ini", "__init__.py"]
    assert (copy / "json" / "data.json").exists() and not (copy / "json" / "__init__.py").exists()
    assert "the answer's change" in (copy / "queue" / "__init__.py").read_text()
    assert (copy / "sub" / "__init__.py").exists()
    # a script the command names runs with its own folder first on sys.path, as in a terminal
    for root in (base, copy):
        (root / "scripts").mkdir()
        (root / "scripts" / "check.py").write_text("import json\n")
    (copy / "scripts" / "json.py").write_text(EXIT)
    (copy / "scripts" / "types.py").write_text(EXIT)
    assert restore(copy, base, Protection([])) == []  # no command names scripts/check.py
    named = Protection([], command="cd . && python3 ./scripts/check.py --fast")
    assert restore(copy, base, named) == ["scripts/json.py", "scripts/types.py"]
    assert not (copy / "scripts" / "json.py").exists() and (copy / "scripts" / "check.py").exists()
    assert Protection([], command="python3 proj/scripts/check.py").roots("proj/") == {"scripts"}
    assert Protection([], command="python3 test_calc.py").roots("") == {""}
