"""Provider-generic helpers for the backend tests: build a backend at the fake, run it, expect a failure.

Everything provider-specific (`provider`, `key`, `model`, and for `fail` the request) is keyword-only,
so that each provider module binds its own once, e.g.
`run = partial(helpers.run, provider="anthropic", key=KEY, model="claude-test")`,
and keeps calling `run(fakes, stream, request)`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from conclave.backends import create_backend
from conclave.backends.base import Backend, Endpoint, Request, StreamEvent, TextDelta, ToolCall
from conclave.errors import ProviderError
from tests.fakes.script import Reply
from tests.fakes.server import FakeProviders


def serve_fakes() -> Iterator[FakeProviders]:
    """The fake provider servers, running until the fixture built on this is torn down."""
    with FakeProviders() as running:
        yield running


def backend_for(
    fakes: FakeProviders,
    stream: bool,
    *,
    provider: str,
    key: str,
    model: str,
    timeout_s: float = 10.0,
    agent: str = "a",
) -> Backend:
    """`provider`'s backend, through `create_backend`, pointed at `agent`'s place on the fake server."""
    url = fakes.base_url(provider, agent)
    return create_backend(
        Endpoint(
            provider=provider, model=model, api_key=key, base_url=url, timeout_s=timeout_s, stream=stream
        )
    )


async def run(fakes: FakeProviders, stream: bool, request: Request, **options: Any) -> list[StreamEvent]:
    """Every event of one `request` to a fresh backend (`options` as for `backend_for`), closed afterwards."""
    backend = backend_for(fakes, stream, **options)
    try:
        return [event async for event in backend.stream(request)]
    finally:
        await backend.aclose()


async def fail(
    fakes: FakeProviders,
    stream: bool,
    reply: Reply,
    *,
    request: Request,
    key: str,
    agent: str = "a",
    **options: Any,
) -> ProviderError:
    """The error `request` ends in when `reply` is scripted; asserts the key appears nowhere in it."""
    fakes.script.enqueue(agent, reply)
    with pytest.raises(ProviderError) as caught:
        await run(fakes, stream, request, key=key, agent=agent, **options)
    assert key not in str(caught.value) and key not in repr(caught.value)
    return caught.value


def text_of(events: list[StreamEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def calls_of(events: list[StreamEvent]) -> list[ToolCall]:
    return [e for e in events if isinstance(e, ToolCall)]
