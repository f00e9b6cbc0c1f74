"""Cached input, as each provider bills it, through the real SDKs: two calls with the same long system
prompt, and the second one's prefix comes from the fakes' prompt cache (tests/fakes/prompt_cache.py).

OpenAI's `cached_tokens` and Gemini's `cachedContentTokenCount` are part of the prompt's tokens;
Anthropic's `cache_read_input_tokens` and `cache_creation_input_tokens` are beside `input_tokens`. Our
`Usage` counts every input token in `input_tokens` and the cache reads among them in
`cached_input_tokens`, whichever way the provider said it, and prices the reads at `cached_input`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conclave.backends.base import Message, Request, Usage
from conclave.config.models import Price
from tests.backends import helpers
from tests.fakes.prompt_cache import MIN_TOKENS, OPENAI_STEP
from tests.fakes.script import Reply, Script
from tests.fakes.server import FakeProviders

PROVIDERS = ["openai", "anthropic", "gemini"]
SYSTEM = "You are agent C of a team. " + "Follow the rules of the house, every one of them. " * 400
PRICE = Price(input=3.0, output=15.0, cached_input=0.3)


@pytest.fixture(scope="module")
def fakes() -> Iterator[FakeProviders]:
    with FakeProviders(Script(prompt_cache=True)) as running:
        yield running


async def usage_of(fakes: FakeProviders, provider: str, agent: str, stream: bool, question: str) -> Usage:
    request = Request(system=SYSTEM, messages=(Message("user", question),))
    events = await helpers.run(
        fakes, stream, request, provider=provider, key="k-0123456789", model="m", agent=agent
    )
    return sum((event for event in events if isinstance(event, Usage)), Usage())


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_repeated_prefix_is_counted_as_cached_input(
    fakes: FakeProviders, provider: str, stream: bool
) -> None:
    agent = f"{provider}-{stream}"
    fakes.script.set_default(agent, Reply(text="Paris."))
    first = await usage_of(fakes, provider, agent, stream, "What is the capital of France?")
    second = await usage_of(fakes, provider, agent, stream, "And the capital of Italy, please?")

    assert first.cached_input_tokens == 0  # nothing cached yet (Anthropic writes its prefix here)
    assert (
        MIN_TOKENS <= second.cached_input_tokens < second.input_tokens
    )  # the system prompt, not the question
    if provider == "openai":
        assert second.cached_input_tokens % OPENAI_STEP == 0
    # what the provider billed, as Conclave counts it: every input token, the cached ones among them
    total = first + second
    assert (total.input_tokens, total.output_tokens, total.cached_input_tokens) == fakes.script.bill[agent]
    # the cached tokens at their own price
    fresh = second.input_tokens - second.cached_input_tokens
    expected = (fresh * 3.0 + second.cached_input_tokens * 0.3 + second.output_tokens * 15.0) / 1e6
    assert second.priced(PRICE).cost_usd == pytest.approx(expected)
    assert expected < Usage(second.input_tokens, second.output_tokens).priced(PRICE).cost_usd  # type: ignore[operator]


@pytest.mark.anyio
async def test_anthropic_writes_the_cache_on_the_first_call_and_reads_it_on_the_next(
    fakes: FakeProviders,
) -> None:
    """On the wire, through the SDK: the first call's prefix (up to its `cache_control` mark) is a cache
    write beside `input_tokens`, the second's a read of as many tokens; an unmarked prompt caches nothing."""
    import anthropic

    agent = "anthropic-wire"
    fakes.script.set_default(agent, Reply(text="Paris."))
    client = anthropic.AsyncAnthropic(api_key="k-0123456789", base_url=fakes.base_url("anthropic", agent))
    marked = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    try:
        used = []
        for system, question in (
            (marked, "France?"),
            (marked, "Italy?"),
            (SYSTEM, "Spain?"),
            (SYSTEM, "Peru?"),
        ):
            message = await client.messages.create(
                model="m", max_tokens=64, system=system, messages=[{"role": "user", "content": question}]
            )
            used.append(message.usage)
    finally:
        await client.close()
    written = used[0].cache_creation_input_tokens or 0
    assert written >= MIN_TOKENS and not used[0].cache_read_input_tokens
    assert used[1].cache_read_input_tokens == written and not used[1].cache_creation_input_tokens
    assert used[1].input_tokens < used[0].input_tokens + written  # the rest only
    assert all(not u.cache_read_input_tokens and not u.cache_creation_input_tokens for u in used[2:])
