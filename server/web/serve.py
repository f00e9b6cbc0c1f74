"""Serving the web view: on its own for the shared state folder (`conclave web`, `conclave ask --web`),
or beside /mcp on the HTTP app (`conclave serve --http`, see conclave.app.server).

On its own it listens on loopback only, with a token of its own (random unless CONCLAVE_HTTP_TOKEN is
set), and announces itself in $CONCLAVE_HOME/web.json (jobs/web_link.py) so that every Conclave
process sharing the folder puts the job's URL in its results.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.routing import BaseRoute

from conclave.jobs.lookup import JobLookup
from conclave.jobs.web_link import WebServed, announce, withdraw
from conclave.settings import Settings
from conclave.web.auth import WebAuth
from conclave.web.routes import WebView

SHUTDOWN_S = 2  # open event streams never end on their own: stop waiting for them after this


def web_token(settings: Settings) -> str:
    """The HTTP token when one is set, else a fresh random one for this run."""
    return settings.http_token.get_secret_value() if settings.http_token else secrets.token_urlsafe(24)


@asynccontextmanager
async def web_routes(
    settings: Settings, tokens: str | Mapping[str, str | None], port: int, host: str
) -> AsyncIterator[list[BaseRoute]]:
    """The web view's routes over a lookup of its own on the shared store (jobs/lookup.py), closed when
    the server is done. `tokens`: one token for the local user (`conclave web`), or each HTTP token with
    the caller it names."""
    async with JobLookup.open(settings) as jobs:
        yield WebView(jobs, WebAuth(tokens, port, [host])).routes()


@asynccontextmanager
async def running_web(settings: Settings, port: int, token: str | None = None) -> AsyncIterator[WebServed]:
    """Serve the web view on 127.0.0.1:`port` (0: any free port) while the block runs."""
    token = token or web_token(settings)
    port = port or _free_port()  # known before the routes: the session cookie is named after it
    async with web_routes(settings, token, port, "127.0.0.1") as routes, anyio.create_task_group() as tg:
        config = uvicorn.Config(
            Starlette(routes=routes),
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


async def serve_web(settings: Settings, port: int) -> None:
    """`conclave web`: serve until SIGINT or SIGTERM, printing the sign-in link.

    web.json goes on the way out.
    """
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with running_web(settings, port) as served:
            print(f"Conclave's web view of {settings.home}: {served.url}/", flush=True)
            print(
                f"Sign in (this link holds the token; keep it to yourself): {served.login_url()}", flush=True
            )
            async for _ in signals:
                break
