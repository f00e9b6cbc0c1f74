"""A setuid plant: an agent's command makes setuid/setgid and world-writable files in its workspace (which
sits on the host); once the command returns, none of those bits is left."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from conclave.sandbox.container import Sandbox

pytestmark = pytest.mark.anyio


async def test_setuid_setgid_and_world_writable_bits_are_cleared_after_each_command(
    box: Sandbox, workspace: Path
) -> None:
    planted = await box.exec(
        "cp /bin/sh ./rootshell && chmod 4755 rootshell && mkdir shared && chmod 2777 shared && "
        "echo x > shared/open.txt && chmod 0666 shared/open.txt && cp /bin/true gid && chmod 2711 gid && "
        "ln -s rootshell link && ls -l",
        timeout_s=20,
    )
    assert planted.exit_code == 0, planted.as_text()
    modes = {
        name: stat.S_IMODE(os.lstat(workspace / name).st_mode)
        for name in ("rootshell", "shared", "shared/open.txt", "gid")
    }
    assert modes == {"rootshell": 0o755, "shared": 0o775, "shared/open.txt": 0o664, "gid": 0o711}, {
        name: oct(mode) for name, mode in modes.items()
    }
    for path in workspace.rglob("*"):
        info = os.lstat(path)
        if not stat.S_ISLNK(info.st_mode):
            assert not info.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_IWOTH), path
