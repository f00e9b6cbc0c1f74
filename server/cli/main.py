"""The `conclave` command: argument parsing and dispatch, on the standard library alone.

Every command's work lives in `commands.py` (or `install.py`), imported only when that command runs:
`conclave serve` must answer the MCP handshake before FastMCP is even imported (see
conclave.app.stdio_front), and `conclave ask` should reach its first provider quickly, so nothing here
pulls in pydantic, rich or the SDKs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from conclave import __version__
from conclave.cli import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, SCOPES, TARGETS
from conclave.cli.terminal import printable
from conclave.errors import ConclaveError

if TYPE_CHECKING:
    from conclave.app.stdio_front import Startup

HTTP_HOST, HTTP_PORT = "127.0.0.1", 8765
ASK_EXAMPLES = """\
examples:
  conclave ask "What is the capital of France?"
  conclave ask "Why does the retry in http/client.py fail?" --team frontier --context ./src
  conclave ask "Fix the off-by-one in the pager" --context ./src:write --apply --verify "pytest -q"
  conclave ask "Review this migration plan" --team anthropic --max-tokens 200000 --json

The team sees only the task and the --context folders, which go to every provider in the team.
See what a job produced with `conclave show JOB --answers`, `--transcript` or `--diff`.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="conclave",
        description="Hand a hard task to a team of LLM agents that answer, vote and converge on one answer.",
        epilog='start with:\n  conclave ask "TASK"                   ask the team, watch it vote\n'
        "  conclave install claude-code --write   let your coding agent call it (or codex, gemini, ...)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"conclave {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = _add(commands, "serve", help="run the MCP server (stdio by default)")
    serve.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    serve.add_argument("--host", default=HTTP_HOST, help=f"HTTP bind address (default {HTTP_HOST})")
    serve.add_argument("--port", type=int, default=HTTP_PORT, help=f"HTTP port (default {HTTP_PORT})")
    serve.add_argument(
        "--no-front",
        action="store_true",
        help="stdio: let the server answer the handshake itself once loaded (no quick front)",
    )

    worker = _add(
        commands,
        "worker",
        help="run the jobs `conclave serve` fronts put on the queue (CONCLAVE_QUEUE_URL), until drained",
    )
    worker.add_argument(
        "--drain",
        action="append",
        default=[],
        metavar="WORKER_ID",
        help="ask a running worker (its id, from `conclave doctor`; or 'all') to finish its jobs, take "
        "no new ones and exit, then return; SIGTERM or SIGINT drains a worker too",
    )

    ask = _add(
        commands,
        "ask",
        help="ask a team and watch it converge",
        epilog=ASK_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ask.add_argument("task", help="the task, in words")
    ask.add_argument("--team", help="a preset name or a team YAML file (default: the first with keys set)")
    ask.add_argument("--json", action="store_true", help="print the final JobView as JSON, no live view")
    ask.add_argument(
        "--context",
        action="append",
        default=[],
        metavar="PATH[:write]",
        help="a project folder to copy into every agent's workspace (repeatable); ':write' allows --apply",
    )
    ask.add_argument(
        "--apply",
        action="store_const",
        const=True,
        default=False,
        help="apply the winner's changes to ':write' folders if the team reached consensus",
    )
    ask.add_argument(
        "--force-apply",
        dest="apply",
        action="store_const",
        const="force",
        help="apply the winner's changes to ':write' folders even without consensus",
    )
    ask.add_argument(
        "--force-binary",
        action="store_true",
        help="with --apply, also apply binary changes, added or modified (the patch cannot show them)",
    )
    ask.add_argument(
        "--allow-artifacts",
        action="store_true",
        help="with --apply, also apply compiled or loadable artefacts (__pycache__/, *.pyc, *.so, ...)",
    )
    ask.add_argument(
        "--allow-autorun",
        action="store_true",
        help="with --apply, also apply files that run code or widen an agent's permissions on their own "
        "(.vscode/tasks.json, .envrc, .claude/, .mcp.json, package.json install scripts, CI workflows, ...)",
    )
    ask.add_argument(
        "--verify",
        metavar="CMD",
        help="check each answer's files with CMD (e.g. 'pytest -q') in a fresh sandbox; needs --context",
    )
    ask.add_argument(
        "--max-cost",
        type=float,
        metavar="USD",
        help="stop once the job has spent this many US dollars (every agent needs a price)",
    )
    ask.add_argument(
        "--max-tokens",
        type=int,
        metavar="N",
        help="stop once the job's agents have used this many tokens (input and output)",
    )
    ask.add_argument(
        "--max-tokens-per-member",
        type=int,
        metavar="N",
        help="stop any one member once it has used this many tokens; the others go on",
    )
    ask.add_argument(
        "--follow-up",
        metavar="JOB_ID",
        help="continue that finished job: the same team goes on from its answer and files",
    )
    ask.add_argument(
        "--web",
        action="store_true",
        help="open the job's live page in a browser (served by `conclave web`, else by this command)",
    )
    ask.add_argument(
        "--allow-secret-folders",
        action="store_true",
        help="send --context folders even if they are or hold credentials (~/.ssh, ~/.aws, ~/.gnupg)",
    )

    steer = _add(commands, "steer", help="leave a note for a running job's agents")
    steer.add_argument("job_id", help="the job id (cj-...)")
    steer.add_argument("message", help="the note, e.g. 'keep the public API unchanged'")

    web = _add(commands, "web", help="serve the live web view of this machine's jobs on 127.0.0.1")
    web.add_argument("--port", type=int, default=8766, help="port on 127.0.0.1 (default 8766)")
    web.add_argument(
        "--link",
        action="store_true",
        help="print a new one-time sign-in link (good for a minute) for the `conclave web` running now",
    )

    status = _add(commands, "status", help="show a job, or the recent jobs")
    status.add_argument("job_id", nargs="?", help="the job id (cj-...)")
    status.add_argument("--json", action="store_true", help="print JSON")

    show = _add(commands, "show", help="print what a job produced: answers, transcript, diff, files")
    show.add_argument("job_id", help="the job id (cj-...)")
    what = show.add_mutually_exclusive_group()
    what.add_argument("--answers", action="store_true", help="every answer the agents posted, in full")
    what.add_argument("--transcript", action="store_true", help="the job's turns, answers and votes")
    what.add_argument("--diff", action="store_true", help="the winner's changes as a patch")
    what.add_argument("--file", metavar="PATH", help="a file of the final tree (or of --source's snapshot)")
    what.add_argument("--thread", action="store_true", help="every job of its conversation (follow-ups)")
    show.add_argument("--source", metavar="LABEL", help="with --file: an answer's snapshot, e.g. B2")
    show.set_defaults(_check=_check_show)
    ask.set_defaults(_check=_check_ask)
    serve.set_defaults(_check=_check_serve)

    _add(commands, "teams", help="list the team presets and whether their keys are set")

    gc = _add(
        commands, "gc", help="remove finished jobs older than --keep-days, then the oldest over --max-mb"
    )
    gc.add_argument(
        "--keep-days", type=float, help="keep jobs finished within this many days (CONCLAVE_GC_KEEP_DAYS)"
    )
    gc.add_argument(
        "--max-mb", type=int, help="then remove the oldest while jobs hold more (CONCLAVE_GC_MAX_MB)"
    )
    gc.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")

    config = _add(commands, "config", help="team file tools")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    check = _add(config_commands, "check", help="validate a team YAML file")
    check.add_argument("file")

    _add(commands, "doctor", help="check Docker, the sandbox image, keys, the local model, the state dir")
    sandbox = _add(commands, "sandbox", help="the Docker sandbox image")
    sandbox_commands = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="SUBCOMMAND")
    build = _add(sandbox_commands, "build", help="build the sandbox image (says which route and why)")
    build.add_argument(
        "--clis",
        action="store_true",
        help="also the image for coding-agent CLI members: Node and the pinned CLIs from npm",
    )
    build.add_argument(
        "--route",
        choices=("dockerfile", "mmdebstrap"),
        help="how to build: dockerfile (the engine pulls debian:bookworm-slim) or mmdebstrap (offline, on a "
        "Debian or Ubuntu host); default: dockerfile where the engine can pull, else mmdebstrap",
    )
    build.add_argument(
        "--platform",
        metavar="linux/ARCH",
        help="build for linux/amd64 or linux/arm64 instead of the engine's own (the tag gets -ARCH)",
    )
    build.add_argument(
        "--apt-mirror",
        metavar="URL",
        help="the dockerfile route's Debian mirror in place of http://deb.debian.org (e.g. http://mirror.local)",
    )

    setup = _add(commands, "install", help="register the MCP server with a coding agent")
    setup.add_argument("target", choices=TARGETS, help="the coding agent")
    setup.add_argument("--write", action="store_true", help="merge it into the client's files (backups kept)")
    setup.add_argument(
        "--scope",
        choices=SCOPES,
        help="project (this folder) or user (the default for codex, gemini, copilot)",
    )
    setup.add_argument(
        "--http",
        metavar="URL",
        help="register a running `conclave serve --http` (e.g. http://127.0.0.1:8765/mcp) instead of "
        "stdio; the client sends the token from CONCLAVE_HTTP_TOKEN",
    )
    setup.add_argument(
        "--no-approvals",
        action="store_true",
        help="leave tool approvals to the user (headless runs then cannot call the tools)",
    )
    return parser


def _check_ask(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for flag in ("force_binary", "allow_artifacts", "allow_autorun"):
        if getattr(args, flag) and not args.apply:
            option = "--" + flag.replace("_", "-")
            parser.error(f"{option} changes what --apply writes: give --apply (or --force-apply) with it")
    if args.allow_secret_folders and not args.context:
        parser.error("--allow-secret-folders is about --context folders: give --context PATH with it")


def _check_serve(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.http and (args.host != HTTP_HOST or args.port != HTTP_PORT):
        parser.error("--host and --port are for HTTP: give --http with them")
    if args.http and args.no_front:
        parser.error("--no-front is about stdio's handshake: leave it out with --http")


def _check_show(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.source is not None and args.file is None:
        parser.error("--source names the answer whose files --file reads: give --file PATH with it")


def _add(commands: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A (sub)command's parser, which records itself so a bad flag shows this command's usage."""
    parser: argparse.ArgumentParser = commands.add_parser(name, **kwargs)
    parser.set_defaults(_parser=parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_OK
    command_parser: argparse.ArgumentParser = getattr(args, "_parser", parser)
    if extra:
        command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    check = getattr(args, "_check", None)
    if check is not None:
        check(command_parser, args)
    try:
        return _command(args.command)(args)
    except ConclaveError as exc:
        print(printable(f"conclave: {exc.render('cli')}"), file=sys.stderr)
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
        from conclave.jobs.lookup import check_state_folder
        from conclave.settings import Settings

        settings = Settings()
        check_state_folder(settings)
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
