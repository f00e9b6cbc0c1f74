"""Serving the web view: on its own for the shared state folder (`conclave web`, `conclave ask --web`),
or beside /mcp on the HTTP app (`conclave serve --http`, see conclave.app.server).

On its own it listens on loopback only, with a random token of its own for the local user (never
CONCLAVE_HTTP_TOKEN: that token names the `http` caller, who has `serve --http`'s view), and announces
itself in $CONCLAVE_HOME/web.json (jobs/read/web_link.py) so that every Conclave process sharing the folder
puts the job's URL in its results, and `conclave web --link` and `conclave ask --web` can ask it for a
one-time sign-in code (`sign_in_link`): the token itself never goes into a URL or a command line.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import quote

import anyio
import httpx2
import uvicorn
from starlette.applications import Starlette
from starlette.routing import BaseRoute

from conclave.errors import ConfigError
from conclave.jobs.lookup import JobLookup
from conclave.jobs.read.web_link import WebServed, announce, withdraw
from conclave.settings import Settings
from conclave.web.auth import Callers, WebAuth, fixed_callers
from conclave.web.body_limit import BodyLimit
from conclave.web.routes import WebView

SHUTDOWN_S = 2  # open event streams never end on their own: stop waiting for them after this


@asynccontextmanager
async def web_routes(
    settings: Settings, callers: Callers, port: int, host: str
) -> AsyncIterator[list[BaseRoute]]:
    """The web view's routes over a lookup of its own on the shared store (jobs/lookup.py), closed when
    the server is done. `callers`: the local user's one token (`conclave web`), or the HTTP tokens, each
    naming its caller, as they are at each request (app/tokens.py)."""
    async with JobLookup.open(settings, os.environ) as jobs:
        yield WebView(jobs, WebAuth(callers, port, [host])).routes()


@asynccontextmanager
async def running_web(settings: Settings, port: int) -> AsyncIterator[WebServed]:
    """Serve the web view on 127.0.0.1:`port` (0: any free port) while the block runs."""
    token = secrets.token_urlsafe(32)
    port = port or _free_port()
    async with (
        web_routes(settings, fixed_callers(token), port, "127.0.0.1") as routes,
        anyio.create_task_group() as tg,
    ):
        config = uvicorn.Config(
            BodyLimit(Starlette(routes=routes)),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=SHUTDOWN_S,
        )
        server = uvicorn.Server(config)
        # Signals are the caller's.
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
        tg.start_soon(server.serve)
        while not server.started:
            if tg.cancel_scope.cancel_called:
                break
            await anyio.sleep(0.02)
        served = WebServed(url=f"http://127.0.0.1:{port}", pid=os.getpid(), token=token)
        announce(settings.home, served)
        try:
            yield served
        finally:
            withdraw(settings.home, os.getpid())
            server.should_exit = True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def sign_in_link(web: WebServed, job_id: str | None = None) -> str:
    """A one-time sign-in link (its code dies after a minute or one use) to the running web view `web`,
    asked of it with its token; it opens the job's page when `job_id` is given."""
    async with httpx2.AsyncClient(timeout=10) as http:
        try:
            answer = await http.post(
                f"{web.url}/api/sign-in/link", headers={"Authorization": f"Bearer {web.token}"}
            )
        except httpx2.TransportError as exc:
            raise ConfigError(
                f"the web view at {web.url} did not answer ({exc}); restart it with `conclave web`"
            ) from exc
    if answer.status_code != 200:
        raise ConfigError(
            f"the web view at {web.url} gave no sign-in code ({answer.status_code}: {answer.text[:200]}); "
            "restart it with `conclave web`"
        )
    target = f"&next={quote(f'/jobs/{job_id}')}" if job_id else ""
    return f"{web.url}/login?code={answer.json()['code']}{target}"


async def serve_web(settings: Settings, port: int) -> None:
    """`conclave web`: serve until SIGINT or SIGTERM, printing a one-time sign-in link.

    web.json goes on the way out.
    """
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with running_web(settings, port) as served:
            print(f"Conclave's web view of {settings.home}: {served.url}/", flush=True)
            print(
                f"Sign in (a one-time link, good for a minute; `conclave web --link` prints another): "
                f"{await sign_in_link(served)}",
                flush=True,
            )
            async for _ in signals:
                break
