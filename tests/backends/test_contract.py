"""One contract, every backend: the same request and the same scripted reply give the same events.

Each provider's backend is built through `create_backend` and talks to its own fake wire format
through its real SDK, streamed and not. Stop reasons are the provider's own words, so only their
presence is compared.
"""

from __future__ import annotations

import uuid

import pytest

from conclave.backends.base import (
    Backend,
    Done,
    Event,
    Message,
    Request,
    TextDelta,
    ToolCall,
    ToolSpec,
    Usage,
)
from conclave.backends.retry import RetryPolicy, complete
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
        events: list[Event] = [event async for event in backend.stream(REQUEST)]
    finally:
        await backend.aclose()

    texts = [e for e in events if isinstance(e, TextDelta)]
    (call,) = [e for e in events if isinstance(e, ToolCall)]
    assert "".join(t.text for t in texts) == TEXT
    assert (call.name, call.arguments, call.error) == ("read_file", ARGUMENTS, None) and call.id
    # text, then the call, then exactly one Usage, then Done, and nothing else
    assert events[: len(texts)] == texts
    assert events[len(texts) :][:-1] == [call, Usage(120, 18, 64)]
    assert isinstance(events[-1], Done) and events[-1].stop_reason
    (recorded,) = fakes.script.requests_of(agent)
    assert recorded.streamed is stream
    assert REQUEST.system in recorded.text() and "What does README.md say?" in recorded.text()
    assert "read_file" in recorded.text()


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_rate_limit_then_success_through_retry(fakes: FakeProviders, provider: str) -> None:
    agent = uuid.uuid4().hex[:12]
    fakes.script.enqueue(agent, Reply(status=429, retry_after=3), Reply(text="second time lucky"))
    backend = backend_for(fakes, provider, agent, stream=True)
    delays: list[float] = []

    async def no_sleep(seconds: float) -> None:
        delays.append(seconds)

    try:
        result = await complete(backend, REQUEST, RetryPolicy(), sleep=no_sleep)
    finally:
        await backend.aclose()

    assert (result.text, result.attempts, result.tool_calls) == ("second time lucky", 2, ())
    assert len(delays) == 1 and delays[0] >= 3  # Retry-After honoured
    assert len(fakes.script.requests_of(agent)) == 2
