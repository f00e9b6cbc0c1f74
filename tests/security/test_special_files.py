"""FIFOs and huge sparse files in a workspace: the tools never block on one and never read one into memory."""

from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Any

import pytest

from conclave.files.agent_tools import AgentTools
from tests.security.conftest import within

SIX_GB = 6 * 2**30


@pytest.fixture
def tools(workspace: Path) -> AgentTools:
    (workspace / "src").mkdir()
    (workspace / "src" / "a.py").write_text("x = 1\n")
    return AgentTools(workspace, peers=dict)


def call(tools: AgentTools, name: str, **args: Any) -> str:
    return within(10, lambda: tools.handlers()[name](args))


def test_a_fifo_is_never_opened_and_never_blocks(tools: AgentTools, workspace: Path) -> None:
    fifos = [workspace / "src" / "pipe", workspace / "src" / "pipe2"]
    for fifo in fifos:
        os.mkfifo(fifo)
    try:
        written = call(
            tools, "write_file", path="src/pipe", content="written\n"
        )  # no reader: open() would block
        assert written.startswith("wrote"), written
        assert fifos[0].read_text() == "written\n"  # the FIFO was replaced, not written through
        for name, args in [
            ("read_file", {"path": "src/pipe2"}),
            ("edit_file", {"path": "src/pipe2", "old_text": "a", "new_text": "b"}),
        ]:
            result = call(tools, name, **args)
            assert "Error:" in result and "FIFO" in result, result
        assert "x = 1" in call(tools, "search", pattern="x")
    finally:
        for fifo in fifos:  # release a writer a blocking implementation left in open()
            if fifo.exists() and not fifo.is_file():
                os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))


def test_a_sparse_6gb_file_is_refused_by_its_size_not_read(tools: AgentTools, workspace: Path) -> None:
    with open(workspace / "src" / "huge.log", "wb") as handle:
        handle.truncate(SIX_GB)
    # Reading it would take 6 GB: cap the address space at 1 GB above what the process holds now, so a
    # tool that reads it fails with MemoryError rather than taking the machine's memory.
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as statm:
        now = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (now + 2**30, hard))
    try:
        read = call(tools, "read_file", path="src/huge.log")
        edit = call(tools, "edit_file", path="src/huge.log", old_text="a", new_text="b")
        found = call(tools, "search", pattern="never there")
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    for result in (read, edit):
        assert result.startswith("Error:") and "6,442,450,944 bytes" in result and "cap" in result, result
    assert "not searched" in found
