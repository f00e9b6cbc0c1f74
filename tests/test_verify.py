"""Verified answers, end to end against Docker and the fake providers through the real SDKs: each
answer's check runs in a fresh sandbox on a copy of its snapshot, voters see the results, the answer
that passed wins over one with more votes that failed, and the view, the diff, read_workspace and the
transcript all say so. Also what a check may not do (network, root, the snapshot, outliving it), its
time limit, the server's concurrency bound, and the refusals at submit. Needs the Docker engine and the
sandbox image (.ci/run provides both)."""

from __future__ import annotations

import itertools
import os
import re
import threading
from pathlib import Path

import anyio
import pytest

from conclave.backends.retry import RetryPolicy
from conclave.errors import InputError, SandboxUnavailable
from conclave.files.job_folder import JobFolder
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.agents import given_agents
from tests.fakes.calc_task import CALC, CHECK, TASK, agent, calc_project
from tests.fakes.container_processes import container_processes
from tests.fakes.environment import environment_of
from tests.fakes.script import Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, write_team
from tests.fakes.waits import until_done

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_image")]
ENV = {KEY_ENV: "test-key-0123456789"}
FAST = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return calc_project(tmp_path)


async def test_the_answer_that_passes_the_tests_wins_over_the_voters_favourite(
    tmp_path: Path, fakes: FakeProviders, project: Path
) -> None:
    fakes.script.set_default("ann", agent("ann"))
    fakes.script.set_default("bob", agent("bob"))
    fakes.script.set_default("cy", agent("bob"))  # two of three votes for bob's answer, which fails
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO, coordination={"final": "reuse"}))
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        view = await until_done(
            service,
            await service.submit(
                JobRequest(task=TASK, team=team, context_paths=[{"path": str(project)}], verify=CHECK)
            ),
        )
        letters = {a.model.rsplit("-", 1)[1]: a.letter for a in view.agents}
        ann, bob, cy = (f"{letters[name]}1" for name in ("ann", "bob", "cy"))
        failing_output = (await service.lookup.read(view.job_id, f"verify/{bob}", None, 0, 100_000)).content
        listing = (await service.lookup.read(view.job_id, "", None, 0, 1000)).entries
        transcript = (await service.lookup.read(view.job_id, "transcript", None, 0, 100_000)).content
        patch = (await service.lookup.read(view.job_id, "@diff", None, 0, 100_000)).content
        folder = service.job_folder(view.job_id)

    assert (
        view.state == "completed"
        and view.result.winner == ann
        and view.answer == "add() fixed in calc.py (ann)."
    ), view.text()
    assert (
        view.result.tally == {ann: 1, bob: 2, cy: 0} and not view.result.consensus
    )  # honest: 1 of 3 votes chose it
    assert view.checks()[ann].startswith("passed in ") and view.checks()[bob].startswith(
        "failed (exit 1): 1 failed"
    )
    assert view.checks()[cy].startswith("failed (exit 1)")
    assert view.winner_check and view.winner_check.startswith("passed in ")
    assert "the verification rule chose it over an answer with more votes" in view.winner_check
    assert f"the verification rule chose {ann} (passed its check) over {bob} (check failed)" in (
        view.result.reason or ""
    )
    # the diff is the verified winner's fix, and the caller's folder was never touched
    assert (
        "-    return a - b\n+    return a + b\n" in patch and project.joinpath("calc.py").read_text() == CALC
    )
    # voters saw every result beside the answers and decided once: no turn showed a check still running
    prompts = [r.text() for r in fakes.script.requests if "verify passed in" in r.text()]
    assert any(re.search(rf"## Answer {bob}[^\\]*? - verify failed \(exit 1\): 1 failed", p) for p in prompts)
    assert any(re.search(rf"## Answer {ann}[^\\]*? - verify passed in \d", p) for p in prompts)
    assert not any("verify running" in r.text() for r in fakes.script.requests) and len(prompts) == 3
    # read_workspace serves the whole output, the listing names it, the transcript records each check
    assert "FAILED test_calc.py::test_add - assert 6 == 5" in failing_output and failing_output.startswith(
        f"$ {CHECK}\n"
    )
    assert {f"verify/{ann}", f"verify/{bob}", f"verify/{cy}"} <= set(listing)
    assert (
        f"The check of {bob} failed (exit 1" in transcript
        and f"its whole output is verify/{bob}" in transcript
    )
    # the checks ran on copies: every snapshot is as its author left it, and the copies are gone
    assert (folder.snapshot(ann) / "proj" / "calc.py").read_text() == CALC.replace("a - b", "a + b")
    assert not folder.checks.exists() or not any(folder.checks.iterdir())


async def test_without_verify_the_voters_favourite_wins(
    tmp_path: Path, fakes: FakeProviders, project: Path
) -> None:
    for name, favourite in (("ann", "ann"), ("bob", "bob"), ("cy", "bob")):
        fakes.script.set_default(name, agent(favourite))
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO, coordination={"final": "reuse"}))
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        view = await until_done(
            service,
            await service.submit(JobRequest(task=TASK, team=team, context_paths=[{"path": str(project)}])),
        )
    assert view.answer == "add() fixed in calc.py (bob)." and view.result.consensus and view.checks() == {}
    assert view.winner_check is None and not any("verify" in r.text() for r in fakes.script.requests)


CONFINED = (  # what a check tries: every line of its output is asserted below
    "id -u; hostname; ls -A /tmp /dev/shm /workspace | grep -c left-by-check; "
    "touch /workspace/left-by-check /tmp/left-by-check /dev/shm/left-by-check; echo gone > calc.py; "
    "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), timeout=3)' 2>&1 | tail -1; "
    "(sleep 300 &) ; date +%s.%N; sleep 1; date +%s.%N"
)


async def test_a_check_is_confined_and_bounded(tmp_path: Path, fakes: FakeProviders, project: Path) -> None:
    """No network, not root, on a fresh copy (the snapshot keeps its files; what an earlier check left
    in the warm container is gone), processes reaped, one check at a time with
    CONCLAVE_VERIFY_CONCURRENCY=1, in one container removed with the job."""
    for name in ("ann", "bob", "cy"):
        fakes.script.set_default(name, agent(name))
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO, coordination={"final": "reuse"}))
    settings = Settings(home=tmp_path / "state", verify_concurrency=1, verify_timeout_s=20)
    async with JobService.serve(environment_of(settings, ENV, FAST)) as service:
        view = await until_done(
            service,
            await service.submit(
                JobRequest(task=TASK, team=team, context_paths=[{"path": str(project)}], verify=CONFINED)
            ),
        )
        outputs = {
            label: (await service.lookup.read(view.job_id, f"verify/{label}", None, 0, 100_000)).content
            for label in view.checks()
        }
        folder = service.job_folder(view.job_id)
    spans, hosts = [], set()
    for label, output in outputs.items():
        lines = output.split("--- stdout ---", 1)[1].split()
        assert lines[0] != "0" and "unreachable" in output.lower(), output  # not root; no network
        assert lines[2] == "0", output  # no earlier check's files in /workspace, /tmp or /dev/shm
        hosts.add(lines[1])
        spans.append((float(lines[-2]), float(lines[-1])))
        snapshot = folder.snapshot(label) / "proj"
        assert not (snapshot / "left-by-check").exists() and "gone" not in (snapshot / "calc.py").read_text()
    spans.sort()
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans)), spans  # one at a time
    assert len(spans) == 3 and all(check.startswith("passed in ") for check in view.checks().values())
    # no test summary here, nor in the original files' run: the exit code decides, and each check says so
    assert all("(by its exit code: " in check for check in view.checks().values()), view.checks()
    assert len(hosts) == 1  # the job's warm check container ran all three
    import docker

    left = docker.from_env().containers.list(
        all=True, ignore_removed=True, filters={"label": f"conclave.job={view.job_id}"}
    )
    assert left == []  # every check's container was removed, and with it its background sleep


async def test_a_check_over_its_time_limit_fails(tmp_path: Path, fakes: FakeProviders, project: Path) -> None:
    for name in ("ann", "bob", "cy"):
        fakes.script.set_default(name, agent(name))
    team = str(
        write_team(tmp_path / "team.yaml", fakes, [("openai", "ann")], coordination={"final": "reuse"})
    )
    settings = Settings(home=tmp_path / "state", verify_timeout_s=1)
    async with JobService.serve(environment_of(settings, ENV, FAST)) as service:
        view = await until_done(
            service,
            await service.submit(
                JobRequest(task=TASK, team=team, context_paths=[{"path": str(project)}], verify="sleep 30")
            ),
        )
    (check,) = view.checks().values()
    assert check == "failed: timed out after 1 s" and view.state == "completed"
    assert "no answer passed its check" in (view.winner_check or "")


async def test_a_verify_that_cannot_run_is_refused_at_submit(
    tmp_path: Path, fakes: FakeProviders, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV)) as service:
        refused = r"verify='pytest -q' is not valid: .*needs the project folder: give it with context_paths"
        with pytest.raises(InputError, match=refused):
            await service.submit(JobRequest(task=TASK, team=team, verify="pytest -q"))
        with pytest.raises(InputError, match="verify"):
            await service.submit(
                JobRequest(task=TASK, team=team, context_paths=[{"path": str(project)}], verify="   ")
            )
        monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
        with pytest.raises(SandboxUnavailable, match=r"verify runs 'pytest -q' .* leave verify out"):
            await service.submit(
                JobRequest(task=TASK, team=team, context_paths=[{"path": str(project)}], verify="pytest -q")
            )
        assert await service.store.recent_jobs() == []


async def test_a_job_cancelled_while_its_checks_start_leaves_no_container(
    tmp_path: Path, fakes: FakeProviders, project: Path
) -> None:
    import docker

    for name in ("ann", "bob", "cy"):
        fakes.script.set_default(name, agent(name))
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    settings = Settings(home=tmp_path / "state", verify_concurrency=3)
    async with JobService.serve(environment_of(settings, ENV, FAST)) as service:
        view = await service.submit(
            JobRequest(task=TASK, team=team, context_paths=[{"path": str(project)}], verify="sleep 30")
        )
        with anyio.fail_after(60):
            while not await service.store.events(view.job_id, "check_started"):
                await anyio.sleep(0.01)
        await anyio.sleep(0.05)  # sleep-ok: likely into the container's creation; any moment must hold
        assert (await service.cancel(view.job_id)).state == "cancelled"
        left = docker.from_env().containers.list(
            all=True, ignore_removed=True, filters={"label": f"conclave.job={view.job_id}"}
        )
        assert left == [] and not service.job_folder(view.job_id).checks.exists()


async def test_a_job_that_fails_removes_its_warm_check_container(
    tmp_path: Path, fakes: FakeProviders, project: Path
) -> None:
    """The job's first check container starts beside the first turns; every agent then fails, and the
    container goes with the job."""
    import docker

    gate = threading.Event()
    for name in ("ann", "bob", "cy"):
        fakes.script.set_default(name, lambda request: Reply(status=401, error_message="bad key", gate=gate))
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO))
    client = docker.from_env()
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        view = await service.submit(
            JobRequest(task=TASK, team=team, context_paths=[{"path": str(project)}], verify=CHECK)
        )
        labels = {"label": [f"conclave.job={view.job_id}", "conclave.agent=check-1"]}
        with anyio.fail_after(60):
            while not await anyio.to_thread.run_sync(
                lambda: client.containers.list(ignore_removed=True, filters=labels)
            ):
                await anyio.sleep(0.05)
        gate.set()
        view = await until_done(service, view)
    assert view.state == "failed" and view.checks() == {}
    assert (
        client.containers.list(
            all=True, ignore_removed=True, filters={"label": f"conclave.job={view.job_id}"}
        )
        == []
    )


async def test_checks_at_once_get_a_warm_container_each_and_later_ones_reuse_them(
    tmp_path: Path, project: Path
) -> None:
    import docker

    from conclave.config.models import SandboxSpec
    from conclave.coordination.verification import Verifier
    from conclave.files.contexts import ContextPath
    from conclave.files.workspaces import Workspaces
    from conclave.sandbox.container import container_user

    workspaces = Workspaces(JobFolder(tmp_path, "job"), agent_owner=container_user())
    await workspaces.prepare([ContextPath(path=str(project))])
    await workspaces.create(["A", "B"])
    for letter in "AB":
        await workspaces.snapshot(letter, f"{letter}1")
    job_id = "cj-" + os.urandom(6).hex()
    verifier = Verifier(
        job_id,
        "hostname; ls; sleep 1",
        workspaces,
        SandboxSpec(),
        timeout_s=30,
        limiter=anyio.CapacityLimiter(2),
    )
    runs: list[str] = []

    async def check(label: str) -> None:
        runs.append((await verifier.run(label)).output)

    try:
        await verifier.warm(2)
        async with anyio.create_task_group() as tg:
            for label in ("A1", "B1"):
                tg.start_soon(check, label)
        await check("B1")
        hosts = [output.split("--- stdout ---\n", 1)[1].split()[0] for output in runs]
        assert len(set(hosts[:2])) == 2 and hosts[2] in hosts[:2]  # two at once in two; the third reuses one
        assert all(output.split()[-2:] == ["calc.py", "test_calc.py"] for output in runs)  # a fresh copy each
        seen = docker.from_env().containers.list(
            ignore_removed=True, filters={"label": f"conclave.job={job_id}"}
        )
        assert len(seen) == 2
    finally:
        await verifier.close()
    assert (
        docker.from_env().containers.list(
            all=True, ignore_removed=True, filters={"label": f"conclave.job={job_id}"}
        )
        == []
    )


async def test_a_first_check_runs_beside_the_caller_files_run_not_after_it(
    tmp_path: Path, project: Path
) -> None:
    """The caller's files' run (the baseline every verdict needs) starts with the job (`warm`), and an
    answer that comes while it runs has its own run at the same time, in the job's other container; only
    the verdict waits for the baseline. Seen from the engine: two containers of the job run the command
    at once."""
    import docker

    from conclave.config.models import SandboxSpec
    from conclave.coordination.verification import Verifier
    from conclave.files.contexts import ContextPath
    from conclave.files.workspaces import Workspaces
    from conclave.sandbox.container import container_user

    workspaces = Workspaces(JobFolder(tmp_path, "job"), agent_owner=container_user())
    await workspaces.prepare([ContextPath(path=str(project))])
    await workspaces.create(["A"])
    await workspaces.snapshot("A", "A1")
    job_id = "cj-" + os.urandom(6).hex()
    command = "sleep 2.5; echo '1 passed in 2.50s'"
    verifier = Verifier(
        job_id, command, workspaces, SandboxSpec(), timeout_s=30, limiter=anyio.CapacityLimiter(2)
    )
    client = docker.from_env()
    most = 0

    def running() -> int:  # the job's containers running the command now
        found = client.containers.list(ignore_removed=True, filters={"label": f"conclave.job={job_id}"})
        return sum("sleep 2.5" in container_processes(c) for c in found)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(verifier.warm, 2)
            with anyio.fail_after(60):  # the baseline's run under way in one of the two containers
                while await anyio.to_thread.run_sync(running) < 1:
                    await anyio.sleep(0.05)  # sleep-ok: polling the engine for the job's processes
            done = anyio.Event()

            async def first_check() -> None:
                run = await verifier.run("A1")
                assert run.check.status == "passed" and run.check.required == 1, run.output
                done.set()

            tg.start_soon(first_check)
            with anyio.fail_after(60):
                while not done.is_set():
                    most = max(most, await anyio.to_thread.run_sync(running))
                    await anyio.sleep(0.05)  # sleep-ok: polling the engine for the job's processes
    finally:
        await verifier.close()
    assert most == 2  # the answer's run beside the baseline's, not after it


async def test_the_caller_files_run_starts_with_the_job_before_its_agents_are_built(
    tmp_path: Path, fakes: FakeProviders, project: Path
) -> None:
    """The baseline (the check command on the caller's files) starts when the job does, beside its set-up:
    the first agent's build waits until a container of this server runs it, and the job goes on."""
    import time

    import docker

    from conclave.config.models import AgentSpec
    from conclave.coordination.agents import Agent
    from conclave.coordination.members import endpoint_factory
    from conclave.sandbox.engine import PROCESS_OWNER

    for name in ("ann", "bob", "cy"):
        fakes.script.set_default(name, agent("ann"))
    team = str(write_team(tmp_path / "team.yaml", fakes, TRIO, coordination={"final": "reuse"}))
    client, real = docker.from_env(), endpoint_factory(ENV)
    seen: list[bool] = []

    def baseline_running() -> bool:
        mine = client.containers.list(
            ignore_removed=True, filters={"label": f"conclave.owner={PROCESS_OWNER.id}"}
        )
        return any("sleep 1.37" in container_processes(c) for c in mine)

    def factory(spec: AgentSpec) -> Agent:  # in a worker thread: the job's set-up
        if not seen:
            for _ in range(400):  # about 20 s: the run starts within one or two here
                if baseline_running():
                    seen.append(True)
                    break
                time.sleep(0.05)  # sleep-ok: polling the engine from the set-up's worker thread
            else:
                seen.append(False)
        return real(spec)

    settings = Settings(home=tmp_path / "state")
    async with JobService.serve(given_agents(environment_of(settings, ENV, FAST), factory)) as service:
        request = JobRequest(
            task=TASK, team=team, context_paths=[{"path": str(project)}], verify=f"sleep 1.37; {CHECK}"
        )
        view = await until_done(service, await service.submit(request))
    assert seen == [True]  # the caller's files' run was under way before the first agent was built
    assert view.state == "completed" and view.winner_check and view.winner_check.startswith("passed")
