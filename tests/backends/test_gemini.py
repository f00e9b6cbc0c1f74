"""GeminiBackend against the fake Gemini API, through the real google-genai SDK, streamed (SSE) and not."""

from __future__ import annotations

import base64
import json
import time
from email.utils import formatdate
from functools import partial
from typing import Any

import pytest
from google.genai import errors as genai_errors
from google.genai import types

from conclave.backends.base import Done, Endpoint, Message, Request, TextDelta, ToolCall, ToolSpec, Usage
from conclave.backends.gemini import SKIP_SIGNATURE, GeminiBackend, _retry_after, _Turn
from conclave.errors import (
    AuthFailed,
    BadRequest,
    MalformedResponse,
    ProviderUnavailable,
    RateLimited,
    StreamCut,
)
from tests.backends import helpers
from tests.backends.helpers import calls_of, text_of
from tests.fakes.script import Reply
from tests.fakes.server import FakeProviders

KEY = "AIzaSy-test-0123456789-secret"
MODEL = "gemini-test"
SYSTEM = "You are agent A of a council. Answer the task."
STRING = {"type": "string"}
LOOKUP = ToolSpec("lookup", "Look a word up.", {"type": "object", "properties": {"q": STRING}})
VOTE = ToolSpec("vote", "Vote for an answer.", {"type": "object", "properties": {"label": STRING}})


def ask(text: str = "What is 2+2?", **kwargs: Any) -> Request:
    return Request(system=SYSTEM, messages=(Message("user", text),), **kwargs)


backend_for = partial(helpers.backend_for, provider="gemini", key=KEY, model=MODEL)
run = partial(helpers.run, provider="gemini", key=KEY, model=MODEL)
fail = partial(helpers.fail, provider="gemini", key=KEY, model=MODEL, request=ask())


def field(obj: dict[str, Any], camel: str) -> Any:
    """A request field by its JSON name; the SDK sends some in proto snake_case, which the API also reads."""
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)
    return obj[camel] if camel in obj else obj[snake]


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@pytest.mark.anyio
async def test_plain_text(fakes: FakeProviders, stream: bool) -> None:
    answer = "Four. Two plus two is four, and this sentence spans several stream chunks."
    fakes.script.enqueue("a", Reply(text=answer))
    events = await run(fakes, stream, ask(temperature=0.2, seed=7, max_tokens=321))
    assert text_of(events) == answer
    assert len([e for e in events if isinstance(e, TextDelta)]) == (3 if stream else 1)
    assert isinstance(events[-2], Usage) and events[-1] == Done("stop")
    (sent,) = fakes.script.requests
    method = "streamGenerateContent" if stream else "generateContent"
    assert sent.path == f"/gemini/a/v1beta/models/{MODEL}:{method}" and sent.streamed is stream
    assert sent.headers["x-goog-api-key"] == KEY
    assert sent.body["systemInstruction"]["parts"] == [{"text": SYSTEM}]
    assert sent.body["contents"] == [{"role": "user", "parts": [{"text": "What is 2+2?"}]}]
    assert sent.body["generationConfig"] == {"temperature": 0.2, "seed": 7, "maxOutputTokens": 321}
    assert "tools" not in sent.body


@pytest.mark.anyio
async def test_tool_call_with_arguments(fakes: FakeProviders, stream: bool) -> None:
    fakes.script.enqueue("a", Reply(text="Let me check.", tool_calls=[("lookup", {"q": "quorum"})]))
    events = await run(fakes, stream, ask(tools=(LOOKUP, VOTE)))
    (call,) = calls_of(events)
    assert call.name == "lookup" and call.arguments == {"q": "quorum"} and call.error is None
    assert call.id.startswith("call_") and json.loads(call.raw_arguments) == {"q": "quorum"}
    assert text_of(events) == "Let me check." and events[-1] == Done("tool_calls")
    body = fakes.script.requests[0].body
    declarations = body["tools"][0]["functionDeclarations"]
    assert [d["name"] for d in declarations] == ["lookup", "vote"]
    assert field(declarations[0], "parametersJsonSchema") == LOOKUP.parameters
    assert declarations[1]["description"] == VOTE.description
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": "AUTO"}}


@pytest.mark.anyio
async def test_two_tool_calls_required(fakes: FakeProviders, stream: bool) -> None:
    fakes.script.enqueue("a", Reply(tool_calls=[("lookup", {"q": "a"}), ("vote", {"label": "B"})]))
    events = await run(fakes, stream, ask(tools=(LOOKUP, VOTE), tool_choice="required"))
    first, second = calls_of(events)
    assert (first.name, first.arguments) == ("lookup", {"q": "a"})
    assert (second.name, second.arguments) == ("vote", {"label": "B"})
    assert first.id != second.id
    assert fakes.script.requests[0].body["toolConfig"]["functionCallingConfig"]["mode"] == "ANY"


@pytest.mark.anyio
async def test_history_with_tool_result_round_trips_signature(fakes: FakeProviders, stream: bool) -> None:
    fakes.script.enqueue("a", Reply(tool_calls=[("lookup", {"q": "quorum"}), ("vote", {"label": "A"})]))
    fakes.script.enqueue("a", Reply(text="A quorum is the minimum number of members."))
    backend = backend_for(fakes, stream)
    try:
        first = [e async for e in backend.stream(ask("Define quorum.", tools=(LOOKUP, VOTE)))]
        lookup, vote = calls_of(first)
        history = (
            Message("user", "Define quorum."),
            Message("assistant", "", tool_calls=(lookup, vote)),
            Message("tool", "the minimum number of members", tool_call_id=lookup.id, tool_name="lookup"),
            Message("tool", "recorded", tool_call_id=vote.id),  # name found from the call
        )
        second = [e async for e in backend.stream(Request(SYSTEM, history, tools=(LOOKUP, VOTE)))]
    finally:
        await backend.aclose()
    assert text_of(second) == "A quorum is the minimum number of members."
    contents = fakes.script.requests[1].body["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user"]
    call_parts = contents[1]["parts"]
    assert [p["functionCall"] for p in call_parts] == [
        {"name": "lookup", "args": {"q": "quorum"}},  # our generated ids are not sent back
        {"name": "vote", "args": {"label": "A"}},
    ]
    assert field(call_parts[0], "thoughtSignature") == b64(b"sig-lookup")  # what the fake sent
    assert "thoughtSignature" not in call_parts[1] and "thought_signature" not in call_parts[1]
    assert [p["functionResponse"] for p in contents[2]["parts"]] == [
        {"name": "lookup", "response": {"output": "the minimum number of members"}},
        {"name": "vote", "response": {"output": "recorded"}},
    ]


@pytest.mark.anyio
async def test_foreign_history_gets_skip_signature(fakes: FakeProviders, stream: bool) -> None:
    fakes.script.enqueue("a", Reply(text="ok"))
    call = ToolCall("toolu_01", "lookup", {"q": "x"})
    bad = ToolCall("call_9", "vote", {}, raw_arguments="{label: A", error="not JSON")
    history = (
        Message("user", "go"),
        Message("assistant", "thinking", tool_calls=(bad, call)),
        Message("tool", "fix your JSON", tool_call_id="call_9"),
        Message("tool", "found", tool_call_id="toolu_01"),
    )
    await run(fakes, stream, Request(SYSTEM, history, tools=(LOOKUP, VOTE)))
    model, results = fakes.script.requests[0].body["contents"][1:]
    assert model["parts"][:2] == [{"text": "thinking"}, {"text": "[malformed call to vote: {label: A]"}]
    assert model["parts"][2]["functionCall"] == {"id": "toolu_01", "name": "lookup", "args": {"q": "x"}}
    assert field(model["parts"][2], "thoughtSignature") == b64(SKIP_SIGNATURE)  # first real call of the turn
    assert results["parts"][0] == {"text": "[result of call_9]: fix your JSON"}
    found = {"id": "toolu_01", "name": "lookup", "response": {"output": "found"}}
    assert results["parts"][1]["functionResponse"] == found


@pytest.mark.anyio
@pytest.mark.parametrize("tools", [(VOTE,), (LOOKUP, VOTE)], ids=["one-tool", "two-tools"])
async def test_malformed_arguments_become_tool_call_error(
    fakes: FakeProviders, stream: bool, tools: tuple[ToolSpec, ...]
) -> None:
    fakes.script.enqueue("a", Reply(text="Voting now.", tool_calls=[("vote", "{label: 'B'")]))
    events = await run(fakes, stream, ask(tools=tools))
    (call,) = calls_of(events)
    # the SDK drops the API's finishMessage, so the name is known only when one tool was offered
    assert call.name == ("vote" if len(tools) == 1 else "") and call.arguments == {}
    assert "MALFORMED_FUNCTION_CALL" in (call.error or "") and call.id.startswith("call_")
    assert text_of(events) == "Voting now." and events[-1] == Done("malformed_function_call")


@pytest.mark.anyio
async def test_json_mode_sends_schema_and_returns_text(fakes: FakeProviders, stream: bool) -> None:
    schema = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}
    answer = json.dumps({"label": "B", "reason": "it cites its sources"})
    fakes.script.enqueue("a", Reply(text=answer))
    events = await run(fakes, stream, ask(response_schema=schema, tools=(VOTE,)))
    assert json.loads(text_of(events)) == {"label": "B", "reason": "it cites its sources"}
    body = fakes.script.requests[0].body
    assert body["generationConfig"]["responseMimeType"] == "application/json"
    assert body["generationConfig"]["responseJsonSchema"] == schema
    assert "tools" not in body and "toolConfig" not in body


@pytest.mark.anyio
async def test_usage_includes_cached_tokens(fakes: FakeProviders, stream: bool) -> None:
    fakes.script.enqueue("a", Reply(text="Cached answer, long enough to stream.", usage=(1200, 40, 1024)))
    events = await run(fakes, stream, ask())
    usages = [e for e in events if isinstance(e, Usage)]
    assert sum(usages, Usage()) == Usage(1200, 40, 1024) and fakes.script.bill["a"] == (1200, 40, 1024)
    if stream:  # the first chunk's running totals carry the prompt: reported at once
        assert usages[0] == Usage(1200, 0, 0) and events.index(usages[0]) < len(events) - 2


@pytest.mark.anyio
async def test_rate_limited_with_retry_after(fakes: FakeProviders, stream: bool) -> None:
    reply = Reply(status=429, retry_after=3, error_message="Quota exceeded for model")
    error = await fail(fakes, stream, reply)
    assert isinstance(error, RateLimited) and error.retry_after == 3.0
    assert "Quota exceeded for model" in str(error)
    assert len(fakes.script.requests) == 1  # the SDK did not retry on its own


@pytest.mark.anyio
async def test_server_error_is_unavailable_and_not_retried(fakes: FakeProviders, stream: bool) -> None:
    error = await fail(fakes, stream, Reply(status=500, error_message="Internal error encountered."))
    assert type(error) is ProviderUnavailable and error.status == 500 and error.retryable
    assert len(fakes.script.requests) == 1


@pytest.mark.anyio
async def test_bad_request_carries_provider_message(fakes: FakeProviders, stream: bool) -> None:
    reply = Reply(status=400, error_message="* GenerateContentRequest.contents: empty")
    error = await fail(fakes, stream, reply)
    assert type(error) is BadRequest and error.status == 400 and not error.retryable
    assert "GenerateContentRequest.contents: empty" in str(error)


@pytest.mark.anyio
@pytest.mark.parametrize("status", [401, 403])
async def test_auth_failed(fakes: FakeProviders, stream: bool, status: int) -> None:
    error = await fail(fakes, stream, Reply(status=status, error_message=f"denied for key {KEY}"))
    assert type(error) is AuthFailed and error.status == status
    assert "denied for key [api key]" in str(error) and KEY not in str(error)  # an echoed key does not leak


@pytest.mark.anyio
async def test_garbage_is_malformed(fakes: FakeProviders, stream: bool) -> None:
    error = await fail(fakes, stream, Reply(garbage=True))
    assert type(error) is MalformedResponse and error.retryable


@pytest.mark.anyio
async def test_cut_stream_is_unavailable(fakes: FakeProviders, stream: bool) -> None:
    text = "This answer is long enough to arrive in three chunks, but only one gets through."
    error = await fail(fakes, stream, Reply(text=text, cut_stream=True))
    if stream:  # the answer began to arrive: a cut stream (tests/backends/test_contract.py)
        assert type(error) is StreamCut and "cut after the response began" in str(error)
    else:  # one body cut in half: the connection failed
        assert type(error) is ProviderUnavailable and "connection" in str(error)


@pytest.mark.anyio
async def test_timeout_is_unavailable(fakes: FakeProviders, stream: bool) -> None:
    error = await fail(fakes, stream, Reply(text="late", delay=1.5), timeout_s=0.3)
    assert type(error) is ProviderUnavailable and "0.3s" in str(error)


def make_error(code: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Exception:
    response = type("Response", (), {"headers": headers or {}})()
    return genai_errors.ClientError(code, body, response)  # type: ignore[arg-type]


def test_retry_after_from_retry_info_and_http_date() -> None:
    retry_info = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "12.5s"}
    body = {"error": {"code": 429, "message": "slow", "details": [retry_info]}}
    assert _retry_after(make_error(429, body)) == 12.5
    assert _retry_after(make_error(429, body, {"retry-after": "4"})) == 4.0  # the header wins
    in_ten = formatdate(time.time() + 10, usegmt=True)
    assert 8 <= (_retry_after(make_error(429, {"error": {}}, {"Retry-After": in_ten})) or 0) <= 10
    assert _retry_after(make_error(429, {"error": {"code": 429}})) is None


def test_invalid_key_400_is_auth_failed() -> None:
    info = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}
    body = {"error": {"code": 400, "message": "API key not valid.", "details": [info]}}
    backend = GeminiBackend(
        Endpoint(provider="gemini", model=MODEL, api_key=KEY, base_url="http://127.0.0.1:9")
    )
    error = backend._map_error(make_error(400, body))
    assert type(error) is AuthFailed and "API key not valid." in str(error)


def test_stream_without_finish_reason_is_unavailable() -> None:
    backend = GeminiBackend(
        Endpoint(provider="gemini", model=MODEL, api_key=KEY, base_url="http://127.0.0.1:9")
    )
    turn = _Turn(backend, ask())
    chunk = types.GenerateContentResponse(
        candidates=[types.Candidate(content=types.Content(role="model", parts=[types.Part(text="Half")]))]
    )
    assert turn.feed(chunk) == [TextDelta("Half")]
    with pytest.raises(ProviderUnavailable, match="finish_reason"):
        turn.finish(streamed=True)


def test_blocked_prompt_ends_with_blocked() -> None:
    backend = GeminiBackend(
        Endpoint(provider="gemini", model=MODEL, api_key=KEY, base_url="http://127.0.0.1:9")
    )
    turn = _Turn(backend, ask())
    blocked = types.GenerateContentResponse(
        prompt_feedback=types.GenerateContentResponsePromptFeedback(block_reason=types.BlockedReason.SAFETY),
        usage_metadata=types.GenerateContentResponseUsageMetadata(prompt_token_count=9, total_token_count=9),
    )
    assert turn.feed(blocked) == [Usage(9, 0, 0)]
    assert turn.finish(streamed=False) == [Done("blocked")]
