"""One contract, every backend: the same request and the same scripted reply give the same events.

Each provider's backend is built through `create_backend` and talks to its own fake wire format
through its real SDK, streamed and not. Stop reasons are the provider's own words, so only their
presence is compared.
"""

from __future__ import annotations

import uuid

import pytest

from conclave.backends import retry
from conclave.backends.base import (
    Backend,
    Done,
    Message,
    Request,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolSpec,
    Usage,
)
from conclave.backends.retry import RetryPolicy, complete
from conclave.errors import StreamCut
from tests.backends import helpers
from tests.fakes.script import Reply
from tests.fakes.server import FakeProviders

PROVIDERS = ["openai", "anthropic", "gemini"]
KEY = "contract-key-5e1f"
TOOL = ToolSpec(
    "read_file",
    "Read a file of the workspace.",
    {
        "type": "object",
        "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["path"],
    },
)
REQUEST = Request(
    system="You are agent C. Answer the task, then call a tool.",
    messages=(Message("user", "What does README.md say?"),),
    tools=(TOOL,),
)
TEXT = "I will read the file first."
ARGUMENTS = {"path": "README.md", "limit": 40}
REPLY = Reply(text=TEXT, tool_calls=[("read_file", ARGUMENTS)], usage=(120, 18, 64))


# one server for the whole module: every test scripts and reads its own agent on it
fakes = pytest.fixture(helpers.serve_fakes, scope="module", name="fakes")


def backend_for(fakes: FakeProviders, provider: str, agent: str, *, stream: bool) -> Backend:
    return helpers.backend_for(
        fakes, stream, provider=provider, key=KEY, model=f"{provider}-model", agent=agent
    )


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_same_reply_gives_the_same_events(fakes: FakeProviders, provider: str, stream: bool) -> None:
    agent = uuid.uuid4().hex[:12]
    fakes.script.enqueue(agent, REPLY)
    backend = backend_for(fakes, provider, agent, stream=stream)
    assert backend.provider == provider
    try:
        events: list[StreamEvent] = [event async for event in backend.stream(REQUEST)]
    finally:
        await backend.aclose()

    texts = [e for e in events if isinstance(e, TextDelta)]
    (call,) = [e for e in events if isinstance(e, ToolCall)]
    assert "".join(t.text for t in texts) == TEXT
    assert (call.name, call.arguments, call.error) == ("read_file", ARGUMENTS, None) and call.id
    # text, then the call, then Done; Usage events in between sum to what the provider reported
    said = [e for e in events if not isinstance(e, Usage)]
    assert said[: len(texts)] == texts and said[len(texts) :][:-1] == [call]
    assert isinstance(events[-1], Done) and events[-1].stop_reason
    usages = [e for e in events if isinstance(e, Usage)]
    assert sum(usages, Usage()) == Usage(120, 18, 64)
    if stream and provider in ("anthropic", "gemini"):  # their streams say the input side first
        assert events.index(usages[0]) < events.index(call) and usages[0].input_tokens == 120
    (recorded,) = fakes.script.requests_of(agent)
    assert recorded.streamed is stream
    assert REQUEST.system in recorded.text() and "What does README.md say?" in recorded.text()
    assert "read_file" in recorded.text()


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_rate_limit_then_success_through_retry(
    fakes: FakeProviders, provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = uuid.uuid4().hex[:12]
    fakes.script.enqueue(agent, Reply(status=429, retry_after=3), Reply(text="second time lucky"))
    backend = backend_for(fakes, provider, agent, stream=True)
    delays: list[float] = []

    async def no_sleep(seconds: float) -> None:
        delays.append(seconds)

    monkeypatch.setattr(retry, "sleep", no_sleep)
    try:
        result = await complete(backend, REQUEST, RetryPolicy())
    finally:
        await backend.aclose()

    assert (result.text, result.attempts, result.tool_calls) == ("second time lucky", 2, ())
    assert len(delays) == 1 and delays[0] >= 3  # Retry-After honoured
    assert len(fakes.script.requests_of(agent)) == 2


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_every_attempt_counts_what_its_provider_billed(
    fakes: FakeProviders, provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 429 bills nothing; a stream cut after its start bills its input where the provider said it
    (Anthropic, Gemini), and OpenAI's usage only ever comes in the last chunk; then the retry's."""
    agent = uuid.uuid4().hex[:12]
    fakes.script.enqueue(
        agent,
        Reply(status=429),
        Reply(text="cut short", cut_stream=True),
        Reply(text="third time, whole", usage=(300, 7, 0)),
    )
    backend = backend_for(fakes, provider, agent, stream=True)
    heard: list[tuple[Usage, bool]] = []

    async def on_usage(usage: Usage, first: bool) -> None:
        heard.append((usage, first))

    async def no_sleep(seconds: float) -> None:
        pass

    monkeypatch.setattr(retry, "sleep", no_sleep)
    try:
        result = await complete(backend, REQUEST, RetryPolicy(), on_usage=on_usage)
    finally:
        await backend.aclose()

    assert result.attempts == 3 and result.usage == Usage(300, 7, 0)  # the answer's own call
    total = sum((usage for usage, _ in heard), Usage())
    assert (total.input_tokens, total.output_tokens, total.cached_input_tokens) == fakes.script.bill[agent]
    cut_input = total.input_tokens - 300
    assert cut_input > 0 if provider != "openai" else cut_input == 0
    assert sum(first for _, first in heard) == (2 if provider != "openai" else 1)  # attempts that reported


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_stream_cut_after_it_began_is_reported_as_cut(fakes: FakeProviders, provider: str) -> None:
    """The connection was made and the answer began: the user is told the stream was cut, whatever
    exception the SDK raised for it (anthropic 2.17 wraps it as a connection error)."""
    agent = uuid.uuid4().hex[:12]
    fakes.script.enqueue(agent, Reply(text="a long answer that never arrives in full", cut_stream=True))
    backend = backend_for(fakes, provider, agent, stream=True)
    try:
        with pytest.raises(StreamCut) as caught:
            async for _ in backend.stream(REQUEST):
                pass
    finally:
        await backend.aclose()

    message = str(caught.value)
    assert caught.value.retryable and "cut after the response began" in message, message
    assert "connect" not in message and KEY not in message, message
