"""The caller's files' run kept across jobs (coordination/baselines.py): a job on files the server has
checked before takes the kept run, any change to the files makes it again, and what is kept on disk is
read back or ignored, never trusted blindly. Jobs against Docker and the fake providers through the
real SDKs; the rest on the folder alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conclave.backends.retry import RetryPolicy
from conclave.config.models import SandboxSpec
from conclave.coordination.verdicts import Baseline, read_summary
from conclave.files.job_folder import JobFolder
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.calc_task import CHECK, TASK, TESTS, agent, calc_project
from tests.fakes.environment import environment_of
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, write_team
from tests.fakes.waits import until_done

ENV = {KEY_ENV: "test-key-0123456789"}
FAST = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05)
KEPT = "kept from an earlier job's run of this command on the same files"
SECOND_TEST = "\n\ndef test_zero():\n    assert add(0, 0) == 0\n"  # passes before the fix too


@pytest.mark.anyio
@pytest.mark.usefixtures("docker_image")
async def test_a_job_on_files_checked_before_takes_the_kept_run_and_changed_files_make_it_again(
    tmp_path: Path, fakes: FakeProviders
) -> None:
    fakes.script.set_default("ann", agent("ann"))
    team = str(write_team(tmp_path / "team.yaml", fakes, (("openai", "ann"),)))
    for name in ("one", "two", "three"):
        (tmp_path / name).mkdir()
    # the same files in two folders of other names (a check sees one context path as /workspace)
    same = [calc_project(tmp_path / "one"), calc_project(tmp_path / "two").rename(tmp_path / "two" / "calc")]
    changed = calc_project(tmp_path / "three", {"test_calc.py": TESTS + SECOND_TEST})
    outputs = []
    async with JobService.serve(environment_of(Settings(home=tmp_path / "state"), ENV, FAST)) as service:
        for project in [*same, changed]:
            request = JobRequest(task=TASK, team=team, context_paths=[{"path": str(project)}], verify=CHECK)
            view = await until_done(service, await service.submit(request))
            assert view.state == "completed" and view.winner_check, view.text()
            assert view.winner_check.startswith("passed"), view.winner_check
            read = await service.lookup.read(view.job_id, f"verify/{view.result.winner}", None, 0, 100_000)
            outputs.append(read.content)
    first, second, third = outputs
    assert "the original files' run reported '1 failed" in first and KEPT not in first
    assert "the original files' run reported '1 failed in" in second and KEPT in second  # no second run
    # a changed test file is new files: its run is made, and the answer must pass both tests
    assert "the original files' run reported '1 failed, 1 passed" in third and KEPT not in third
    assert "2 passed" in third
    assert len(list((tmp_path / "state" / "check-baselines").glob("*.json"))) == 2


def key(**changes: object) -> str:
    from conclave.coordination.baselines import baseline_key

    parts: dict[str, object] = {
        "files": "f" * 64,
        "command": "pytest -q",
        "timeout_s": 300.0,
        "spec": SandboxSpec(),
        "image_id": "sha256:" + "a" * 64,
        "runner": "env",
    }
    return baseline_key(**{**parts, **changes})  # type: ignore[arg-type]


def test_the_key_covers_everything_that_decides_the_run() -> None:
    variants = [
        key(files="e" * 64),
        key(command="pytest -q -x"),
        key(timeout_s=30.0),
        key(spec=SandboxSpec(memory="2g")),
        key(image_id="sha256:" + "b" * 64),
        key(runner="other"),
    ]
    assert len({key(), *variants}) == 1 + len(variants)


def test_kept_runs_come_back_marked_and_what_cannot_be_trusted_is_a_miss(tmp_path: Path) -> None:
    from conclave.coordination.baselines import FOLDER, KeptBaselines

    kept = KeptBaselines(tmp_path / FOLDER, keep=2)
    ran = Baseline(read_summary("3 passed, 1 skipped in 0.2s\n", ""), blocked="`tox -q` could not run")
    kept.put("a" * 64, ran)
    back = kept.get("a" * 64)
    assert back is not None and back.reused and back.required == 3 and back.blocked == ran.blocked
    assert KEPT in back.text() and KEPT not in ran.text()
    kept.put("b" * 64, Baseline(None, timed_out=True))  # a loaded machine is no property of the files
    assert kept.get("b" * 64) is None
    (tmp_path / FOLDER / f"{'c' * 64}.json").write_text('{"counts": 3}')  # not a run
    assert kept.get("c" * 64) is None
    for name in "def":
        kept.put(name * 64, ran)
    assert sorted(path.stem[0] for path in (tmp_path / FOLDER).glob("*.json")) == ["e", "f"]  # the newest two


@pytest.mark.anyio
@pytest.mark.usefixtures("docker_image")
async def test_a_kept_run_is_looked_up_at_the_job_start_without_a_check_slot(tmp_path: Path) -> None:
    """On a server whose check slots are all busy, a job's start still finds its kept run: nothing runs,
    so its answers' checks do not wait behind the lookup (with the pool's container already started)."""
    import anyio

    from conclave.config.models import SandboxSpec
    from conclave.coordination.baselines import FOLDER, KeptBaselines
    from conclave.coordination.check_pool import CheckPool
    from conclave.coordination.verification import Verifier
    from conclave.files.contexts import ContextPath
    from conclave.files.workspaces import Workspaces
    from conclave.sandbox.container import container_user

    kept, spec = KeptBaselines(tmp_path / FOLDER), SandboxSpec()

    async def verifier(name: str, limiter: anyio.CapacityLimiter, pool: CheckPool | None) -> Verifier:
        (tmp_path / name).mkdir()
        workspaces = Workspaces(JobFolder(tmp_path / name, "job"), agent_owner=container_user())
        await workspaces.prepare([ContextPath(path=str(calc_project(tmp_path / name)))])
        job_id = f"cj-{name}-{os.urandom(3).hex()}"
        return Verifier(job_id, CHECK, workspaces, spec, timeout_s=60, limiter=limiter, pool=pool, kept=kept)

    first = await verifier("one", anyio.CapacityLimiter(1), None)
    try:
        await first.warm(1)  # makes the run and keeps it
    finally:
        await first.close()
    assert not (await first.baseline()).reused
    slots = anyio.CapacityLimiter(1)
    async with anyio.create_task_group() as tg:
        pool = CheckPool(tmp_path / "home", container_user(), 1)
        tg.start_soon(pool.keep, spec)
        with anyio.fail_after(60):
            while pool.ready(spec) < 1:
                await anyio.sleep(0.05)  # sleep-ok: waiting for the pool's container to start
        second = await verifier("two", slots, pool)
        borrower = object()
        await slots.acquire_on_behalf_of(borrower)  # every check slot of the server busy
        try:
            with anyio.fail_after(30):  # before: warm waited for a slot to look the run up
                await second.warm(1)
        finally:
            slots.release_on_behalf_of(borrower)
            await second.close()
        baseline = await second.baseline()
        assert baseline.reused and baseline.required == 1
        tg.cancel_scope.cancel()
