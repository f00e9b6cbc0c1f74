"""AnthropicBackend against the fake Messages API, through the real SDK, streamed (SSE) and not."""

from __future__ import annotations

import json
import time
from email.utils import formatdate
from functools import partial

import anthropic
import httpx2
import pytest

from conclave.backends.anthropic import map_error
from conclave.backends.base import Done, Message, Request, TextDelta, ToolCall, ToolSpec, Usage
from conclave.backends.retry import parse_retry_after as retry_after
from conclave.errors import (
    AuthFailed,
    BadRequest,
    MalformedResponse,
    ProviderError,
    ProviderUnavailable,
    RateLimited,
)
from tests.backends import helpers
from tests.backends.helpers import calls_of, text_of
from tests.fakes.script import Reply
from tests.fakes.server import FakeProviders

KEY = "sk-ant-test-0123456789-secret"
SYSTEM = "You are agent A of a council. Answer the task."
EPHEMERAL = {"type": "ephemeral"}
LOOKUP = ToolSpec("lookup", "Look a word up.", {"type": "object", "properties": {"q": {"type": "string"}}})
VOTE = ToolSpec("vote", "Vote.", {"type": "object", "properties": {"label": {"type": "string"}}})


def ask(text: str = "What is 2+2?", **kwargs: object) -> Request:
    return Request(system=SYSTEM, messages=(Message("user", text),), **kwargs)  # type: ignore[arg-type]


run = partial(helpers.run, provider="anthropic", key=KEY, model="claude-test")
fail = partial(helpers.fail, provider="anthropic", key=KEY, model="claude-test", request=ask())


@pytest.mark.anyio
async def test_plain_text_with_cached_prefix(fakes: FakeProviders, stream: bool) -> None:
    answer = "Four. Two plus two is four, and this sentence spans several stream chunks."
    fakes.script.enqueue("a", Reply(text=answer))
    events = await run(fakes, stream, ask(temperature=0.2, seed=7))
    assert text_of(events) == answer
    assert isinstance(events[-2], Usage) and events[-1] == Done("end_turn")
    if stream:
        assert len([e for e in events if isinstance(e, TextDelta)]) > 1
    (sent,) = fakes.script.requests_of("a")
    assert sent.streamed is stream and sent.path == "/anthropic/a/v1/messages"
    assert sent.body["system"] == [{"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL}]
    assert sent.body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}]
    assert sent.body["max_tokens"] == 4096 and sent.body["model"] == "claude-test"
    # API 2026-10-21 rejects temperature; seed has no Anthropic equivalent
    unsent = ("temperature", "seed", "tools", "tool_choice", "output_config")
    assert not [name for name in unsent if name in sent.body]


@pytest.mark.anyio
async def test_tool_call_with_arguments(fakes: FakeProviders, stream: bool) -> None:
    fakes.script.enqueue("a", Reply(text="Let me look.", tool_calls=[("lookup", {"q": "council", "n": 3})]))
    events = await run(fakes, stream, ask(tools=(LOOKUP, VOTE)))
    (call,) = calls_of(events)
    assert (call.name, call.arguments, call.error) == ("lookup", {"q": "council", "n": 3}, None)
    assert call.id.startswith("toolu_") and json.loads(call.raw_arguments) == {"q": "council", "n": 3}
    assert text_of(events) == "Let me look." and events[-1] == Done("tool_use")
    body = fakes.script.requests_of("a")[0].body
    assert body["tool_choice"] == {"type": "auto"}
    assert [t["name"] for t in body["tools"]] == ["lookup", "vote"]
    assert body["tools"][0]["input_schema"] == LOOKUP.parameters
    assert "cache_control" not in body["tools"][0] and body["tools"][-1]["cache_control"] == EPHEMERAL


@pytest.mark.anyio
async def test_two_tool_calls_required(fakes: FakeProviders, stream: bool) -> None:
    fakes.script.enqueue("a", Reply(tool_calls=[("lookup", {"q": "a"}), ("vote", {"label": "B"})]))
    events = await run(fakes, stream, ask(tools=(LOOKUP, VOTE), tool_choice="required"))
    calls = calls_of(events)
    assert [(c.name, c.arguments) for c in calls] == [("lookup", {"q": "a"}), ("vote", {"label": "B"})]
    assert calls[0].id != calls[1].id and text_of(events) == ""
    assert fakes.script.requests_of("a")[0].body["tool_choice"] == {"type": "any"}


@pytest.mark.anyio
async def test_history_with_tool_results(fakes: FakeProviders, stream: bool) -> None:
    first, second = ToolCall("toolu_1", "lookup", {"q": "x"}), ToolCall("toolu_2", "vote", {"label": "A"})
    history = (
        Message("user", "Find x."),
        Message("assistant", "Looking.", tool_calls=(first, second)),
        Message("tool", "x is 42", tool_call_id="toolu_1", tool_name="lookup"),
        Message("tool", "vote recorded", tool_call_id="toolu_2", tool_name="vote"),
        Message("user", "Now answer."),
    )
    fakes.script.enqueue("a", Reply(text="x is 42."))
    events = await run(fakes, stream, Request(system=SYSTEM, messages=history, tools=(LOOKUP, VOTE)))
    assert text_of(events) == "x is 42."
    assert fakes.script.requests_of("a")[0].body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Find x."}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}},
                {"type": "tool_use", "id": "toolu_2", "name": "vote", "input": {"label": "A"}},
            ],
        },
        {
            "role": "user",  # both results and the next user text share one turn, results first
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "x is 42"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "vote recorded"},
                {"type": "text", "text": "Now answer."},
            ],
        },
    ]


@pytest.mark.anyio
async def test_malformed_arguments_become_tool_call_errors(fakes: FakeProviders, stream: bool) -> None:
    fakes.script.enqueue("a", Reply(tool_calls=[("lookup", '{"q": "unterminated'), ("vote", "[1, 2]")]))
    broken, listed = calls_of(await run(fakes, stream, ask(tools=(LOOKUP, VOTE))))
    assert (broken.name, broken.arguments, broken.raw_arguments) == ("lookup", {}, '{"q": "unterminated')
    assert broken.error is not None and "not valid JSON" in broken.error
    assert (listed.arguments, listed.raw_arguments) == ({}, "[1, 2]")
    assert listed.error is not None and "JSON object" in listed.error and "list" in listed.error


@pytest.mark.anyio
async def test_json_mode_sends_schema_and_returns_text(fakes: FakeProviders, stream: bool) -> None:
    schema = {"type": "object", "properties": {"vote": {"type": "string"}}, "required": ["vote"]}
    fakes.script.enqueue("a", Reply(text='{"vote": "B", "reason": "clearest answer"}'))
    events = await run(fakes, stream, ask(response_schema=schema, tools=(VOTE,)))
    assert json.loads(text_of(events)) == {"vote": "B", "reason": "clearest answer"}
    body = fakes.script.requests_of("a")[0].body
    assert body["output_config"] == {"format": {"type": "json_schema", "schema": schema}}
    assert body["tool_choice"] == {"type": "none"}  # tools stay declared (cached prefix) but unusable


@pytest.mark.anyio
async def test_usage_includes_cached_tokens(fakes: FakeProviders, stream: bool) -> None:
    fakes.script.enqueue("a", Reply(text="ok", usage=(1200, 34, 1000)), Reply(text="ok again"))
    first = await run(fakes, stream, ask())
    assert sum((e for e in first if isinstance(e, Usage)), Usage()) == Usage(1200, 34, 1000)
    if stream:  # message_start carries the input side: reported before any text
        assert first[0] == Usage(1200, 1, 1000)
    second = await run(fakes, stream, ask())
    derived = sum((e for e in second if isinstance(e, Usage)), Usage())
    assert derived.input_tokens > 10 and (derived.output_tokens, derived.cached_input_tokens) == (2, 0)
    assert fakes.script.bill["a"] == (1200 + derived.input_tokens, 36, 1000)  # the fake billed what it said


@pytest.mark.anyio
async def test_rate_limited_carries_retry_after(fakes: FakeProviders, stream: bool) -> None:
    reply = Reply(status=429, retry_after=7, error_message="Number of requests too high")
    exc = await fail(fakes, stream, reply)
    assert isinstance(exc, RateLimited) and exc.retry_after == 7.0 and exc.status == 429
    assert "Number of requests too high" in str(exc)


@pytest.mark.anyio
@pytest.mark.parametrize("status", [500, 529])
async def test_server_errors_are_unavailable(fakes: FakeProviders, stream: bool, status: int) -> None:
    exc = await fail(fakes, stream, Reply(status=status, error_message="Overloaded"))
    assert isinstance(exc, ProviderUnavailable) and exc.status == status and exc.retryable


@pytest.mark.anyio
async def test_bad_request_keeps_provider_message(fakes: FakeProviders, stream: bool) -> None:
    exc = await fail(fakes, stream, Reply(status=400, error_message="max_tokens: must be at most 64000"))
    assert type(exc) is BadRequest and "max_tokens: must be at most 64000" in str(exc) and not exc.retryable


@pytest.mark.anyio
@pytest.mark.parametrize("status", [401, 403])
async def test_auth_failures(fakes: FakeProviders, stream: bool, status: int) -> None:
    exc = await fail(fakes, stream, Reply(status=status, error_message=f"invalid x-api-key {KEY}"))
    assert isinstance(exc, AuthFailed) and exc.status == status and "invalid x-api-key" in str(exc)


@pytest.mark.anyio
async def test_garbage_is_malformed(fakes: FakeProviders, stream: bool) -> None:
    exc = await fail(fakes, stream, Reply(text="never sent", garbage=True))
    assert isinstance(exc, MalformedResponse) and exc.retryable


@pytest.mark.anyio
async def test_cut_stream_is_unavailable(fakes: FakeProviders) -> None:
    exc = await fail(fakes, True, Reply(text="a long answer that never arrives", cut_stream=True))
    assert isinstance(exc, ProviderUnavailable) and "cut" in str(exc)


@pytest.mark.anyio
async def test_timeout_is_unavailable(fakes: FakeProviders, stream: bool) -> None:
    exc = await fail(fakes, stream, Reply(text="late", delay=0.6), timeout_s=0.2)
    assert isinstance(exc, ProviderUnavailable) and "timed out" in str(exc)


@pytest.mark.anyio
async def test_key_sent_in_header_never_in_errors(fakes: FakeProviders, stream: bool) -> None:
    fakes.script.enqueue("a", Reply(text="hi"))
    await run(fakes, stream, ask())
    headers = fakes.script.requests_of("a")[0].headers
    # anthropic 2.12 sends a static key as a bearer token, not as x-api-key
    assert headers.get("authorization") == f"Bearer {KEY}" or headers.get("x-api-key") == KEY
    for reply in (Reply(status=401, error_message=KEY), Reply(status=429), Reply(garbage=True)):
        await fail(fakes, stream, reply)  # `fail` asserts the key is absent from the error text


def test_retry_after_forms() -> None:
    assert retry_after({"retry-after": "12"}) == 12.0
    assert retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    in_a_minute = formatdate(time.time() + 60, usegmt=True)  # the HTTP-date form is relative to now
    assert 55 <= (retry_after({"retry-after": in_a_minute}) or 0) <= 60
    assert retry_after({}) is None and retry_after({"retry-after": "soon"}) is None


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("overloaded_error", ProviderUnavailable),
        ("rate_limit_error", RateLimited),
        ("invalid_request_error", BadRequest),
    ],
)
def test_error_event_inside_a_200_stream(kind: str, expected: type[ProviderError]) -> None:
    # the SDK raises a bare APIStatusError with the stream's HTTP 200 for an `event: error` mid-stream
    response = httpx2.Response(200, request=httpx2.Request("POST", "http://fake/v1/messages"))
    body = {"type": "error", "error": {"type": kind, "message": "Overloaded"}}
    mapped = map_error(anthropic.APIStatusError("Overloaded", response=response, body=body), KEY)
    assert type(mapped) is expected and "Overloaded" in str(mapped)
