"""Run the fake provider servers on 127.0.0.1 for a test: one Starlette app, every wire format.

    with FakeProviders() as fakes:
        fakes.script.enqueue("a", Reply(text="hi"))
        url = fakes.base_url("openai", "a")   # give this to the real SDK as base_url

The server runs uvicorn in a background thread so that the real SDKs in the test (or in a conclave
subprocess) reach it over real HTTP.
"""

from __future__ import annotations

import socket
import time
from types import TracebackType

import uvicorn
from starlette.applications import Starlette
from starlette.routing import BaseRoute

from tests.fakes import anthropic_server, gemini_server, openai_server, responses_server
from tests.fakes.script import Script
from tests.fakes.threaded import serving

PREFIXES = {
    "openai": "/openai/{agent}/v1",
    "anthropic": "/anthropic/{agent}",
    "gemini": "/gemini/{agent}",
    "responses": responses_server.PREFIX,
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def build_app(script: Script) -> Starlette:
    routes: list[BaseRoute] = [
        *openai_server.routes(script),
        *anthropic_server.routes(script),
        *gemini_server.routes(script),
        *responses_server.routes(script),
    ]
    return Starlette(routes=routes)


class FakeProviders:
    """The fake servers for one test, listening on a free loopback port (or on `host`, another address of
    this machine: the compose lane's bridge gateway, which its containers reach)."""

    def __init__(self, script: Script | None = None, host: str = "127.0.0.1") -> None:
        self.script = script or Script()
        self.host = host
        self.port = free_port()
        config = uvicorn.Config(
            build_app(self.script),
            host=host,
            port=self.port,
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=1,  # scripted delays of tens of seconds must not hold up a test's end
        )
        self._serving = serving(config, "fake-providers")
        self._server: uvicorn.Server | None = None

    def base_url(self, provider: str, agent: str) -> str:
        return f"http://{self.host}:{self.port}" + PREFIXES[provider].format(agent=agent)

    def __enter__(self) -> FakeProviders:
        self._server = self._serving.__enter__()
        return self

    def settle(self, timeout: float = 10.0, quiet: float = 0.3) -> None:
        """Wait until no client holds a connection, then until no request is recorded for `quiet` seconds.

        A killed client's request can still be recorded after the kill returned: uvicorn reads what was
        already in the socket, and a handler that had read its body records it a few loop turns later (one
        that had not gets a disconnect instead). Only meaningful when no live process talks to the fakes."""
        assert self._server is not None, "settle() inside the with block"
        connections = self._server.server_state.connections
        deadline = time.monotonic() + timeout
        seen, since = -1, time.monotonic()
        while connections or time.monotonic() - since < quiet:
            # wall-time: a guard against a connection that never closes, not a measurement
            if time.monotonic() > deadline:
                raise TimeoutError(f"the fakes still hold {len(connections)} connections after {timeout} s")
            if connections or len(self.script.requests) != seen:
                seen, since = len(self.script.requests), time.monotonic()
            time.sleep(0.01)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._serving.__exit__(exc_type, exc, tb)
