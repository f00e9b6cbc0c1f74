"""A CLI member's login file goes only into the private HOME of its container: a tmpfs (never the
host's disk), mode 0600 under a 0700 folder, written through the exec's environment, which is unset
before the CLI starts. The workspace, and so every snapshot, diff and check copy made from it, never
holds it. Needs the Docker engine and the CLI image."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from conclave.clis.claude_code import ClaudeCode
from conclave.clis.cli_adapter import Login
from conclave.clis.member import CliMember
from conclave.config.loading import parse_team
from conclave.config.models import SandboxSpec
from conclave.sandbox.allowlist import allowlist_for
from conclave.sandbox.clis_image import clis_tag
from conclave.sandbox.egress import egress_proxy
from conclave.sandbox.engine import engine_status
from conclave.sandbox.member import MemberSandbox
from conclave.sandbox.route import DirectRoute

pytestmark = pytest.mark.anyio
TOKEN = "sk-ant-oat01-" + "l0g1n" * 10


@dataclass
class Probe(ClaudeCode):
    """Claude Code's HOME files and environment, but a command that shows what the CLI would see."""

    def command(
        self, prompt: str, model: str | None, schema: dict[str, Any] | None, brief: bool, login: Login
    ) -> list[str]:
        return [
            "sh",
            "-c",
            'stat -c "%a %U %n" "$HOME" "$HOME/.claude/.credentials.json"; '
            'grep " $HOME " /proc/mounts; env; echo "{\\"result\\": \\"ok\\"}"',
        ]


@pytest.fixture
def clis_image() -> str:
    status = engine_status(clis_tag())
    if not status.available or not status.image_present:
        pytest.skip(
            f"needs the Docker engine and the CLI image ({status.error}): `conclave sandbox build --clis`"
        )
    return clis_tag()


async def test_the_login_file_lands_only_in_the_private_tmpfs_home(clis_image: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    (home / ".claude" / ".credentials.json").write_text(json.dumps({"claudeAiOauth": {"accessToken": TOKEN}}))
    spec = parse_team({"agents": [{"model": "cli/claude-code"}]}, "t.yaml").agents[0]
    member = CliMember.for_spec(spec, {"HOME": str(home)})
    member.adapter = Probe()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    async with egress_proxy(allowlist_for("claude-code"), route=DirectRoute()) as proxy:
        box = MemberSandbox(None, egress=proxy)
        await box.start(workspace, {}, "cj-0123456789ab", "A", SandboxSpec())
        try:
            member.bind(box)
            assert (await member.run("hello")).text == "ok"  # the run as a turn makes it
            command, environment = member.script("hello", None)
            seen = (await box.exec(command, 30, environment=environment)).stdout  # what the CLI saw
            later = (await box.exec("env; ls -la /workspace", 30)).stdout  # any other command
        finally:
            with anyio.CancelScope(shield=True):
                await box.stop()
    encoded = next(v for k, v in environment.items() if k.startswith("CONCLAVE_HOME_FILE_"))
    assert (
        "700 sandbox /home/sandbox" in seen and "600 sandbox /home/sandbox/.claude/.credentials.json" in seen
    )
    assert " /home/sandbox tmpfs " in seen  # in the container's memory, never on the host's disk
    assert encoded not in seen and TOKEN not in seen  # the variables were unset before the CLI started
    assert TOKEN not in later and encoded not in later
    assert not [p for p in workspace.rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()]
