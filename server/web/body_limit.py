"""A cap on every HTTP request body, applied before anything reads or parses it: `BodyLimit` wraps the whole
ASGI app (the web view, and /mcp under `serve --http`), signed in or not.

A Content-Length past the cap is refused at once; a body streamed without one (chunked) is counted as it
arrives and refused at the first chunk past the cap. Either way the answer is 413 and the rest of the
body is never read, so an unauthenticated client cannot make the server hold more than the cap.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# The largest request Conclave needs is an ask_team call: a task of up to Settings.max_task_chars (100,000)
# characters, at most 6 bytes each once JSON-escaped, and its other arguments.
MAX_BODY_BYTES = 2 * 1024 * 1024


class BodyTooLarge(Exception):
    """Raised from `receive` when a streamed body passes the cap, once BodyLimit has answered 413: it ends
    whatever the app was doing with the body."""


class BodyLimit:
    """ASGI middleware: 413 for a request body larger than `limit` bytes, before the app parses it."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and (declared < 0 or declared > self.limit):
            await self._refuse(send)
            return
        received = 0
        started = refused = False

        async def counted() -> Message:
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    if not started:  # answered here, before any error handler of the app can answer 500
                        await self._refuse(send)
                        refused = True
                    raise BodyTooLarge
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the 413 went out already: what the app says about the aborted read is dropped
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except Exception:
            # BodyTooLarge, as the app let it out: plain, wrapped in a task group's ExceptionGroup, or
            # re-raised by an error handler; anything else the app raised is the app's
            if not refused:
                raise

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            {
                "error": f"the request body is larger than {self.limit} bytes, the most this server reads; "
                "send less (a task of at most max_task_chars characters)"
            }
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send(
            {"type": "http.response.start", "status": 413, "headers": [*headers, (b"connection", b"close")]}
        )
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    """The declared Content-Length; -1 for one that is not a number (refused as well)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else -1
    return None
