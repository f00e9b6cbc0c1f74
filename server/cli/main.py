"""The `conclave` command: a thin shell over the same library calls the MCP tools make."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from conclave import __version__
from conclave.config import list_presets, load_team_file
from conclave.errors import ConclaveError
from conclave.cli.install import SCOPES, TARGETS, install
from conclave.cli.doctor import run_checks
from conclave.jobs.service import JobService
from conclave.sandbox.image import build_image_sync
from conclave.settings import Settings
from conclave.jobs.store import Store
from conclave.jobs.views import JobView
from conclave.jobs.teams import team_list
from conclave.jobs.views import job_view

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="conclave",
        description="Hand a hard task to a team of LLM agents that answer, vote and converge on one answer.",
    )
    parser.add_argument("--version", action="version", version=f"conclave {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the MCP server (stdio by default)")
    serve.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    serve.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8765, help="HTTP port (default 8765)")

    ask = commands.add_parser("ask", help="ask a team and watch it converge")
    ask.add_argument("task", help="the task, in words")
    ask.add_argument("--team", help="a preset name or a team YAML file (default: the first with keys set)")
    ask.add_argument("--json", action="store_true", help="print the final JobView as JSON, no live view")
    ask.add_argument(
        "--context", action="append", default=[], metavar="PATH[:write]",
        help="a project folder to copy into every agent's workspace (repeatable); ':write' allows --apply",
    )
    ask.add_argument(
        "--apply", action="store_const", const=True, default=False,
        help="apply the winner's changes to ':write' folders if the team reached consensus",
    )
    ask.add_argument(
        "--force-apply", dest="apply", action="store_const", const="force",
        help="apply the winner's changes to ':write' folders even without consensus",
    )

    status = commands.add_parser("status", help="show a job, or the recent jobs")
    status.add_argument("job_id", nargs="?", help="the job id (cj-...)")
    status.add_argument("--json", action="store_true", help="print JSON")

    commands.add_parser("teams", help="list the team presets and whether their keys are set")

    config = commands.add_parser("config", help="team file tools")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    check = config_commands.add_parser("check", help="validate a team YAML file")
    check.add_argument("file", type=Path)

    commands.add_parser("doctor", help="check Docker, the sandbox image, keys, the local model, the state dir")
    sandbox = commands.add_parser("sandbox", help="the Docker sandbox image")
    sandbox_commands = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="SUBCOMMAND")
    sandbox_commands.add_parser("build", help="build the sandbox image locally (no registry needed)")

    setup = commands.add_parser("install", help="register the MCP server with a coding agent")
    setup.add_argument("target", choices=TARGETS, help="the coding agent")
    setup.add_argument("--write", action="store_true", help="merge it into the client's file (backup kept)")
    setup.add_argument("--scope", choices=SCOPES, help="project (this folder) or user; codex: user")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console()
    try:
        match args.command:
            case "serve":
                return _serve(args)
            case "ask":
                return anyio.run(_ask, args, console)
            case "status":
                return _status(args, console)
            case "teams":
                return _teams(console)
            case "config":
                team = load_team_file(args.file)
                models = ", ".join(agent.model for agent in team.agents)
                print(f"{args.file}: ok - team {team.name!r}, {len(team.agents)} agents: {models}")
                missing = team.missing_keys(os.environ)
                if missing:
                    print(f"note: to run it, set {', '.join(missing)}")
                return EXIT_OK
            case "doctor":
                checks = run_checks(Settings(), os.environ)
                print("\n".join(check.line() for check in checks))
                return EXIT_FAILED if any(c.essential and not c.ok for c in checks) else EXIT_OK
            case "sandbox":
                report = build_image_sync()
                print(f"{report.tag}: {'built' if report.built else 'already present'}")
                return EXIT_OK
            case "install":
                return install(args.target, args.scope, write_files=args.write)
    except ConclaveError as exc:
        print(f"conclave: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return EXIT_USAGE


def _serve(args: argparse.Namespace) -> int:
    from conclave.app.server import serve_http, serve_stdio

    settings = Settings()
    if args.http:
        anyio.run(serve_http, settings, args.host, args.port)
    else:
        anyio.run(serve_stdio, settings)
    return EXIT_OK


async def _ask(args: argparse.Namespace, console: Console) -> int:
    async with JobService.open(Settings()) as service:
        view = await service.submit(args.task, args.team, context_arguments(args.context), args.apply)
        if args.json:
            while not view.done:
                view = await service.wait(view.job_id, 50)
            print(json.dumps(view.model_dump(mode="json"), indent=2))
            return EXIT_OK if view.state == "completed" else EXIT_FAILED
        try:
            with Live(render(view), console=console, refresh_per_second=4, transient=True) as live:
                while not view.done:
                    view = await service.wait(view.job_id, 1.0)
                    live.update(render(view))
        except (KeyboardInterrupt, anyio.get_cancelled_exc_class()):
            with anyio.CancelScope(shield=True):
                await service.cancel(view.job_id)
            raise
        console.print(render(view))
        if view.answer is not None:
            console.rule("Final answer")
            console.print(Text(view.answer))
        return EXIT_OK if view.state == "completed" else EXIT_FAILED


def context_arguments(values: Sequence[str]) -> list[object]:
    """`--context PATH[:write]` as ask_team's context_paths."""
    paths: list[object] = []
    for value in values:
        path, _, permission = value.rpartition(":") if value.endswith((":write", ":read")) else (value, "", "read")
        paths.append({"path": path, "permission": permission})
    return paths


def render(view: JobView) -> Group:
    """The live view: a line per agent (state, answers, vote), the tally, elapsed time."""
    table = Table(title=f"{view.job_id} - team {view.team} - {view.state}", title_justify="left")
    for column in ("agent", "model", "state", "answers", "vote", "tokens in/out"):
        table.add_column(column)
    for agent in view.agents:
        state = agent.state if not agent.error else f"failed: {agent.error[:60]}"
        tokens = f"{agent.usage.input_tokens}/{agent.usage.output_tokens}"
        table.add_row(agent.letter, agent.model, state, str(agent.answers), agent.vote or "-", tokens)
    tally = ", ".join(f"{label}: {count}" for label, count in view.tally.items()) or "no votes yet"
    lines = [table, Text(f"{view.phase}  |  round {view.round}  |  tally {tally}  |  {view.elapsed_s:.0f}s")]
    if view.done:
        cost = f", ${view.usage.cost_usd:.4f}" if view.usage.cost_usd is not None else ""
        if view.winner:
            lines.append(Text(f"winner {view.winner}: {view.majority}", style="bold"))
        lines.append(Text(f"why: {view.reason or '-'}"))
        lines.append(Text(f"usage: {view.usage.input_tokens} in, {view.usage.output_tokens} out{cost}"))
    elif view.agree:
        lines.append(Text("same final answer: " + "; ".join(" = ".join(group) for group in view.agree)))
    return Group(*lines)


def _status(args: argparse.Namespace, console: Console) -> int:
    settings = Settings()
    store = Store(settings.db_path)
    try:
        now = time.time()
        if args.job_id:
            row = store.job(args.job_id)
            if row is None:
                raise ConclaveError(f"job_id={args.job_id!r} is not in {settings.db_path}; run `conclave status` to list")
            view = job_view(row, now)
            if args.json:
                print(json.dumps(view.model_dump(mode="json"), indent=2))
            else:
                print(view.text())
            return EXIT_OK
        views = [job_view(row, now) for row in store.recent_jobs()]
        if args.json:
            print(json.dumps([view.model_dump(mode="json") for view in views], indent=2))
        elif not views:
            console.print("no jobs yet; start one with `conclave ask \"...\"`")
        for view in views if not args.json else []:
            print(f"{view.job_id}  {view.state:<11} {view.team:<10} {view.elapsed_s:>6.0f}s  {view.task[:60]}")
        return EXIT_OK
    finally:
        store.close()


def _teams(console: Console) -> int:
    print(team_list(list_presets(), os.environ).text())
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
