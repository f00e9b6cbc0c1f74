"""A fake OpenAI Responses API (`POST {base_url}/responses`, SSE), the wire Codex speaks to its model.

A reply becomes output items: its text an assistant `message`, each tool call a `function_call`, except
a call named `tool_search`, which becomes the `tool_search_call` item Codex answers itself (with a
`tool_search_output` in the next request). A tool name written `namespace/name` is sent as a
namespaced `function_call` (Codex files MCP tools under a namespace per server). The stream is the
one the real API sends: response.created, then per item output_item.added, text deltas,
output_item.done, and response.completed with usage. `GET {base_url}/models` lists the requested model.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.prompt_cache import OPENAI_STEP
from tests.fakes.script import RecordedRequest, Reply, Script, usage_for

PREFIX = "/responses/{agent}/v1"


def routes(script: Script) -> list[Route]:
    async def responses(request: Request) -> Response:
        body = await request.json()
        recorded = RecordedRequest(
            "responses",
            request.path_params["agent"],
            request.url.path,
            {k.lower(): v for k, v in request.headers.items()},
            body,
            bool(body.get("stream")),
        )
        reply = script.next_reply(recorded)
        if reply.delay:
            await anyio.sleep(reply.delay)
        await reply.pass_gate()  # a test's ordering, as the other fakes hold it (tests/fakes/script.py)
        if reply.status != 200:
            error = {"message": reply.error_message, "type": "server_error", "param": None, "code": None}
            return JSONResponse({"error": error}, status_code=reply.status)
        items = output_items(reply)
        parts = [body.get("tools"), body.get("instructions"), body.get("input")]
        cached = script.cache.automatic(f"responses/{recorded.agent}", parts, OPENAI_STEP)
        billed = usage_for(reply, recorded, json.dumps(items), cached)
        script.charge(recorded.agent, billed[0], billed[1], billed[2])  # sent whole in response.completed
        usage = usage_json(billed)
        response = {
            "id": _id("resp"),
            "object": "response",
            "model": body.get("model", "gpt-fake"),
            "status": "completed",
            "output": items,
            "usage": usage,
        }
        if not recorded.streamed:
            return JSONResponse(response)
        return StreamingResponse(_events(response), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [], "models": []})

    return [
        Route(PREFIX + "/responses", responses, methods=["POST"]),
        Route(PREFIX + "/models", models, methods=["GET"]),
    ]


CUSTOM = "custom:"  # a tool name so marked is a free-form (custom) tool's call, its arguments a string


def output_items(reply: Reply) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for name, arguments in reply.tool_calls:
        if name == "tool_search":
            items.append(
                {
                    "type": "tool_search_call",
                    "id": _id("ts"),
                    "call_id": _id("search"),
                    "status": "completed",
                    "execution": "client",
                    "arguments": arguments,
                }
            )
            continue
        if name.startswith(CUSTOM):  # a free-form tool's call (Codex's code-mode `exec`): its input as is
            items.append(
                {
                    "type": "custom_tool_call",
                    "id": _id("ctc"),
                    "call_id": _id("call"),
                    "name": name.removeprefix(CUSTOM),
                    "input": arguments if isinstance(arguments, str) else json.dumps(arguments),
                    "status": "completed",
                }
            )
            continue
        namespace, _, bare = name.rpartition("/")
        call = {
            "type": "function_call",
            "id": _id("fc"),
            "call_id": _id("call"),
            "name": bare,
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
            "status": "completed",
        }
        items.append({**call, "namespace": namespace} if namespace else call)
    if reply.text:
        items.append(
            {
                "type": "message",
                "id": _id("msg"),
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
            }
        )
    return items


def usage_json(usage: tuple[int, int, int]) -> dict[str, Any]:
    prompt, completion, cached = usage
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


async def _events(response: dict[str, Any]) -> AsyncIterator[bytes]:
    started = {**response, "status": "in_progress", "output": []}
    yield _sse("response.created", {"type": "response.created", "response": started})
    for index, item in enumerate(response["output"]):
        yield _sse(
            "response.output_item.added",
            {"type": "response.output_item.added", "output_index": index, "item": item},
        )
        if item["type"] == "message":
            text = item["content"][0]["text"]
            yield _sse(
                "response.output_text.delta",
                {
                    "type": "response.output_text.delta",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "delta": text,
                },
            )
        yield _sse(
            "response.output_item.done",
            {"type": "response.output_item.done", "output_index": index, "item": item},
        )
    yield _sse("response.completed", {"type": "response.completed", "response": response})


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"
