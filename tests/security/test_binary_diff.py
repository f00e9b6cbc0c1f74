"""A change hidden in a text file that became binary: the diff flags it with an escaped excerpt of the new
bytes, and apply holds it back unless the caller consents (force_binary)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conclave.files.contexts import ContextPath
from conclave.files.job_folder import JobFolder
from conclave.files.review import Consent
from conclave.files.workspaces import Workspaces

pytestmark = pytest.mark.anyio
HIDDEN = (
    b"def check(token):\n    return True  # \x00 everything below is hidden from a text diff\nimport os\n"
)


@pytest.fixture
async def job(tmp_path: Path) -> tuple[Workspaces, Path]:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "auth.py").write_bytes(b"def check(token):\n    return token == SECRET\n")
    (project / "notes.md").write_text("notes\n")
    spaces = Workspaces(JobFolder(tmp_path, "job"))
    await spaces.prepare([ContextPath(path=str(project), permission="write")])
    await spaces.create(["A"])
    (spaces.agent("A") / "proj" / "auth.py").write_bytes(HIDDEN)
    (spaces.agent("A") / "proj" / "notes.md").write_text("notes, edited\n")
    await spaces.snapshot("A", "A1")
    await spaces.finalize("A1")
    return spaces, project


async def test_a_text_file_that_became_binary_is_shown_with_an_escaped_excerpt(job) -> None:
    spaces, _ = job
    patch = (await spaces.diffs())["proj"]
    auth = next(change for change in patch.files if change.path == "auth.py")
    assert auth.status == "binary" and auth.became_binary
    assert "became binary (a NUL byte at offset" in patch.text
    assert "#   " in patch.text and "return True  # \\x00 everything below is hidden" in patch.text
    assert "import os\\n" in patch.text  # what follows the NUL is shown too


async def test_apply_holds_it_back_without_consent_and_applies_it_with(job) -> None:
    spaces, project = job
    done = await spaces.apply("proj")
    assert [(entry.path, entry.reason) for entry in done.held] == [("auth.py", "became_binary")]
    assert "force_binary" in done.held[0].fix
    assert (project / "auth.py").read_bytes() == b"def check(token):\n    return token == SECRET\n"
    assert (project / "notes.md").read_text() == "notes, edited\n"  # what the patch shows as text applies
    (project / "notes.md").write_text("notes\n")  # as at job start again, to apply with consent
    await spaces.apply("proj", consent=Consent(force_binary=True))
    assert (project / "auth.py").read_bytes() == HIDDEN
    assert (project / "notes.md").read_text() == "notes, edited\n"
