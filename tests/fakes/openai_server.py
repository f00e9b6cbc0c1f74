"""A fake OpenAI Chat Completions endpoint: `POST /openai/<agent>/v1/chat/completions`.

It speaks the real wire format closely enough for the real `openai` SDK: a `chat.completion` JSON
body, or with `"stream": true` a `text/event-stream` of `chat.completion.chunk` objects ending in
`data: [DONE]`, tool-call arguments split into fragments keyed by index, and a final usage chunk
(empty `choices`) when the request asked for `stream_options.include_usage`. Errors use OpenAI's
`{"error": {"message", "type", "param", "code"}}` body.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.prompt_cache import OPENAI_STEP
from tests.fakes.script import RecordedRequest, Reply, Script, usage_for

PATH = "/openai/{agent}/v1/chat/completions"

ERROR_KINDS = {  # status -> (type, code) as the real API sends them
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}


class CutStream(Exception):
    """Raised inside a response body to drop the connection mid-reply (uvicorn aborts it)."""


def routes(script: Script) -> list[Route]:
    async def chat_completions(request: Request) -> Response:
        body = await request.json()
        recorded = RecordedRequest(
            provider="openai",
            agent=request.path_params["agent"],
            path=request.url.path,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
            streamed=bool(body.get("stream")),
        )
        reply = script.next_reply(recorded)
        if reply.delay:
            await anyio.sleep(reply.delay)
        await reply.pass_gate()
        if reply.status != 200:
            return error_response(reply)
        if reply.garbage:
            return garbage_response(recorded.streamed)
        calls = [
            (f"call_{uuid.uuid4().hex[:24]}", name, arguments_text(args)) for name, args in reply.tool_calls
        ]
        output = reply.text + "".join(args for _, _, args in calls)
        parts = [body.get("tools"), body.get("messages")]
        cached = script.cache.automatic(f"openai/{recorded.agent}", parts, OPENAI_STEP)
        prompt, out, cached = usage_for(reply, recorded, output, cached)
        usage = usage_json((prompt, out, cached))
        model = str(body.get("model", "gpt-fake"))

        def charge() -> None:
            script.charge(recorded.agent, prompt, out, cached)

        if recorded.streamed:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            chunks = stream_chunks(model, reply.text, calls, usage if include_usage else None)
            return StreamingResponse(
                sse(chunks, cut=reply.cut_stream, charge=charge), media_type="text/event-stream"
            )
        completion = completion_json(model, reply.text, calls, usage)
        if reply.cut_stream:  # half a body, then the connection drops
            half = json.dumps(completion)[:40]
            return StreamingResponse(cut_after(half), media_type="application/json")
        charge()
        return JSONResponse(completion)

    return [Route(PATH, chat_completions, methods=["POST"])]


def arguments_text(arguments: dict[str, Any] | str) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def usage_json(usage: tuple[int, int, int]) -> dict[str, Any]:
    prompt, completion, cached = usage
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }


def envelope(model: str, obj: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": "fp_fake",
        "service_tier": "default",
    }


def completion_json(
    model: str, text: str, calls: list[tuple[str, str, str]], usage: dict[str, Any]
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text or None,
        "refusal": None,
        "annotations": [],
    }
    if calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            for call_id, name, args in calls
        ]
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": "tool_calls" if calls else "stop",
    }
    return {**envelope(model, "chat.completion"), "choices": [choice], "usage": usage}


def stream_chunks(
    model: str, text: str, calls: list[tuple[str, str, str]], usage: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """The chunks the real API sends: role first, text in pieces, tool calls in fragments, finish, usage."""
    head = envelope(model, "chat.completion.chunk")
    with_usage = {"usage": None} if usage is not None else {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**head, "choices": [choice], **with_usage}

    chunks = [chunk({"role": "assistant", "content": "", "refusal": None})]
    chunks += [
        chunk({"content": piece}) for piece in re.findall(r"\s*\S+\s*", text) or ([text] if text else [])
    ]
    for index, (call_id, name, args) in enumerate(calls):
        start = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        chunks.append(chunk({"tool_calls": [start]}))
        middle = len(args) // 2
        for piece in (args[:middle], args[middle:]):
            if piece:
                chunks.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    chunks.append(chunk({}, "tool_calls" if calls else "stop"))
    if usage is not None:
        chunks.append({**head, "choices": [], "usage": usage})
    return chunks


async def sse(
    chunks: list[dict[str, Any]], *, cut: bool, charge: Callable[[], None] = lambda: None
) -> AsyncIterator[str]:
    for chunk in chunks:
        if chunk.get("usage"):  # OpenAI reports usage only here, in the last chunk
            charge()
        yield f"data: {json.dumps(chunk)}\n\n"
        if cut:
            raise CutStream("fake openai: dropping the stream after the first chunk")
    yield "data: [DONE]\n\n"


async def cut_after(text: str) -> AsyncIterator[str]:
    yield text
    raise CutStream("fake openai: dropping the response mid-body")


def error_response(reply: Reply) -> Response:
    kind, code = ERROR_KINDS.get(reply.status, ("server_error", None))
    body = {"error": {"message": reply.error_message, "type": kind, "param": None, "code": code}}
    headers = {"retry-after": f"{reply.retry_after:g}"} if reply.retry_after is not None else {}
    return JSONResponse(body, status_code=reply.status, headers=headers)


def garbage_response(streamed: bool) -> Response:
    """A 200 the SDK cannot read as a completion: an event that is not JSON, or JSON of another shape."""
    if streamed:
        return Response("data: <html>upstream proxy error</html>\n\n", media_type="text/event-stream")
    return JSONResponse({"status": "ok", "detail": "this is not a chat completion"})
