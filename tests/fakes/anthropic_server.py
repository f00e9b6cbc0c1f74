"""A fake Anthropic Messages API (`POST {base_url}/v1/messages`), JSON and SSE, driven by a Script.

The wire format follows the real API: a `message` object, or the SSE events message_start,
content_block_start / content_block_delta (text_delta, input_json_delta) / content_block_stop,
message_delta, message_stop, each with its `event:` line. Usage is rendered so that a client that adds
cache reads and writes to `input_tokens` gets back the scripted (input, output, cached) triple; with the
script's prompt cache on, an unscripted reply reads and writes at the request's `cache_control`
breakpoints (prompt_cache.py).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.script import RecordedRequest, Reply, Script, usage_for

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
CHUNK = 8  # characters per streamed delta


class CutStream(Exception):
    """Raised inside a streaming body so that the server drops the connection mid-response."""


def routes(script: Script) -> list[Route]:
    async def messages(request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            body = {"unparsed": raw.decode("utf-8", "replace")}
        streamed = bool(body.get("stream"))
        recorded = RecordedRequest(
            "anthropic", request.path_params["agent"], request.url.path, dict(request.headers), body, streamed
        )
        reply = script.next_reply(recorded)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        await reply.pass_gate()
        if reply.status != 200:
            return error_response(reply)
        if reply.garbage:
            if streamed:
                return StreamingResponse(_garbage_events(), media_type="text/event-stream")
            return Response("<html>502 upstream hiccup</html>", media_type="text/html")
        message = build_message(
            reply, recorded, script.cache.breakpoints(f"anthropic/{recorded.agent}", body)
        )
        usage = message["usage"]
        cached = usage["cache_read_input_tokens"]
        total_in = usage["input_tokens"] + cached + usage["cache_creation_input_tokens"]
        if not streamed:
            script.charge(recorded.agent, total_in, usage["output_tokens"], cached)
            return JSONResponse(message, headers={"request-id": message["id"]})

        def charge(input_tokens: int, output_tokens: int, cached_tokens: int) -> None:
            script.charge(recorded.agent, input_tokens, output_tokens, cached_tokens)

        return StreamingResponse(
            _events(message, cut=reply.cut_stream, stall=reply.stall, charge=charge),
            media_type="text/event-stream",
            headers={"request-id": message["id"], "cache-control": "no-cache"},
        )

    return [Route("/anthropic/{agent}/v1/messages", messages, methods=["POST"])]


def error_response(reply: Reply) -> Response:
    kind = ERROR_TYPES.get(reply.status, "api_error" if reply.status >= 500 else "invalid_request_error")
    headers = {"request-id": _id("req")}
    if reply.retry_after is not None:
        headers["retry-after"] = f"{reply.retry_after:g}"
    error = {"type": kind, "message": reply.error_message}
    body = {"type": "error", "error": error, "request_id": headers["request-id"]}
    return JSONResponse(body, status_code=reply.status, headers=headers)


def build_message(reply: Reply, request: RecordedRequest, cache: tuple[int, int] = (0, 0)) -> dict[str, Any]:
    """The complete `message` object for a reply (the non-streamed body; streams are cut from it);
    `cache`: the tokens its prompt cache read and wrote (prompt_cache.py), unless the usage is scripted."""
    content: list[dict[str, Any]] = []
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    for name, arguments in reply.tool_calls:
        # a str is sent as is: the malformed-arguments case (the real API always sends an object)
        content.append({"type": "tool_use", "id": _id("toolu"), "name": name, "input": arguments})
    output_text = reply.text + "".join(_arguments_text(args) for _, args in reply.tool_calls)
    total_in, out, cached = usage_for(reply, request, output_text, cache[0])
    written = 0 if reply.usage is not None else min(cache[1], total_in - cached)
    return {
        "id": _id("msg"),
        "type": "message",
        "role": "assistant",
        "model": request.body.get("model", "claude-fake"),
        "content": content,
        "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": total_in
            - cached
            - written,  # excludes the cache's reads and writes, as the API does
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": cached,
            "output_tokens": out,
        },
    }


def _arguments_text(arguments: dict[str, Any] | str) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


async def _events(
    message: dict[str, Any], *, cut: bool, stall: float, charge: Callable[[int, int, int], None]
) -> AsyncIterator[bytes]:
    usage = message["usage"]
    early = min(1, usage["output_tokens"])  # the real API's message_start counts an output token or so
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": early}}
    cached = usage["cache_read_input_tokens"]
    total_in = usage["input_tokens"] + cached + usage["cache_creation_input_tokens"]
    charge(total_in, early, cached)  # billed from here on, whatever happens next
    yield _sse("message_start", {"type": "message_start", "message": start})
    if cut:
        await asyncio.sleep(0.05)  # let the first chunk reach the client, then drop the connection
        raise CutStream("scripted cut_stream")
    if stall:
        await asyncio.sleep(stall)
    yield _sse("ping", {"type": "ping"})
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            opening, kind, key, payload = {"type": "text", "text": ""}, "text_delta", "text", block["text"]
        else:
            opening = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            kind, key, payload = "input_json_delta", "partial_json", _arguments_text(block["input"])
        start = {"type": "content_block_start", "index": index, "content_block": opening}
        yield _sse("content_block_start", start)
        for i in range(0, len(payload), CHUNK):
            delta = {"type": kind, key: payload[i : i + CHUNK]}
            yield _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    final = {"output_tokens": usage["output_tokens"]}  # cumulative, as the real API sends it
    charge(0, usage["output_tokens"] - early, 0)
    yield _sse("message_delta", {"type": "message_delta", "delta": delta, "usage": final})
    yield _sse("message_stop", {"type": "message_stop"})


async def _garbage_events() -> AsyncIterator[bytes]:
    yield b"event: message_start\ndata: {this is not json\n\n"


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"
