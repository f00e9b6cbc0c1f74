"""The sandbox, for real against the Docker engine: confinement, limits, timeouts, output caps, cleanup."""

from __future__ import annotations

import os
import sys
import threading
import traceback
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from conclave.config.models import SandboxSpec
from conclave.errors import SandboxError
from conclave.files.job_folder import JobFolder
from conclave.jobs.store.owners import process_alive
from conclave.sandbox.command_runner import Runner
from conclave.sandbox.container import ENVIRONMENT, Sandbox
from conclave.sandbox.engine import Owner, connect, engine_status, sweep
from conclave.sandbox.image import build_image, default_tag, host_apt_sources, image_tag
from conclave.sandbox.output import _Capped

pytestmark = pytest.mark.anyio
SPEC = SandboxSpec(memory="256m", cpus=1, pids=64)


@pytest.fixture(scope="session")
def sandbox_image() -> str:
    """The image, built once per session (about a minute the first time on a machine, then a no-op)."""
    status = engine_status()
    if not status.available:
        pytest.skip(f"no Docker engine reachable, sandbox tests skipped: {status.error}")
    report = anyio.run(build_image)
    print(
        f"\nsandbox image {report.tag}: {report.size_bytes / 1e6:.0f} MB, built={report.built}, "
        f"{report.seconds:.1f} s"
    )
    return report.tag


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    (path / "hello.txt").write_text("hello\n")
    return path


@pytest.fixture
def peers(tmp_path: Path) -> dict[str, Path]:
    """Peers' fixed folders as the workspace layer keeps them: B has answered, C not yet (no folder)."""
    (tmp_path / "peers" / "B").mkdir(parents=True)
    (tmp_path / "peers" / "B" / "answer.py").write_text("print('from B1')\n")
    return {"B": tmp_path / "peers" / "B", "C": tmp_path / "peers" / "C"}


@pytest.fixture
async def box(sandbox_image: str, workspace: Path, peers: dict[str, Path]) -> AsyncIterator[Sandbox]:
    sandbox = Sandbox(connect(), Owner("test-" + os.urandom(4).hex()))
    try:
        await sandbox.start(workspace, peers, "cj-test", "A", SPEC)
        yield sandbox
    finally:
        with anyio.CancelScope(shield=True):
            await sandbox.stop()


async def test_a_command_returns_stdout_stderr_and_exit_code_apart(box: Sandbox) -> None:
    result = await box.exec("echo out; echo err >&2; exit 3", timeout_s=10)
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert not result.timed_out and result.notes == ()
    assert "exit code 3" in result.as_text()


async def test_runs_in_the_workspace_as_a_non_root_user(box: Sandbox) -> None:
    result = await box.exec("pwd; id -u; id -g; echo $HOME", timeout_s=10)
    assert result.stdout.split() == ["/workspace", str(box.uid), str(box.gid), "/workspace"]
    assert box.uid != 0
    if os.getuid() == 0:
        assert box.uid == 1000


async def test_no_host_environment_reaches_the_container(
    sandbox_image: str, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.setenv(name, "sk-secret-" + name)
    sandbox = Sandbox(connect())
    try:
        # started while the keys are set
        await sandbox.start(workspace, {}, "cj-env", "A", SPEC)
        result = await sandbox.exec("env", timeout_s=10)
    finally:
        await sandbox.stop()
    seen = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert "sk-secret" not in result.stdout
    assert set(seen) <= set(ENVIRONMENT) | {"HOSTNAME", "PWD", "SHLVL", "_"}
    assert seen["HOME"] == "/workspace"


async def test_no_network(box: Sandbox) -> None:
    connect_out = (
        "python3 -c 'import socket; s = socket.socket(); s.settimeout(3); s.connect((\"1.1.1.1\", 53))'"
    )
    result = await box.exec(connect_out, timeout_s=10)
    assert result.exit_code != 0 and "unreachable" in result.stderr.lower()
    assert (await box.exec("getent hosts deb.debian.org", timeout_s=10)).exit_code != 0
    interfaces = await box.exec("ls /sys/class/net", timeout_s=10)
    assert interfaces.stdout.split() == ["lo"]


async def test_writes_only_to_workspace_and_tmp(box: Sandbox, workspace: Path) -> None:
    for target in ("/x", "/usr/x", "/etc/x", "/peers/x", "/peers/B/x"):
        result = await box.exec(f"echo no > {target}", timeout_s=10)
        assert result.exit_code != 0, target
        assert "read-only" in result.stderr.lower() or "permission denied" in result.stderr.lower()
    result = await box.exec("echo yes > /workspace/made.txt && echo t > /tmp/t && cat /tmp/t", timeout_s=10)
    assert (result.exit_code, result.stdout) == (0, "t\n")
    assert (workspace / "made.txt").read_text() == "yes\n"
    assert (await box.exec("sed -i s/hello/bye/ hello.txt", timeout_s=10)).exit_code == 0
    assert (workspace / "hello.txt").read_text() == "bye\n"  # a file the host wrote is the agent's to edit
    (workspace / "src").mkdir()  # written on the host after start (root-owned when the server is root)
    (workspace / "src" / "new.py").write_text("x = 1\n")
    assert (await box.exec("echo y = 2 >> src/new.py && touch src/more.py", timeout_s=10)).exit_code == 0
    assert (workspace / "src" / "new.py").read_text() == "x = 1\ny = 2\n"


async def test_peers_are_readable_read_only_and_refreshed_in_place(
    box: Sandbox, peers: dict[str, Path]
) -> None:
    result = await box.exec("python3 /peers/B/answer.py && ls /peers && ls -A /peers/C | wc -l", timeout_s=10)
    assert result.stdout.split() == ["from", "B1", "B", "C", "0"]
    writes = ("echo x > /peers/B/answer.py", "rm /peers/B/answer.py", "touch /peers/C/x", "touch /peers/D")
    for command in writes:
        result = await box.exec(command, timeout_s=10)
        assert result.exit_code != 0 and "read-only" in result.stderr.lower(), command
    (peers["B"] / "answer.py").unlink()  # B2 and C1 land in the same folders, in place
    (peers["B"] / "answer.py").write_text("print('from B2')\n")
    (peers["C"] / "answer.py").write_text("print('from C1')\n")
    result = await box.exec("python3 /peers/B/answer.py; python3 /peers/C/answer.py", timeout_s=10)
    assert result.stdout.split() == ["from", "B2", "from", "C1"]


async def test_a_fork_bomb_is_held_by_the_pids_limit(box: Sandbox) -> None:
    result = await box.exec("bomb() { bomb | bomb & }; bomb; sleep 5", timeout_s=4)
    # Either the timeout kills the whole group, or the bomb burns out first (even the top shell cannot fork).
    assert result.exit_code != 0 and "Cannot fork" in result.stderr
    assert box.container is not None
    stats = await anyio.to_thread.run_sync(lambda: box.container.stats(stream=False, one_shot=True))
    assert stats["pids_stats"]["limit"] == 64 and stats["pids_stats"]["current"] <= 3
    assert (await box.exec("echo alive", timeout_s=10)).stdout == "alive\n"


async def test_a_1gb_allocation_is_killed_by_the_memory_limit(box: Sandbox) -> None:
    result = await box.exec("python3 -c 'b = bytearray(1 << 30); print(len(b))'", timeout_s=30)
    assert result.exit_code == 137 and not result.timed_out
    assert result.stdout == "" and "memory" in result.notes[0]
    assert (await box.exec("echo alive", timeout_s=10)).stdout == "alive\n"


async def test_a_command_past_its_timeout_is_killed_with_its_children(box: Sandbox, workspace: Path) -> None:
    with anyio.fail_after(30):  # a hang guard: the command itself would take 60 s
        result = await box.exec("(sleep 2; touch /workspace/late) & echo started; sleep 60", timeout_s=1)
    assert result.timed_out and result.exit_code == 137 and result.stdout == "started\n"
    assert "killed after 1 s" in result.notes[0]
    await anyio.sleep(2.5)  # sleep-ok: past the 2 s at which the killed child would have written
    assert not (workspace / "late").exists()
    listing = await box.exec("cat /proc/[0-9]*/cmdline | tr '\\0' ' '", timeout_s=10)
    assert "sleep infinity" in listing.stdout and "sleep 60" not in listing.stdout
    assert "sleep 2" not in listing.stdout


async def test_an_exec_that_outlives_timeout_and_grace_restarts_the_container(
    sandbox_image: str, workspace: Path
) -> None:
    class NoTimeout(Sandbox):
        grace_s = 0.5

        def _argv(self, command: str, timeout_s: float) -> list[str]:
            return ["sh", "-c", command]  # as if coreutils `timeout` had failed to kill it

    sandbox = NoTimeout(connect())
    try:
        await sandbox.start(workspace, {}, "cj-overrun", "A", SPEC)
        result = await sandbox.exec("echo x > /tmp/x; sleep 60", timeout_s=1)
        assert result.timed_out and result.exit_code is None and "restarted" in result.notes[0]
        after = await sandbox.exec("ls /tmp; cat hello.txt", timeout_s=10)
        assert after.stdout == "hello\n"  # /tmp emptied, the workspace kept
    finally:
        await sandbox.stop()


def _threads_in(module: str, before: frozenset[int] = frozenset()) -> list[int]:
    """The threads whose stack is in `module` now, but those of `before` (left there by other tests)."""
    return [
        thread.ident
        for thread in threading.enumerate()
        if thread.ident is not None
        and thread.ident not in before
        and (frame := sys._current_frames().get(thread.ident)) is not None
        and any(module in entry.filename for entry in traceback.extract_stack(frame))
    ]


async def test_a_cancelled_commands_thread_ends_when_the_sandbox_stops(
    sandbox_image: str, workspace: Path
) -> None:
    """A job cancelled mid-command leaves the command's thread reading the runner's stream; the engine
    keeps that stream open after the container is removed, so only the sandbox's stop can end it. A thread
    left reading is joined at exit: a server would collect them, and a process would never exit."""
    before = frozenset(_threads_in("command_runner.py") + _threads_in("disk_watch.py"))
    sandbox = Sandbox(connect(), Owner("test-" + os.urandom(4).hex()))
    await sandbox.start(workspace, {}, "cj-cancelled", "A", SPEC)
    try:
        await sandbox.exec("true", timeout_s=10)  # the runner is up
        with anyio.move_on_after(1):
            await sandbox.exec("sleep 300", timeout_s=300)
    finally:
        await sandbox.stop()
    with anyio.move_on_after(10):
        while _threads_in("command_runner.py", before) or _threads_in("disk_watch.py", before):
            await anyio.sleep(0.1)
    assert not _threads_in("command_runner.py", before) and not _threads_in("disk_watch.py", before)


async def test_a_runner_started_while_the_sandbox_stops_ends_with_it(
    sandbox_image: str, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command that starts the container's runner (its last one was killed) while the sandbox stops:
    the runner comes up after the stop closed the slot, so nothing would close it, and the command's thread
    would read its stream for ever. The stop must reach it."""
    before = frozenset(_threads_in("command_runner.py") + _threads_in("disk_watch.py"))
    starting, stopped = threading.Event(), threading.Event()
    start = Runner.start

    def start_across_the_stop(api: Any, container_id: str, user: str) -> Runner | None:
        runner = start(api, container_id, user)
        starting.set()
        stopped.wait(30)  # the sandbox stops while this runner comes up
        return runner

    sandbox = Sandbox(connect(), Owner("test-" + os.urandom(4).hex()))
    await sandbox.start(workspace, {}, "cj-restarting", "A", SPEC)
    failed: list[BaseException] = []

    async def command() -> None:
        try:
            await sandbox.exec("echo late", timeout_s=60)
        except SandboxError as exc:
            failed.append(exc)

    try:
        killed = await sandbox.exec("kill -9 $(cut -d' ' -f4 /proc/$PPID/stat)", timeout_s=10)  # the runner
        assert killed.exit_code == 137
        monkeypatch.setattr(Runner, "start", start_across_the_stop)
        with anyio.move_on_after(40):
            async with anyio.create_task_group() as group:
                group.start_soon(command)
                await anyio.to_thread.run_sync(starting.wait, 30)
                await sandbox.stop()
                stopped.set()
    finally:
        stopped.set()
        await sandbox.stop()
    with anyio.move_on_after(10):
        while _threads_in("command_runner.py", before) or _threads_in("disk_watch.py", before):
            await anyio.sleep(0.1)
    assert not _threads_in("command_runner.py", before) and not _threads_in("disk_watch.py", before)
    assert [str(exc) for exc in failed] == ["the sandbox stopped before the command ran"]


async def test_output_floods_are_capped_with_a_note(box: Sandbox) -> None:
    result = await box.exec("yes | head -c 1000000; seq 3 >&2; echo END", timeout_s=20)
    assert result.exit_code == 0
    assert len(result.stdout) < box.output_cap + 100
    assert result.stdout.startswith("y\ny\n") and result.stdout.endswith("y\nEND\n")
    assert "bytes cut" in result.stdout and result.stderr == "1\n2\n3\n"
    assert result.notes == ("stdout: 1,000,004 bytes, the middle 980,004 cut (first and last 10,000 kept)",)


def test_capped_keeps_head_and_tail() -> None:
    capped = _Capped(10)
    for chunk in (b"abc", b"defgh", None, b"ijklmnop"):
        capped.add(chunk)
    assert (capped.total, capped.cut) == (16, 6)
    assert capped.text() == "abcde\n[... 6 bytes cut ...]\nlmnop"
    small = _Capped(10)
    small.add(b"abc")
    assert (small.text(), small.note("stdout")) == ("abc", None)


async def test_labels_confinement_and_stop(box: Sandbox) -> None:
    container = box.container
    assert container is not None
    labels = container.labels
    assert labels["conclave.job"] == "cj-test" and labels["conclave.agent"] == "A"
    assert labels["conclave.owner"] == box.owner.id and labels["conclave.owner_pid"] == str(os.getpid())
    host = container.attrs["HostConfig"]
    assert host["ReadonlyRootfs"] and host["CapDrop"] == ["ALL"] and host["Init"]
    assert host["SecurityOpt"] == ["no-new-privileges"] and host["NetworkMode"] == "none"
    assert host["PidsLimit"] == 64 and host["Memory"] == host["MemorySwap"] == 256 * 2**20
    await box.stop()
    await box.stop()  # twice is fine
    client = connect()
    assert not client.containers.list(all=True, filters={"id": container.id})


async def test_sweep_removes_dead_owners_containers_only(sandbox_image: str, workspace: Path) -> None:
    # a pid no process can have: a finished child's pid was soon taken again under load (the sweep spared it)
    never = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    dead, live = Sandbox(connect(), Owner("dead-owner", never)), Sandbox(connect(), Owner("live-owner"))
    try:
        await dead.start(workspace, {}, "cj-sweep", "A", SPEC)
        await live.start(workspace, {}, "cj-sweep", "B", SPEC)
        assert dead.container is not None and live.container is not None
        removed = await sweep(lambda _owner, pid: not process_alive(pid), connect())
        assert dead.container.name in removed and live.container.name not in removed
        client = connect()
        assert not client.containers.list(all=True, filters={"id": dead.container.id})
        assert client.containers.list(filters={"id": live.container.id})
    finally:
        await dead.stop()
        await live.stop()


async def test_exec_before_start_is_an_error() -> None:
    with pytest.raises(SandboxError, match="not started"):
        await Sandbox().exec("true", timeout_s=1)


async def test_build_image_is_a_no_op_when_the_tag_exists(sandbox_image: str) -> None:
    report = await build_image(sandbox_image)
    assert not report.built and report.size_bytes > 0  # the existing tag is reported, nothing is built


def test_engine_status_and_image_names(sandbox_image: str) -> None:
    status = engine_status(default_tag())
    assert status.available and status.version and status.image_present
    missing = engine_status("conclave-sandbox:no-such-version")
    assert missing.image_present is False and "conclave sandbox build" in (missing.error or "")
    assert image_tag(SandboxSpec()) == default_tag()
    assert image_tag(SandboxSpec(image="mine/box:3")) == "mine/box:3"


def test_host_apt_sources_keep_the_release_and_drop_third_parties(tmp_path: Path) -> None:
    (tmp_path / "etc/apt/sources.list.d").mkdir(parents=True)
    (tmp_path / "etc/os-release").write_text('VERSION_CODENAME=bookworm\nID="debian"\n')
    (tmp_path / "etc/apt/sources.list.d/debian.sources").write_text(
        "Types: deb deb-src\n# a comment\nURIs: http://mirror.example/debian\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n"
    )
    (tmp_path / "etc/apt/sources.list.d/node.sources").write_text(
        "Types: deb\nURIs: https://deb.nodesource.com/node_20.x\nSuites: nodistro\nComponents: main\n"
    )
    one_line = "deb [signed-by=/k.gpg] http://other.example/debian bookworm main\n"
    (tmp_path / "etc/apt/sources.list").write_text(one_line)
    sources = host_apt_sources(tmp_path)
    assert sources.suite == "bookworm"
    assert "nodesource" not in sources.text and sources.text.count("Types: deb\n") == 3
    assert "Suites: bookworm-security" in sources.text and "Signed-By: /k.gpg" in sources.text


async def test_with_the_workspace_layer_an_agent_reads_a_peers_answer_and_edits_its_own(
    sandbox_image: str, tmp_path: Path
) -> None:
    from conclave.files.workspaces import Workspaces
    from conclave.sandbox.container import container_user

    ws = Workspaces(JobFolder(tmp_path, "job"), agent_owner=container_user())
    await ws.prepare([])
    await ws.create(["A", "B"])
    sandbox = Sandbox(connect())
    try:
        await sandbox.start(ws.agent("A"), {"B": ws.peer_mount("B")}, "cj-ws", "A", SPEC)  # before B answers
        (ws.agent("B") / "plan.md").write_text("B's plan\n")
        await ws.snapshot("B", "B1")
        await ws.publish("B", "B1")
        result = await sandbox.exec("cp /peers/B/plan.md mine.md && echo edited >> mine.md", timeout_s=10)
        assert result.exit_code == 0, result.as_text()
    finally:
        await sandbox.stop()
    assert (ws.agent("A") / "mine.md").read_text() == "B's plan\nedited\n"


async def test_a_container_that_died_is_restarted_for_the_next_command(box: Sandbox, workspace: Path) -> None:
    assert box.container is not None
    await anyio.to_thread.run_sync(box.container.kill)
    result = await box.exec("cat hello.txt", timeout_s=10)
    assert (result.exit_code, result.stdout) == (0, "hello\n")


def test_no_engine_is_reported_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    from conclave.errors import SandboxUnavailable

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    status = engine_status()
    assert not status.available and "sandbox: none" in (status.error or "")
    with pytest.raises(SandboxUnavailable, match="conclave doctor"):
        connect()
