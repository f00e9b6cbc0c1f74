"""The front's own time for each HTTP request, in the response's `Server-Timing` header (W3C Server Timing):
`app;dur=<ms>` from the request reaching the app to its response starting (for a streamed reply, its
first bytes). Set beside a client's round trip it splits the two: what is left is the network, the
client's own stack, and the waits of either process for a turn of its event loop or of the CPU
(bench/bench_queue.py reports both for get_status). It says how long, never what was asked or found.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"server-timing"


class ServerTiming:
    """ASGI middleware: adds `Server-Timing: app;dur=<ms>` to every HTTP response of the app it wraps."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                spent = f"app;dur={(time.perf_counter() - began) * 1000:.2f}".encode()
                message = {**message, "headers": [*message.get("headers", ()), (HEADER, spent)]}
            await send(message)

        await self.app(scope, receive, timed)
