"""OpenAIBackend against the fake Chat Completions server, streamed and not, through the real SDK."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from functools import partial

import httpx2
import openai
import pytest

from conclave.backends.base import (
    Done,
    Endpoint,
    Message,
    Request,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolSpec,
    Usage,
)
from conclave.backends.openai import OpenAIBackend
from conclave.errors import (
    AuthFailed,
    BadRequest,
    MalformedResponse,
    ProviderError,
    ProviderUnavailable,
    RateLimited,
    StreamCut,
)
from tests.backends import helpers
from tests.backends.helpers import calls_of, text_of
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders

KEY = "sk-test-4f1c0ffee0ddba11"
WEATHER = ToolSpec(
    "get_weather",
    "The forecast for a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
ASK = Request(system="You are agent A.", messages=(Message("user", "Weather in Paris?"),), tools=(WEATHER,))

# one server for the whole module: every test scripts and reads its own agent on it
fakes = pytest.fixture(helpers.serve_fakes, scope="module", name="fakes")

run = partial(helpers.run, provider="openai", key=KEY, model="gpt-test")
fail = partial(helpers.fail, provider="openai", key=KEY, model="gpt-test", request=ASK)


@dataclass
class Fake:
    """One test's agent on the fake server, in one stream mode."""

    fakes: FakeProviders
    agent: str
    streamed: bool

    async def run(self, reply: Reply, request: Request = ASK) -> tuple[list[StreamEvent], RecordedRequest]:
        self.fakes.script.enqueue(self.agent, reply)
        events = await run(self.fakes, self.streamed, request, agent=self.agent)
        (recorded,) = self.fakes.script.requests_of(self.agent)
        assert recorded.streamed is self.streamed
        return events, recorded

    async def failure(self, reply: Reply, *, timeout_s: float = 10.0) -> ProviderError:
        return await fail(self.fakes, self.streamed, reply, timeout_s=timeout_s, agent=self.agent)


@pytest.fixture
def fake(fakes: FakeProviders, stream: bool) -> Fake:
    return Fake(fakes, uuid.uuid4().hex[:12], stream)


@pytest.mark.anyio
async def test_plain_text_ends_with_one_usage_then_done(fake: Fake) -> None:
    events, recorded = await fake.run(Reply(text="It is sunny in Paris today."))

    assert text_of(events) == "It is sunny in Paris today."
    kinds = [type(e) for e in events]
    assert kinds[-2:] == [Usage, Done] and set(kinds[:-2]) == {TextDelta}
    assert events[-1] == Done("stop")
    if fake.streamed:  # the text arrives in pieces, not as one block
        assert sum(isinstance(e, TextDelta) for e in events) > 1
        assert recorded.body["stream_options"] == {"include_usage": True}
    body = recorded.body
    assert body["model"] == "gpt-test" and body["max_completion_tokens"] == 4096
    assert body["messages"] == [
        {"role": "system", "content": "You are agent A."},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    assert "temperature" not in body and "seed" not in body


@pytest.mark.anyio
async def test_tool_call_with_arguments_and_tool_definitions(fake: Fake) -> None:
    request = Request(ASK.system, ASK.messages, (WEATHER,), tool_choice="required", temperature=0.3, seed=7)
    reply = Reply(text="Let me check.", tool_calls=[("get_weather", {"city": "Paris", "days": [1, 2]})])
    events, recorded = await fake.run(reply, request)

    (call,) = calls_of(events)
    assert (call.name, call.arguments, call.error) == ("get_weather", {"city": "Paris", "days": [1, 2]}, None)
    assert call.id.startswith("call_")
    assert text_of(events) == "Let me check."
    assert events[-1] == Done("tool_calls")
    body = recorded.body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": WEATHER.description,
                "parameters": WEATHER.parameters,
            },
        }
    ]
    assert body["tool_choice"] == "required"
    assert (body["temperature"], body["seed"]) == (0.3, 7)


@pytest.mark.anyio
async def test_two_tool_calls_keep_their_order_and_ids(fake: Fake) -> None:
    reply = Reply(tool_calls=[("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})])
    events, _ = await fake.run(reply)

    calls = calls_of(events)
    assert [c.arguments for c in calls] == [{"city": "Paris"}, {"city": "Oslo"}]
    assert len({c.id for c in calls}) == 2
    assert text_of(events) == ""


@pytest.mark.anyio
async def test_history_with_tool_results_uses_tool_calls_and_tool_role(fake: Fake) -> None:
    good = ToolCall("call_1", "get_weather", {"city": "Paris"})
    bad = ToolCall("call_2", "get_weather", {}, raw_arguments="{city: Oslo", error="not JSON")
    history = (
        Message("user", "Weather in Paris and Oslo?"),
        Message("assistant", "Checking.", tool_calls=(good, bad)),
        Message("tool", "18C and sunny", tool_call_id="call_1", tool_name="get_weather"),
        Message("tool", "error: arguments are not JSON", tool_call_id="call_2", tool_name="get_weather"),
    )
    _, recorded = await fake.run(Reply(text="Paris is 18C."), Request("sys", history, (WEATHER,)))

    assert recorded.body["messages"][1:] == [
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{city: Oslo"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C and sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "error: arguments are not JSON"},
    ]


@pytest.mark.anyio
async def test_malformed_arguments_become_a_tool_call_error(fake: Fake) -> None:
    reply = Reply(
        tool_calls=[("get_weather", '{"city": "Par'), ("get_weather", "[1, 2]"), ("get_weather", "")]
    )
    events, _ = await fake.run(reply)

    truncated, listed, empty = calls_of(events)
    assert (truncated.arguments, truncated.raw_arguments) == ({}, '{"city": "Par')
    assert truncated.error is not None and "not valid JSON" in truncated.error
    assert (listed.arguments, listed.raw_arguments) == ({}, "[1, 2]")
    assert listed.error is not None and "JSON object, not a list" in listed.error
    assert (empty.arguments, empty.error) == ({}, None)  # no arguments at all is an empty object
    assert events[-1] == Done("tool_calls")


@pytest.mark.anyio
async def test_json_mode_sends_the_schema_as_response_format(fake: Fake) -> None:
    schema = {"type": "object", "properties": {"vote": {"type": "string"}}, "required": ["vote"]}
    request = Request(ASK.system, ASK.messages, (WEATHER,), response_schema=schema)
    events, recorded = await fake.run(Reply(text='{"vote": "B1"}'), request)

    assert json.loads(text_of(events)) == {"vote": "B1"}
    assert recorded.body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "response", "schema": schema},
    }
    assert "tools" not in recorded.body and "tool_choice" not in recorded.body


@pytest.mark.anyio
async def test_usage_counts_cached_input(fake: Fake) -> None:
    events, _ = await fake.run(Reply(text="ok", usage=(1200, 30, 1024)))

    assert [e for e in events if isinstance(e, Usage)] == [Usage(1200, 30, 1024)]


@pytest.mark.anyio
async def test_rate_limit_carries_retry_after(fake: Fake) -> None:
    error = await fake.failure(Reply(status=429, retry_after=2.5, error_message="Rate limit reached"))

    assert isinstance(error, RateLimited) and error.retryable
    assert (error.retry_after, error.status) == (2.5, 429)
    assert "Rate limit reached" in str(error)


@pytest.mark.anyio
async def test_server_error_is_unavailable(fake: Fake) -> None:
    error = await fake.failure(Reply(status=503, error_message="overloaded"))

    assert isinstance(error, ProviderUnavailable) and error.retryable and error.status == 503
    assert "overloaded" in str(error)


@pytest.mark.anyio
async def test_bad_request_keeps_the_provider_message(fake: Fake) -> None:
    error = await fake.failure(Reply(status=400, error_message="Invalid schema for function 'x'"))

    assert isinstance(error, BadRequest) and not error.retryable
    assert "Invalid schema for function 'x'" in str(error) and error.status == 400


@pytest.mark.anyio
@pytest.mark.parametrize("status", [401, 403])
async def test_refused_key_is_auth_failed_and_never_echoed(fake: Fake, status: int) -> None:
    error = await fake.failure(Reply(status=status, error_message=f"Incorrect API key provided: {KEY}"))

    assert isinstance(error, AuthFailed) and not error.retryable and error.status == status
    assert "Incorrect API key provided" in str(error)  # `failure` checked the key itself is gone


@pytest.mark.anyio
async def test_garbage_is_malformed(fake: Fake) -> None:
    error = await fake.failure(Reply(text="never sent", garbage=True))

    assert isinstance(error, MalformedResponse) and error.retryable


@pytest.mark.anyio
async def test_cut_stream_is_unavailable(fake: Fake) -> None:
    error = await fake.failure(Reply(text="a long answer that never arrives", cut_stream=True))

    assert isinstance(error, ProviderUnavailable) and error.retryable


@pytest.mark.anyio
async def test_timeout_is_unavailable(fake: Fake) -> None:
    error = await fake.failure(Reply(text="late", delay=1.0), timeout_s=0.2)

    assert isinstance(error, ProviderUnavailable) and "0.2s" in str(error)


@pytest.mark.anyio
async def test_key_goes_in_the_authorization_header(fake: Fake) -> None:
    _, recorded = await fake.run(Reply(text="hi"))

    assert recorded.headers["authorization"] == f"Bearer {KEY}"
    assert KEY not in recorded.text()


@pytest.mark.anyio
async def test_stream_closed_cleanly_before_finish_is_unavailable() -> None:
    """A proxy that ends the SSE body early without an error: the SDK stops silently, we must not."""
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    chunk["choices"] = [{"index": 0, "delta": {"content": "half an ans"}, "finish_reason": None}]
    body = f"data: {json.dumps(chunk)}\n\n".encode()

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=body, headers={"content-type": "text/event-stream"})

    backend = OpenAIBackend(
        Endpoint(provider="openai", model="m", api_key=KEY, base_url="http://proxy.invalid/v1")
    )
    http_client = httpx2.AsyncClient(transport=httpx2.MockTransport(handler))
    backend._client = openai.AsyncOpenAI(
        api_key=KEY, base_url="http://proxy.invalid/v1", http_client=http_client
    )
    events: list[StreamEvent] = []
    with pytest.raises(StreamCut, match="ended before a finish_reason"):
        async for event in backend.stream(ASK):
            events.append(event)
    await backend.aclose()
    assert events == [TextDelta("half an ans")]
