"""A fake Gemini API (generateContent and streamGenerateContent?alt=sse) on the real wire format.

Routes live under `/gemini/{agent}`: the google-genai SDK, given that as `base_url`, calls
`{base_url}/v1beta/models/{model}:generateContent` and `...:streamGenerateContent?alt=sse`.

What the real API does, and so does this fake:
- a reply is a `GenerateContentResponse` JSON (camelCase); streamed, each SSE event is
  `data: {GenerateContentResponse}` and only the last carries `finishReason`;
- function calls come whole (`functionCall: {name, args}`), without ids, the first one of a turn
  carrying an opaque base64 `thoughtSignature`;
- arguments the model could not write as a JSON object end the turn with
  `finishReason: MALFORMED_FUNCTION_CALL` and a `finishMessage` quoting the call, with no parts;
- errors are `{"error": {"code", "message", "status", "details"}}`; a 429 carries a google.rpc
  RetryInfo `retryDelay` in the details (and a Retry-After header when the script sets one).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.script import RecordedRequest, Reply, Script, usage_for

STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
MODEL_VERSION = "gemini-fake-001"
SSE = "text/event-stream"


class CutStream(Exception):
    """Raised inside a response body to drop the connection mid-reply (the `cut_stream` script)."""


def routes(script: Script) -> list[Route]:
    """The fake's routes: `{prefix}/{version}/models/{model}:{method}` for every agent prefix."""

    async def generate(request: Request) -> Response:
        agent = request.path_params["agent"]
        model, _, method = request.path_params["model_method"].partition(":")
        if method not in ("generateContent", "streamGenerateContent"):
            return _error(404, f"Method {method!r} not found for model {model!r}.")
        streamed = method == "streamGenerateContent"
        if streamed and request.query_params.get("alt") != "sse":
            return _error(400, "this fake speaks only alt=sse streaming")
        body = await request.json()
        recorded = RecordedRequest(
            provider="gemini",
            agent=agent,
            path=request.url.path,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
            streamed=streamed,
        )
        reply = script.next_reply(recorded)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        await reply.pass_gate()
        if reply.status != 200:
            return _error(reply.status, reply.error_message, reply.retry_after)
        if reply.garbage:
            if streamed:
                return StreamingResponse(_aiter([b"data: <html>Bad Gateway</html>\n\n"]), media_type=SSE)
            return Response("<html><body>Bad Gateway</body></html>", media_type="text/html")
        parts = [body.get("tools"), body.get("systemInstruction"), body.get("contents")]
        cached = script.cache.automatic(f"gemini/{agent}", parts)
        chunks = _response_chunks(reply, recorded, streamed, cached)
        bill = _Bill(script, agent)
        if streamed:
            events = [(b"data: " + json.dumps(c).encode() + b"\n\n", c["usageMetadata"]) for c in chunks]
            return StreamingResponse(
                _sent(events, bill, cut=reply.cut_stream, stall=reply.stall), media_type=SSE
            )
        payload = json.dumps(chunks[0], indent=2).encode()
        if reply.cut_stream:  # half a body, then the connection drops
            half = payload[: len(payload) // 2]
            return StreamingResponse(_aiter([half], cut=True), media_type="application/json")
        bill.sent(chunks[0]["usageMetadata"])
        return Response(payload, media_type="application/json")

    return [Route("/gemini/{agent}/{version}/models/{model_method}", generate, methods=["POST"])]


def _error(status: int, message: str, retry_after: float | None = None) -> JSONResponse:
    name = STATUS_NAMES.get(status, "UNKNOWN")
    error: dict[str, Any] = {"code": status, "message": message, "status": name}
    headers = {}
    if retry_after is not None:
        headers["Retry-After"] = f"{retry_after:g}"
        retry_info = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{retry_after:g}s"}
        error["details"] = [retry_info]
    return JSONResponse({"error": error}, status_code=status, headers=headers)


class _Bill:
    """Charges the script for the usage a reply's chunks report: running totals, so only what is new."""

    def __init__(self, script: Script, agent: str) -> None:
        self.script, self.agent, self.said = script, agent, (0, 0, 0)

    def sent(self, usage: dict[str, Any]) -> None:
        now = (
            usage.get("promptTokenCount", 0),
            usage.get("candidatesTokenCount", 0),
            usage.get("cachedContentTokenCount", 0),
        )
        new = tuple(a - b for a, b in zip(now, self.said, strict=True))
        self.said = now
        self.script.charge(self.agent, *new)


async def _sent(
    events: list[tuple[bytes, dict[str, Any]]], bill: _Bill, *, cut: bool, stall: float
) -> AsyncIterator[bytes]:
    """A streamed reply's events, each charged as it goes out.

    `cut` drops and `stall` waits after the first.
    """
    for index, (data, usage) in enumerate(events):
        bill.sent(usage)
        yield data
        if index == 0 and cut:
            await asyncio.sleep(0.05)  # let the first chunk reach the client before the drop
            raise CutStream("scripted cut_stream")
        if index == 0 and stall:
            await asyncio.sleep(stall)


async def _aiter(items: list[bytes], cut: bool = False) -> AsyncIterator[bytes]:
    for index, item in enumerate(items):
        yield item
        if cut and index == 0:
            await asyncio.sleep(0.05)  # let the first chunk reach the client before the drop
            raise CutStream("scripted cut_stream")


def _response_chunks(
    reply: Reply, request: RecordedRequest, streamed: bool, cached: int = 0
) -> list[dict[str, Any]]:
    """The GenerateContentResponse objects of one reply: one, or one per SSE event when streamed."""
    calls: list[dict[str, Any]] = []
    malformed: str | None = None
    for name, arguments in reply.tool_calls:
        args = arguments
        if isinstance(arguments, str):
            try:
                args = json.loads(arguments)
            except ValueError:
                args = None
        if not isinstance(args, dict):
            malformed = f"Malformed function call: print(default_api.{name}({arguments}))"
            calls = []  # the whole turn is malformed, as the API reports it
            break
        calls.append({"functionCall": {"name": name, "args": args}})
    if calls:  # the model's reasoning state, to be sent back with the call in the next turn
        signature = f"sig-{calls[0]['functionCall']['name']}".encode()
        calls[0]["thoughtSignature"] = base64.b64encode(signature).decode()

    pieces = _split(reply.text) if streamed else [reply.text]
    output_text = reply.text + "".join(json.dumps(c) for c in calls)
    prompt, output, cached = usage_for(reply, request, output_text, cached)
    usage: dict[str, Any] = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": output,
        "totalTokenCount": prompt + output,
    }
    if cached:
        usage["cachedContentTokenCount"] = cached
        usage["cacheTokensDetails"] = [{"modality": "TEXT", "tokenCount": cached}]

    text_parts = [{"text": p} for p in pieces if p]
    if streamed:  # text pieces, then the calls (or the empty malformed ending) in a last event
        part_groups: list[list[dict[str, Any]]] = [[p] for p in text_parts]
        if calls or malformed is not None:
            part_groups.append(calls)
    else:
        part_groups = [text_parts + calls]
    if not part_groups or (not part_groups[-1] and malformed is None):
        part_groups = [*part_groups[:-1], [{"text": ""}]]

    chunks = []
    for index, parts in enumerate(part_groups):
        candidate: dict[str, Any] = {"index": 0}
        if parts:
            candidate["content"] = {"parts": parts, "role": "model"}
        last = index == len(part_groups) - 1
        if last:
            candidate["finishReason"] = "MALFORMED_FUNCTION_CALL" if malformed is not None else "STOP"
            if malformed is not None:
                candidate["finishMessage"] = malformed
        chunk = {"candidates": [candidate], "modelVersion": MODEL_VERSION, "responseId": "fake-response"}
        chunk["usageMetadata"] = usage if last else {"promptTokenCount": prompt, "totalTokenCount": prompt}
        chunks.append(chunk)
    return chunks


def _split(text: str) -> list[str]:
    """Text in a few streamed pieces, as the API sends it (concatenating them gives the text back)."""
    if len(text) < 8:
        return [text]
    third = len(text) // 3
    return [text[:third], text[third : 2 * third], text[2 * third :]]
