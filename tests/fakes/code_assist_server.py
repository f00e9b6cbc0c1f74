"""A fake Gemini Code Assist API (`cloudcode-pa.googleapis.com/v1internal:*`), the wire Gemini CLI speaks
with a Google login (`oauth-personal`) instead of a key.

It is the Gemini API (tests/fakes/gemini_server.py) in an envelope, as the pinned CLI's CodeAssistServer
sends and reads it:
- `loadCodeAssist` answers that the user is on a tier with a project (so no onboarding is needed);
- `streamGenerateContent?alt=sse` / `generateContent` take `{model, project, user_prompt_id, request}`,
  and each reply chunk goes back as `{"response": GenerateContentResponse, "traceId": ...}`;
- `countTokens` counts about four characters a token; any other method answers `{}`.
The recorded request is the inner `request`, so a CliWorker reads it as any Gemini request. The CLI's
model router (its default model with a Google login is `auto`: a classifier call picks flash or pro
before each turn) is answered here, as JSON naming flash, and billed like any reply.
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.gemini_server import SSE, _Bill, _error, _response_chunks, _sent
from tests.fakes.script import RecordedRequest, Reply, Script, estimate_tokens

PREFIX = "/code-assist/{agent}"
PROJECT = "conclave-test-project"
ROUTER_CHOICE = "model_choice"  # the answer's field in the JSON schema of Gemini CLI's routing classifier
TIER = {"id": "standard-tier", "name": "Gemini Code Assist", "hasOnboardedPreviously": True}


def routes(script: Script) -> list[Route]:
    async def method(request: Request) -> Response:
        agent, name = request.path_params["agent"], request.path_params["method"]
        body = await request.json() if await request.body() else {}
        if name == "loadCodeAssist":
            return JSONResponse(
                {"currentTier": TIER, "allowedTiers": [TIER], "cloudaicompanionProject": PROJECT}
            )
        if name == "countTokens":
            return JSONResponse({"totalTokens": estimate_tokens(json.dumps(body))})
        if name not in ("generateContent", "streamGenerateContent"):
            return JSONResponse({})
        streamed = name == "streamGenerateContent"
        recorded = RecordedRequest(
            provider="gemini",
            agent=agent,
            path=request.url.path,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body.get("request") or {},
            streamed=streamed,
        )
        schema = (recorded.body.get("generationConfig") or {}).get("responseJsonSchema") or {}
        if ROUTER_CHOICE in (schema.get("properties") or {}):
            reply = Reply(text=json.dumps({"reasoning": "A bounded edit.", "model_choice": "flash"}))
        else:
            reply = script.next_reply(recorded)
        await reply.pass_gate()
        if reply.status != 200:
            return _error(reply.status, reply.error_message, reply.retry_after)
        chunks = _response_chunks(reply, recorded, streamed)
        bill = _Bill(script, agent)
        wrapped = [{"response": chunk, "traceId": f"trace-{index}"} for index, chunk in enumerate(chunks)]
        if streamed:
            events = [
                (b"data: " + json.dumps(wrap).encode() + b"\n\n", chunk["usageMetadata"])
                for wrap, chunk in zip(wrapped, chunks, strict=True)
            ]
            return StreamingResponse(
                _sent(events, bill, cut=reply.cut_stream, stall=reply.stall), media_type=SSE
            )
        bill.sent(chunks[0]["usageMetadata"])
        return JSONResponse(wrapped[0])

    return [Route(PREFIX + "/v1internal:{method}", method, methods=["POST", "GET"])]
