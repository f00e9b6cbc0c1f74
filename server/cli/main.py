"""The `conclave` command: argument parsing and dispatch, on the standard library alone.

Every command's work lives in `commands.py` (or `install.py`), imported only when that command runs:
`conclave serve` must answer the MCP handshake before FastMCP is even imported (see
conclave.app.stdio_front), and `conclave ask` should reach its first provider quickly, so nothing here
pulls in pydantic, rich or the SDKs (tests/test_startup.py checks which modules `--help` imports).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from conclave import __version__
from conclave.cli import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, SCOPES, TARGETS
from conclave.errors import ConclaveError

if TYPE_CHECKING:
    from conclave.app.stdio_front import Startup


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
    serve.add_argument("--no-front", action="store_true",
                       help="stdio: let the server answer the handshake itself once loaded (no quick front)")

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
    ask.add_argument("--force-binary", action="store_true",
                     help="with --apply, also apply text files that became binary (their change is not shown)")
    ask.add_argument("--verify", metavar="CMD",
                     help="check each answer's files with CMD (e.g. 'pytest -q') in a fresh sandbox; needs --context")
    ask.add_argument("--max-cost", type=float, metavar="USD",
                     help="stop once the job has spent this many US dollars (every agent needs a price)")
    ask.add_argument("--max-tokens", type=int, metavar="N",
                     help="stop once the job's agents have used this many tokens (input and output)")

    status = commands.add_parser("status", help="show a job, or the recent jobs")
    status.add_argument("job_id", nargs="?", help="the job id (cj-...)")
    status.add_argument("--json", action="store_true", help="print JSON")

    show = commands.add_parser("show", help="print what a job produced: answers, transcript, diff, files")
    show.add_argument("job_id", help="the job id (cj-...)")
    what = show.add_mutually_exclusive_group()
    what.add_argument("--answers", action="store_true", help="every answer the agents posted, in full")
    what.add_argument("--transcript", action="store_true", help="the job's turns, answers and votes")
    what.add_argument("--diff", action="store_true", help="the winner's changes as a patch")
    what.add_argument("--file", metavar="PATH", help="a file of the final tree (or of --source's snapshot)")
    show.add_argument("--source", metavar="LABEL", help="with --file: an answer's snapshot, e.g. B2")

    commands.add_parser("teams", help="list the team presets and whether their keys are set")

    gc = commands.add_parser("gc", help="remove finished jobs older than --keep-days, then the oldest over --max-mb")
    gc.add_argument("--keep-days", type=float, help="keep jobs finished within this many days (CONCLAVE_GC_KEEP_DAYS)")
    gc.add_argument("--max-mb", type=int, help="then remove the oldest while jobs hold more (CONCLAVE_GC_MAX_MB)")
    gc.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")

    config = commands.add_parser("config", help="team file tools")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    check = config_commands.add_parser("check", help="validate a team YAML file")
    check.add_argument("file")

    commands.add_parser("doctor", help="check Docker, the sandbox image, keys, the local model, the state dir")
    sandbox = commands.add_parser("sandbox", help="the Docker sandbox image")
    sandbox_commands = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="SUBCOMMAND")
    sandbox_commands.add_parser("build", help="build the sandbox image locally (no registry needed)")

    setup = commands.add_parser("install", help="register the MCP server with a coding agent")
    setup.add_argument("target", choices=TARGETS, help="the coding agent")
    setup.add_argument("--write", action="store_true", help="merge it into the client's files (backups kept)")
    setup.add_argument("--scope", choices=SCOPES, help="project (this folder) or user; codex, gemini: user")
    setup.add_argument("--no-approvals", action="store_true",
                       help="leave tool approvals to the user (headless runs then cannot call the tools)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _command(args.command)(args)
    except ConclaveError as exc:
        print(f"conclave: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _command(name: str) -> Callable[[argparse.Namespace], int]:
    if name == "serve":
        return _serve
    if name == "install":
        from conclave.cli.install import install_command

        return install_command
    from conclave.cli.commands import COMMANDS

    return COMMANDS[name]


def _serve(args: argparse.Namespace) -> int:
    """stdio behind the quick front (conclave.app.stdio_front), or HTTP."""
    from conclave.app.stdio_front import serve

    if args.http:
        from conclave.cli.commands import serve_http

        return serve_http(args)
    return EXIT_OK if serve(_run_stdio_app, quick=not args.no_front) == 0 else EXIT_FAILED


def _run_stdio_app(startup: Startup) -> None:
    """Open the settings and the store (the front says it is ready only then), load the app, serve."""
    try:
        from conclave.jobs.store import Store
        from conclave.settings import Settings

        settings = Settings()
        Store(settings.db_path).close()  # the state folder is usable and the schema is current
    except Exception as exc:  # bad settings, an unusable state folder or database: the client is told why
        startup.failed(f"{type(exc).__name__}: {exc}")
        return
    startup.opened()
    import anyio

    from conclave.app.server import serve_stdio

    startup.loaded()
    anyio.run(serve_stdio, settings)


if __name__ == "__main__":
    sys.exit(main())
