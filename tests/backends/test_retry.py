"""retry.complete against a scripted in-memory backend: no network, sleeps recorded instead of slept (the
`sleeps` fixture stands in for the module's `sleep`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from random import Random
from typing import ClassVar

import pytest

from conclave.backends import retry
from conclave.backends.base import Done, Message, Request, StreamEvent, TextDelta, ToolCall, Usage
from conclave.backends.retry import Completion, RetryPolicy, complete, parse_retry_after
from conclave.errors import (
    AuthFailed,
    BadRequest,
    MalformedResponse,
    ProviderError,
    ProviderUnavailable,
    RateLimited,
)

REQUEST = Request(system="sys", messages=(Message("user", "hi"),))
NO_JITTER = RetryPolicy(jitter=0.0)


class ScriptedBackend:
    """Each call plays the next script: its events in order, then its error if it ends with one."""

    provider: ClassVar[str] = "scripted"

    def __init__(self, *scripts: Sequence[StreamEvent | ProviderError]) -> None:
        self.scripts = list(scripts)
        self.calls = 0
        self.closed_streams = 0

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        assert request is REQUEST
        script = self.scripts[self.calls]
        self.calls += 1
        try:
            for item in script:
                if isinstance(item, ProviderError):
                    raise item
                yield item
        finally:
            self.closed_streams += 1

    async def aclose(self) -> None:
        pass


def ok(text: str = "fine") -> list[StreamEvent | ProviderError]:
    return [TextDelta(text), Usage(10, 2, 4), Done("stop")]


def unavailable() -> list[StreamEvent | ProviderError]:
    return [ProviderUnavailable("scripted", "503", status=503)]


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> Sleeps:
    """The retry's waits, recorded instead of slept."""
    recorded = Sleeps()
    monkeypatch.setattr(retry, "sleep", recorded)
    return recorded


@pytest.mark.anyio
async def test_a_clean_stream_folds_into_a_completion(sleeps: Sleeps) -> None:
    call = ToolCall("c1", "vote", {"answer": "A1"})
    backend = ScriptedBackend(
        [TextDelta("I "), TextDelta("vote."), call, Usage(100, 20, 60), Done("tool_calls")]
    )

    result = await complete(backend, REQUEST, RetryPolicy())

    assert result == Completion("I vote.", (call,), Usage(100, 20, 60), "tool_calls", attempts=1)
    assert sleeps.delays == [] and backend.closed_streams == 1


@pytest.mark.anyio
async def test_backoff_doubles_up_to_the_cap(sleeps: Sleeps) -> None:
    backend = ScriptedBackend(*[unavailable()] * 5, ok())
    policy = RetryPolicy(max_attempts=6, base_delay_s=1.0, max_delay_s=5.0, jitter=0.0)

    result = await complete(backend, REQUEST, policy)

    assert sleeps.delays == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert (result.text, result.attempts, backend.calls) == ("fine", 6, 6)


@pytest.mark.anyio
async def test_jitter_stretches_each_delay_by_up_to_half(
    sleeps: Sleeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = ScriptedBackend(unavailable(), unavailable(), ok())
    draws = Random(3)
    expected = [1.0 * (1 + 0.5 * draws.random()), 2.0 * (1 + 0.5 * draws.random())]
    monkeypatch.setattr(retry, "_JITTER", Random(3))  # the same draws as `draws`

    await complete(backend, REQUEST, RetryPolicy())

    assert sleeps.delays == pytest.approx(expected)
    assert 1.0 <= sleeps.delays[0] <= 1.5 and 2.0 <= sleeps.delays[1] <= 3.0


@pytest.mark.anyio
async def test_retry_after_is_honoured_when_longer_than_the_backoff(sleeps: Sleeps) -> None:
    backend = ScriptedBackend(
        [RateLimited("scripted", "slow down", retry_after=7.5)],
        [RateLimited("scripted", "slow down", retry_after=0.1)],
        [RateLimited("scripted", "slow down")],
        ok(),
    )

    result = await complete(backend, REQUEST, NO_JITTER)

    assert sleeps.delays == [7.5, 2.0, 4.0]  # never shorter than the backoff either
    assert result.attempts == 4


@pytest.mark.anyio
async def test_attempts_are_bounded_and_the_last_error_is_raised(sleeps: Sleeps) -> None:
    errors = [ProviderUnavailable("scripted", f"failure {n}") for n in range(1, 4)]
    backend = ScriptedBackend(*[[e] for e in errors], ok())

    with pytest.raises(ProviderUnavailable) as caught:
        await complete(backend, REQUEST, RetryPolicy(max_attempts=3, jitter=0.0))

    assert caught.value is errors[-1]
    assert backend.calls == 3 and sleeps.delays == [1.0, 2.0]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "error",
    [BadRequest("scripted", "bad schema", status=400), AuthFailed("scripted", "bad key", status=401)],
    ids=["400", "401"],
)
async def test_client_errors_are_not_retried(error: ProviderError, sleeps: Sleeps) -> None:
    backend = ScriptedBackend([error], ok())

    with pytest.raises(type(error)) as caught:
        await complete(backend, REQUEST, RetryPolicy())

    assert caught.value is error and backend.calls == 1 and sleeps.delays == []


@pytest.mark.anyio
async def test_a_retry_discards_the_partial_output_of_the_failed_attempt(sleeps: Sleeps) -> None:
    partial: list[StreamEvent | ProviderError] = [
        TextDelta("half of a"),
        ToolCall("c0", "vote", {"answer": "A1"}),
        MalformedResponse("scripted", "?"),
    ]
    backend = ScriptedBackend(partial, [TextDelta("whole answer"), Usage(5, 1, 0), Done("stop")])

    result = await complete(backend, REQUEST, NO_JITTER)

    assert (result.text, result.tool_calls, result.usage) == ("whole answer", (), Usage(5, 1, 0))
    assert result.attempts == 2
    assert backend.closed_streams == 2


@pytest.mark.anyio
async def test_a_stream_without_done_counts_as_cut_and_is_retried(sleeps: Sleeps) -> None:
    backend = ScriptedBackend([TextDelta("and then")], ok("again"))

    result = await complete(backend, REQUEST, NO_JITTER)

    assert (result.text, result.attempts, sleeps.delays) == ("again", 2, [1.0])


@pytest.mark.anyio
async def test_a_stream_without_done_on_the_last_attempt_is_unavailable() -> None:
    backend = ScriptedBackend([TextDelta("and then")])

    with pytest.raises(ProviderUnavailable, match="stream ended early"):
        await complete(backend, REQUEST, RetryPolicy(max_attempts=1))


def test_a_policy_needs_at_least_one_attempt() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)


def test_retry_after_headers_parse_as_seconds() -> None:
    later = datetime.now(UTC) + timedelta(seconds=90)

    assert parse_retry_after({"retry-after": "2.5"}) == 2.5
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert parse_retry_after({"retry-after": format_datetime(later, usegmt=True)}) == pytest.approx(90, abs=2)
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None
