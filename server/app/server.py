"""The FastMCP server: the six `conclave.tools`, error translation, and the stdio and HTTP transports.

The JobService is opened *outside* the app and lent to it through the lifespan context: it owns the
task group jobs run in, and FastMCP closes its lifespan under a shielded scope that an anyio task
group cannot span. In-memory clients may therefore connect and disconnect
freely; jobs live as long as the service.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from fastmcp import FastMCP
from fastmcp.exceptions import FastMCPError, ResourceError, ToolError
from fastmcp.tools import Tool
from fastmcp.utilities.json_schema import dereference_refs
from mcp.types import ToolAnnotations
from pydantic import ValidationError

from conclave import __version__
from conclave.app.health import health_routes
from conclave.app.job_resources import TEMPLATES
from conclave.app.server_timing import ServerTiming
from conclave.app.tasks import JobTasks
from conclave.app.tokens import CallerTokens, HttpTokens, TokenSource, load_tokens
from conclave.errors import ConclaveError, NotPermitted
from conclave.jobs.admission.access import Access
from conclave.jobs.service import JobService
from conclave.settings import MAX_WAIT_S, Settings
from conclave.tools._deps import DEPS_KEY
from conclave.tools.catalog import TOOLS, PublishedTool
from conclave.web.body_limit import BodyLimit
from conclave.web.serve import SHUTDOWN_S, web_routes

INSTRUCTIONS = f"""\
Conclave puts a team of LLM agents from different providers on one task: each writes an answer, they
read each other's answers anonymously, improve them or vote, and the winner writes the final answer.
Use it for questions where a second and third opinion pay: design decisions, tricky bugs, reviews.

1. ask_team(task) starts a job and waits up to wait_seconds (at most {MAX_WAIT_S}) for it. Write the
   task self-contained: the team sees nothing of your conversation, and the task and the files of
   context_paths go to every model provider in the team. list_teams shows the teams (pass one as
   `team`) and which are ready; the `local` team is a tiny offline demo: never give it real work.
2. If the job is not done yet, call get_status(job_id, wait_seconds=45) until `state` is completed,
   failed, cancelled or interrupted. Every result carries a `next` hint: follow it.
3. The final answer is in `answer`; read_workspace(job_id) lists and pages through every agent's
   answers, the transcript and, with context_paths, the diff (path="@diff") and the files the team
   wrote. cancel_job(job_id) stops a job.
4. steer_job(job_id, message) redirects a running job (agents see the note from their next turn);
   ask_team(task, follow_up=job_id) continues a finished one with the same team and its files.
Jobs run in the background and survive a client disconnect."""


def _annotations(tool: PublishedTool) -> ToolAnnotations:
    return ToolAnnotations(
        read_only_hint=tool.read_only,
        idempotent_hint=tool.idempotent,
        open_world_hint=tool.open_world,
        destructive_hint=tool.destructive,
    )


def _translated(
    fn: Callable[..., Awaitable[Any]], error: type[FastMCPError] = ToolError
) -> Callable[..., Awaitable[Any]]:
    """The one place our errors become MCP errors (tool or resource): the message as is, which says
    how to fix it.

    Raising a FastMCPError also keeps FastMCP from logging a traceback for what is a caller's
    mistake. Anything else is a bug and goes through FastMCP's own handling.
    """

    @functools.wraps(fn)
    async def tool(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except ConclaveError as exc:
            raise error(str(exc)) from exc
        except ValidationError as exc:  # from our own models, e.g. a view built from a bad record
            raise error(f"{fn.__name__}: {exc}") from exc

    return tool


def _dereferenced(tool: Tool) -> Tool:
    """The tool with every $ref in its schemas inlined (some clients follow none): what FastMCP's
    dereference_schemas does at every tools/list (about 20 ms of CPU for our six tools), done once."""
    output = tool.output_schema
    return tool.model_copy(
        update={
            "parameters": dereference_refs(tool.parameters),
            "output_schema": None if output is None else dereference_refs(output),
        }
    )


def create_app(service: JobService, settings: Settings, tokens: TokenSource | None = None) -> FastMCP:
    """The MCP server for an open JobService; with `tokens` (HTTP), every request needs one of them, and
    the token names the caller whose jobs the tools show (app/tokens.py, reread as the file changes)."""

    @asynccontextmanager
    async def lend(server: FastMCP) -> AsyncIterator[dict[str, Any]]:
        yield {DEPS_KEY: service}  # the service is not ours to close

    app = FastMCP(
        "conclave",
        instructions=INSTRUCTIONS,
        version=__version__,
        lifespan=lend,
        auth=CallerTokens(tokens) if tokens is not None else None,
        dereference_schemas=False,  # the tools' schemas are dereferenced once, below, not at every listing
    )
    for published in TOOLS:
        tool = Tool.from_function(
            _translated(published.function()),
            name=published.name,
            title=published.title,
            annotations=_annotations(published),
        )
        app.add_tool(_dereferenced(tool))
    # Streamable HTTP checks a tools/call's Mcp-Param-* headers against the tool's input schema. The MCP
    # SDK's low-level server takes a lookup for it (`get_tool_input_schema`), but FastMCP builds that
    # server itself and offers no public way to pass one (FastMCP 4.1.4), so without it the transport
    # runs the tools/list handler for every call with arguments. Not patched into FastMCP's private
    # `_mcp_server`, which an upgrade may rename or rebuild: the listing costs 2.4-3.5 ms more CPU per
    # get_status call (1.8-2.1x the call with a lookup), and answering it from a cache through FastMCP's
    # public middleware wins back almost none of it (the cost is the listing's dispatch):
    # bench/results/input-schema.json. Accepted until FastMCP takes the lookup.
    for uri, fn, mime_type in TEMPLATES:
        app.resource(uri, mime_type=mime_type)(_translated(fn, ResourceError))
    app.add_extension(JobTasks(service))  # MCP Tasks for ask_team: a task is the job (tasks.py)
    return app


def check_exposure(tokens: HttpTokens, host: str) -> None:
    """Refuse to serve HTTP beyond this machine on a token the user did not choose (the one made under
    CONCLAVE_HOME): whoever reaches the port is then one leaked file away from running jobs.

    On loopback the stored token is enough: every request needs a token anyway (app/tokens.py).
    """
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = False  # a host name: it may resolve to any interface
    if loopback or not tokens.notice:
        return
    raise NotPermitted(
        "--host",
        host,
        "serving HTTP on an address other than loopback needs a bearer token: set "
        "CONCLAVE_HTTP_TOKEN or write CONCLAVE_HOME/http-tokens.json "
        "(e.g. export CONCLAVE_HTTP_TOKEN=$(python3 -c 'import secrets; "
        "print(secrets.token_urlsafe(32))')) and give clients `Authorization: Bearer <token>`, "
        "or serve on 127.0.0.1",
    )


async def serve_stdio(settings: Settings) -> None:
    """Serve one client over stdin/stdout until it closes them."""
    access = Access.stdio(settings, os.environ, Path.cwd())
    async with JobService.open(settings, access=access, check_pool=True) as service:
        await create_app(service, settings).run_async(transport="stdio", show_banner=False)


def _url_host(host: str) -> str:
    """The host to put in a page's URL: a wildcard bind is reached on loopback; IPv6 in brackets."""
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class _Terminated(Exception):
    """SIGTERM, re-raised by uvicorn after its graceful shutdown, as an exception we can unwind with."""


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


async def serve_http(settings: Settings, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve streamable HTTP at http://host:port/mcp until SIGINT/SIGTERM, Host/Origin checks on, and the
    web view's pages beside it (conclave.web: the same token, through its own check in web/auth.py).

    uvicorn handles the signals itself, and after shutting down gracefully it restores the previous
    handler and raises the signal again. With the default SIGTERM handler that would kill the process
    before the JobService closes (running jobs would be left for the next server to find), so SIGTERM
    gets a handler that raises instead.
    """
    tokens = load_tokens(settings)
    check_exposure(tokens, host)
    if tokens.notice:
        print(tokens.notice, file=sys.stderr, flush=True)
    if not settings.allowed_roots:  # said at start: context paths fail for callers until the operator acts
        print(
            "conclave: callers may name no folder (context paths) until CONCLAVE_ALLOWED_ROOTS lists the "
            "folders they may (separated by ':', outside CONCLAVE_HOME); over HTTP the working directory "
            "is no root",
            file=sys.stderr,
            flush=True,
        )
    source = TokenSource(settings, tokens)  # one source for /mcp and the web view: both see a change at once
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if in_main_thread else None
    try:
        async with (
            JobService.open(
                settings, access=Access.http(settings, os.environ, Path.cwd(), source.roots), check_pool=True
            ) as service,
            web_routes(settings, source.callers, port, host) as pages,
        ):
            app = create_app(service, settings, source).http_app(path="/mcp", host_origin_protection=True)
            app.router.routes.extend(
                pages
            )  # the web view, behind its own check of the same tokens (web/auth.py)
            app.router.routes.extend(health_routes(service))  # probes: no token, nothing about jobs
            service.web_links.base = f"http://{_url_host(host)}:{port}"
            print(
                f"Web view: {service.web_links.base}/ (sign in with your bearer token)",
                file=sys.stderr,
                flush=True,
            )
            config = uvicorn.Config(
                # every body capped before /mcp or the web view parses it; the front's time on each reply
                ServerTiming(BodyLimit(app)),
                host=host,
                port=port,
                log_level="warning",
                lifespan="on",
                timeout_graceful_shutdown=SHUTDOWN_S,
            )
            await uvicorn.Server(config).serve()
    except* _Terminated:
        pass
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
