"""The commands behind `conclave`: each parses nothing, calls the library the MCP tools call, and renders.

Imported by conclave.cli.main only when one of them runs (it pulls in rich, pydantic and the job
machinery, which `conclave serve` must not wait for).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

import anyio
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from conclave.cli import EXIT_FAILED, EXIT_OK
from conclave.cli.render import render, see_more, wrapped
from conclave.config import list_presets, load_team_file
from conclave.errors import ConclaveError, JobNotFound
from conclave.jobs.estimate import history
from conclave.jobs.reach import endpoints, unreachable
from conclave.jobs.reader import WorkspacePage as ReadPage
from conclave.jobs.reader import job_workspaces, read_whole
from conclave.jobs.service import JobService
from conclave.jobs.store import Store
from conclave.jobs.teams import team_list
from conclave.jobs.views import DEMO_TEAM, JobView, job_view
from conclave.settings import Settings


def ask(args: argparse.Namespace) -> int:
    return anyio.run(_ask, args, Console())


async def _ask(args: argparse.Namespace, console: Console) -> int:
    async with JobService.open(Settings()) as service:
        view = await service.submit(
            args.task, args.team, context_arguments(args.context, args.allow_secret_folders), args.apply,
            args.force_binary, verify=args.verify, max_cost_usd=args.max_cost, max_tokens=args.max_tokens,
        )
        if args.json:
            while not view.done:
                view = await service.wait(view.job_id, 50)
            print(json.dumps(view.model_dump(mode="json"), indent=2))
            return EXIT_OK if view.state == "completed" else EXIT_FAILED
        texts: dict[str, str] = {}

        async def shown(view: JobView) -> Group:
            for label in view.tally:  # answers never change once posted: each is read once
                if label not in texts:
                    with suppress(ConclaveError):
                        texts[label] = (await service.read(view.job_id, f"answers/{label}", None, 0, 4000)).content
            return render(view, texts, console.width)

        try:
            with Live(await shown(view), console=console, refresh_per_second=4, transient=True) as live:
                while not view.done:
                    view = await service.wait(view.job_id, 1.0)
                    live.update(await shown(view))
        except (KeyboardInterrupt, anyio.get_cancelled_exc_class()):
            with anyio.CancelScope(shield=True):
                await service.cancel(view.job_id)
            raise
        console.print(await shown(view))
        if view.answer is not None:
            console.rule("Final answer")
            console.print(Text(view.answer))
        if view.team == DEMO_TEAM:
            console.print(wrapped("note: the local team is a 135M-parameter demo of the protocol, not a second "
                                  "opinion; `conclave teams` shows the teams your keys allow", console.width))
        console.print(see_more(view))
        return EXIT_OK if view.state == "completed" else EXIT_FAILED


def context_arguments(values: Sequence[str], allow_secrets: bool = False) -> list[object]:
    """`--context PATH[:write]` as ask_team's context_paths."""
    paths: list[object] = []
    for value in values:
        path, _, permission = value.rpartition(":") if value.endswith((":write", ":read")) else (value, "", "read")
        paths.append({"path": path, "permission": permission, "allow_secrets": allow_secrets})
    return paths


@contextmanager
def _job_store() -> Iterator[tuple[Settings, Store]]:
    """The settings and the job store, closed again when the command is done with them."""
    settings = Settings()
    store = Store(settings.db_path)
    try:
        yield settings, store
    finally:
        store.close()


def status(args: argparse.Namespace) -> int:
    with _job_store() as (settings, store):
        now = time.time()
        if args.job_id:
            row = store.job(args.job_id.strip())
            if row is None:
                raise JobNotFound(args.job_id)
            view = job_view(row, now)
            print(json.dumps(view.model_dump(mode="json"), indent=2) if args.json else view.text("cli"))
            return EXIT_OK
        views = [job_view(row, now) for row in store.recent_jobs()]
        if args.json:
            print(json.dumps([view.model_dump(mode="json") for view in views], indent=2))
        elif not views:
            Console().print("no jobs yet; start one with `conclave ask \"...\"`")
        for view in views if not args.json else []:
            print(f"{view.job_id}  {view.state:<11} {view.team:<10} {view.elapsed_s:>6.0f}s  {view.task[:60]}")
        return EXIT_OK


def show(args: argparse.Namespace) -> int:
    """What read_workspace serves, for a person: the job and its listing, or one text in full."""
    with _job_store() as (settings, store):
        row = store.job(args.job_id.strip())
        if row is None:
            raise JobNotFound(args.job_id)
        workspaces = job_workspaces(row, settings.home / "jobs")

        def read(path: str, source: str | None = None) -> ReadPage:
            return anyio.run(read_whole, store, row, workspaces, path, source)

        if args.answers:
            for entry in read("").entries or []:
                if entry.startswith("answers/"):
                    print(f"## {entry.removeprefix('answers/')}\n{read(entry).content}\n")
        elif args.transcript or args.diff:
            print(read("transcript" if args.transcript else "@diff").content)
        elif args.file:
            print(read(args.file, args.source).content, end="")
        else:
            print(job_view(row, time.time()).text("cli"))
            print(f"\nReadable (conclave show {row.id} --answers | --transcript | --diff | --file PATH):")
            print("  " + "\n  ".join(read("").entries or []))
        return EXIT_OK


def teams(args: argparse.Namespace) -> int:
    with _job_store() as (settings, store):
        presets = list_presets()
        down = anyio.run(unreachable, endpoints(team for _, team in presets if not isinstance(team, ConclaveError)))
        print(team_list(presets, os.environ, lambda team: history(team, store.team_usage(team.name)), down).text())
    return EXIT_OK


def gc(args: argparse.Namespace) -> int:
    from conclave.jobs.gc import prune

    with _job_store() as (settings, store):
        report = prune(
            store, settings.home / "jobs",
            keep_days=settings.gc_keep_days if args.keep_days is None else args.keep_days,
            max_bytes=(settings.gc_max_mb if args.max_mb is None else args.max_mb) * 1024 * 1024,
            dry_run=args.dry_run,
        )
    print(("would have " if args.dry_run else "") + report.text())
    for job_id in report.removed:
        print(f"  {job_id}")
    return EXIT_OK


def config(args: argparse.Namespace) -> int:
    path = Path(args.file)
    team = load_team_file(path)
    models = ", ".join(agent.model for agent in team.agents)
    print(f"{path}: ok - team {team.name!r}, {len(team.agents)} agents: {models}")
    missing = team.missing_keys(os.environ)
    if missing:
        print(f"note: to run it, set {', '.join(missing)}")
    return EXIT_OK


def doctor(args: argparse.Namespace) -> int:
    from conclave.cli.doctor import run_checks  # Docker's SDK: not for the other commands to wait for

    checks = run_checks(Settings(), os.environ)
    print("\n".join(check.line() for check in checks))
    return EXIT_FAILED if any(c.essential and not c.ok for c in checks) else EXIT_OK


def sandbox(args: argparse.Namespace) -> int:
    from conclave.sandbox.image import build_image_sync

    report = build_image_sync()
    print(f"{report.tag}: {'built' if report.built else 'already present'}")
    return EXIT_OK


def serve_http(args: argparse.Namespace) -> int:
    from conclave.app.server import serve_http as run_http

    anyio.run(run_http, Settings(), args.host, args.port)
    return EXIT_OK


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "ask": ask, "status": status, "show": show, "teams": teams, "config": config, "doctor": doctor,
    "sandbox": sandbox, "gc": gc,
}
