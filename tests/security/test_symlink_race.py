"""The symlink-swap race: a process in the agent's container keeps swapping a workspace folder (and a file)
with a symlink to a host path while the host-side tools read, write and search there.

The racer exchanges the names atomically (renameat2 RENAME_EXCHANGE) in a tight loop; every tool call in
the meantime must keep to the workspace: no host secret in any result, the host files untouched.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from conclave.files.agent_tools import AgentTools
from conclave.sandbox.container import Sandbox, container_user

pytestmark = pytest.mark.anyio
SECRET = "HOST-SECRET-7f3a9c"
RACE_S = 6.0
# Swaps /workspace/d (a folder) with /workspace/l (a link to the host folder), and /workspace/f.txt (a
# file) with /workspace/fl (a link to the host secret), as fast as it can, for argv[3] seconds.
RACER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
swap = lambda a, b: libc.renameat2(-100, a, -100, b, 2)
os.chdir("/workspace")
for name, target in (("l", sys.argv[1]), ("fl", sys.argv[2])):
    if not os.path.lexists(name):
        os.symlink(target, name)
end, n = time.time() + float(sys.argv[3]), 0
while time.time() < end:
    swap(b"d", b"l"); swap(b"f.txt", b"fl"); n += 1
if os.path.islink("d"):
    swap(b"d", b"l")
if os.path.islink("f.txt"):
    swap(b"f.txt", b"fl")
print(n)
"""


@pytest.fixture
def host(tmp_path: Path) -> Path:
    folder = tmp_path / "host"
    folder.mkdir()
    (folder / "secret.txt").write_text(f"{SECRET}\n")
    return folder


async def test_a_racer_cannot_turn_the_file_tools_onto_host_files(
    box: Sandbox, workspace: Path, host: Path
) -> None:
    (workspace / "d").mkdir()
    (workspace / "d" / "secret.txt").write_text("decoy inside the workspace\n")
    (workspace / "f.txt").write_text("a workspace file\n")
    tools = AgentTools(workspace, peers=dict, owner=container_user())
    handlers = tools.handlers()
    calls = [
        ("read_file", {"path": "d/secret.txt"}),
        ("write_file", {"path": "d/secret.txt", "content": "PWNED\n"}),
        ("read_file", {"path": "f.txt"}),
        ("write_file", {"path": "f.txt", "content": "PWNED\n"}),
        ("edit_file", {"path": "d/secret.txt", "old_text": "PWNED", "new_text": "PWNED"}),
        ("search", {"pattern": "SECRET", "path": "d"}),
        ("search", {"pattern": "SECRET"}),
        ("list_files", {"path": "d"}),
    ]
    results: list[str] = []
    racer: list[str] = []

    async def race() -> None:
        script = RACER.replace('"', '\\"')
        command = f'python3 -c "{script}" {host} {host / "secret.txt"} {RACE_S}'
        racer.append((await box.exec(command, timeout_s=RACE_S + 20)).as_text())

    async with anyio.create_task_group() as tg:
        tg.start_soon(race)
        await anyio.sleep(1.0)  # sleep-ok: the racer is running (the race only gets harder to win)
        end = time.monotonic() + RACE_S - 2
        while time.monotonic() < end:
            for name, args in calls:
                results.append(await handlers[name](dict(args)))
    assert "exit code 0" in racer[0], racer[0]
    assert int(racer[0].split("--- stdout ---")[1].split()[0]) > 1000, racer[0]  # it really raced
    assert len(results) > 200
    leaked = [result for result in results if SECRET in result]
    assert not leaked, f"{len(leaked)} of {len(results)} tool results hold the host secret: {leaked[:3]}"
    assert (host / "secret.txt").read_text() == f"{SECRET}\n"
    assert sorted(path.name for path in host.iterdir()) == ["secret.txt"]
