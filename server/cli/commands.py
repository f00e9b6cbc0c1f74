"""The commands behind `conclave`: each parses nothing, calls the library the MCP tools call, and renders.

Imported by conclave.cli.main only when one of them runs (it pulls in rich, pydantic and the job
machinery, which `conclave serve` must not wait for).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import webbrowser
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import anyio
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from conclave.cli import EXIT_FAILED, EXIT_OK
from conclave.cli.render import answer_text, render, see_more, wrapped
from conclave.cli.terminal import printable
from conclave.config.destinations import Allowed
from conclave.config.presets import read_team_file
from conclave.errors import ConclaveError
from conclave.jobs.lookup import JobLookup
from conclave.jobs.read.reader import WorkspacePage
from conclave.jobs.read.views import DEMO_TEAM, JobView
from conclave.jobs.read.web_link import WebServed, served
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.jobs.upkeep.maintenance import prune_jobs
from conclave.settings import Settings


def ask(args: argparse.Namespace) -> int:
    return anyio.run(_ask, args, Console())


async def _ask(args: argparse.Namespace, console: Console) -> int:
    settings = Settings()
    async with JobService.open(settings) as service, _web_for_ask(settings, args.web) as web:
        view = await service.submit(ask_request(args))
        if web is not None:
            print(
                f"Watch it live: {web.job_url(view.job_id)}",
                file=sys.stderr if args.json else sys.stdout,
                flush=True,
            )
            if args.web:  # a browser command may wait for the page: off the loop that serves it
                from conclave.web.serve import sign_in_link

                link = await sign_in_link(web, view.job_id)  # one-time: the token stays out of argv
                await anyio.to_thread.run_sync(webbrowser.open, link)
        if args.json:
            while not view.done:
                view = await service.wait(view.job_id, 50)
            print(json.dumps(view.model_dump(mode="json"), indent=2))
            return EXIT_OK if view.state == "completed" else EXIT_FAILED
        texts: dict[str, str] = {}

        async def shown(view: JobView) -> Group:
            for label in view.votes()[0]:  # answers never change once posted: each is read once
                if label not in texts:
                    with suppress(ConclaveError):
                        texts[label] = (
                            await service.lookup.read(view.job_id, f"answers/{label}", None, 0, 4000)
                        ).content
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
            console.print(Text(printable(view.answer)))
        if view.team == DEMO_TEAM:
            console.print(
                wrapped(
                    "note: the local team is a 135M-parameter demo of the protocol, not a second "
                    "opinion; `conclave teams` shows the teams your keys allow",
                    console.width,
                )
            )
        console.print(see_more(view))
        return EXIT_OK if view.state == "completed" else EXIT_FAILED


@asynccontextmanager
async def _web_for_ask(settings: Settings, wanted: bool) -> AsyncIterator[WebServed | None]:
    """The web view running for this state folder; with --web and none running, one served by this command
    until it ends."""
    running = served(settings.home)
    if running is not None or not wanted:
        yield running
        return
    from conclave.web.serve import running_web

    async with running_web(settings, 0) as web:
        yield web


def web(args: argparse.Namespace) -> int:
    """`conclave web`: the live view of every job in the state folder, on 127.0.0.1 until interrupted;
    with --link, a new one-time sign-in link for the one running."""
    from conclave.web.serve import serve_web, sign_in_link

    settings = Settings()
    if not args.link:
        anyio.run(serve_web, settings, args.port)
        return EXIT_OK
    running = served(settings.home)
    if running is None:
        print(
            f"conclave: no web view is running for {settings.home}: start one with `conclave web`",
            file=sys.stderr,
        )
        return EXIT_FAILED
    print(anyio.run(sign_in_link, running))
    return EXIT_OK


def ask_request(args: argparse.Namespace) -> JobRequest:
    """`conclave ask`'s flags as the request ask_team takes (a wrong value is refused naming its flag)."""
    contexts = (
        context_arguments(args.context, args.allow_secret_folders)
        if args.context or not args.follow_up
        else None  # a follow-up carries the earlier job's folders over
    )
    return JobRequest.model_validate(
        {
            "task": args.task,
            "team": args.team,
            "context_paths": contexts,
            "apply": args.apply,
            "force_binary": args.force_binary,
            "allow_artifacts": args.allow_artifacts,
            "allow_autorun": args.allow_autorun,
            "verify": args.verify,
            "max_cost_usd": args.max_cost,
            "max_tokens": args.max_tokens,
            "max_tokens_per_member": args.max_tokens_per_member,
            "follow_up": args.follow_up,
        }
    )


def context_arguments(values: Sequence[str], allow_secrets: bool = False) -> list[dict[str, object]]:
    """`--context PATH[:write]` as ask_team's context_paths."""
    paths: list[dict[str, object]] = []
    for value in values:
        path, _, permission = (
            value.rpartition(":") if value.endswith((":write", ":read")) else (value, "", "read")
        )
        paths.append({"path": path, "permission": permission, "allow_secrets": allow_secrets})
    return paths


def _print(text: str, end: str = "\n", exact: bool = False) -> None:
    """Print text that may hold model text, control sequences stripped; `exact` output (a patch, a file)
    keeps its bytes when it goes to a pipe or a file rather than a terminal (`conclave show --diff >
    x.patch`)."""
    print(text if exact and not sys.stdout.isatty() else printable(text), end=end)


def status(args: argparse.Namespace) -> int:
    """A job as get_status shows it, or the recent jobs; through the same lookup as the MCP tools."""

    async def run(jobs: JobLookup) -> int:
        if args.job_id:
            view = await jobs.view(args.job_id)
            if args.json:
                print(json.dumps(view.model_dump(mode="json"), indent=2))
            else:
                _print(view.text("cli"))
            return EXIT_OK
        views = await jobs.recent()
        if args.json:
            print(json.dumps([view.model_dump(mode="json") for view in views], indent=2))
        elif not views:
            Console().print('no jobs yet; start one with `conclave ask "..."`')
        for view in views if not args.json else []:
            _print(
                f"{view.job_id}  {view.state:<11} {view.team:<10} {view.elapsed_s:>6.0f}s  {view.task[:60]}"
            )
        return EXIT_OK

    return _with_lookup(run)


def show(args: argparse.Namespace) -> int:
    """What read_workspace serves, for a person: the job and its listing, or one text in full."""

    async def run(jobs: JobLookup) -> int:
        async def read(path: str, source: str | None = None) -> WorkspacePage:
            return await jobs.read_whole(args.job_id, path, source)

        if args.answers:
            for answer in (await jobs.page(args.job_id, patch_chars=0)).answers:
                _print(answer_text(answer) + "\n")
        elif args.transcript or args.diff or args.thread:
            path = "transcript" if args.transcript else "@diff" if args.diff else "thread"
            _print((await read(path)).content, exact=args.diff)
        elif args.file:
            _print((await read(args.file, args.source)).content, end="", exact=True)
        else:
            view = await jobs.view(args.job_id)
            _print(view.text("cli"))
            print(
                f"\nReadable (conclave show {view.job_id} --answers | --transcript | --diff | --thread | "
                "--file PATH):"
            )
            _print("  " + "\n  ".join((await read("")).entries or []))
        return EXIT_OK

    return _with_lookup(run)


def _with_lookup(command: Callable[[JobLookup], Awaitable[int]]) -> int:
    """Run `command` with a lookup on the state folder's store, closed again when it is done."""

    async def run() -> int:
        async with JobLookup.open(Settings(), os.environ) as jobs:
            return await command(jobs)

    return anyio.run(run)


def steer(args: argparse.Namespace) -> int:
    """A note for a running job, through the store: the server that runs it hands it to the agents."""

    async def run() -> JobView:
        async with JobService.open(Settings()) as service:
            return await service.steer(args.job_id, args.message)

    view = anyio.run(run)
    note = view.notes[-1] if view.notes else None
    print(
        f"{view.job_id}: note "
        f"{'seen by the agents' if note and note.seen else 'left; the agents see it from their next turn'}"
    )
    return EXIT_OK


def teams(args: argparse.Namespace) -> int:
    async def run(jobs: JobLookup) -> int:
        _print((await jobs.teams()).text())
        return EXIT_OK

    return _with_lookup(run)


def gc(args: argparse.Namespace) -> int:
    settings = Settings()
    report = anyio.run(prune_jobs, settings, args.keep_days, args.max_mb, args.dry_run)
    print(("would have " if args.dry_run else "") + report.text())
    for job_id in report.removed:
        print(f"  {job_id}")
    return EXIT_OK


def config(args: argparse.Namespace) -> int:
    path = Path(args.file)
    settings = Settings()
    team = read_team_file(path, os.environ, Allowed.of(settings.key_destinations, settings.egress_allow))
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
    from conclave.sandbox.image import BuildOptions, build_image_sync
    from conclave.sandbox.image_route import Route

    options = BuildOptions(
        route=Route(args.route) if args.route else None, platform=args.platform, apt_mirror=args.apt_mirror
    )
    reports = [build_image_sync(options=options)]
    if args.clis:
        from conclave.sandbox.clis_image import build_clis_image_sync

        reports.append(build_clis_image_sync(options=options))
    for report in reports:
        how = f"built by the {report.route.route} route" if report.route else "already present"
        print(f"{report.tag}: {how}")
    return EXIT_OK


def serve_http(args: argparse.Namespace) -> int:
    from conclave.app.server import serve_http as run_http

    anyio.run(run_http, Settings(), args.host, args.port)
    return EXIT_OK


def worker(args: argparse.Namespace) -> int:
    """Run queued jobs until drained, or (--drain) ask running workers to drain."""
    from conclave.jobs.environment import JobEnvironment
    from conclave.jobs.worker import drain_workers, run_worker

    settings = Settings()
    if args.drain:
        asked = anyio.run(drain_workers, settings, args.drain)
        print(f"asked {len(asked)} worker(s) to drain: {', '.join(asked) or 'none is running'}")
        return EXIT_OK
    anyio.run(run_worker, JobEnvironment.of(settings, os.environ))
    return EXIT_OK


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "worker": worker,
    "ask": ask,
    "status": status,
    "show": show,
    "teams": teams,
    "config": config,
    "doctor": doctor,
    "sandbox": sandbox,
    "gc": gc,
    "steer": steer,
    "web": web,
}
