"""Retries around a backend call: exponential backoff with jitter, `Retry-After` honoured, bounded.

`complete()` runs one `Backend.stream()` to its `Done` and folds the events into a `Completion`. A
retryable `ProviderError` (429, 5xx, timeouts, dropped connections, cut streams, unreadable replies)
starts the call over from nothing; anything else propagates at once. Backends never retry themselves.
Every Usage event of every attempt goes to `on_usage` the moment it arrives: a failed attempt, or a
call cancelled midway, still counts what its provider reported.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from random import Random

from anyio import sleep

from conclave.backends.base import Backend, Done, Request, TextDelta, ToolCall, Usage
from conclave.errors import ProviderError, ProviderUnavailable, RateLimited

_JITTER = Random()  # the backoff's draws; complete() reads it, and `sleep`, from this module at each call
# (usage, opens_attempt): what a provider reported, and whether it is the first report of its attempt
UsageCallback = Callable[[Usage, bool], Awaitable[None]]


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry one provider call."""

    max_attempts: int = 4
    base_delay_s: float = 1.0
    max_delay_s: float = 30.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")

    def delay(self, attempt: int, error: ProviderError, random: Random) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        backoff = min(self.max_delay_s, self.base_delay_s * 2.0 ** (attempt - 1))
        delay = backoff * (1 + self.jitter * random.random())
        if isinstance(error, RateLimited) and error.retry_after is not None:
            return max(error.retry_after, delay)
        return delay


@dataclass(frozen=True)
class Completion:
    """One finished model call: everything the stream said, and how many attempts it took."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    usage: Usage
    stop_reason: str
    attempts: int


async def complete(
    backend: Backend,
    request: Request,
    policy: RetryPolicy = RetryPolicy(),
    *,
    on_usage: UsageCallback | None = None,
) -> Completion:
    """Run `request` on `backend` to completion, retrying retryable provider errors.

    The returned `Completion` holds only the successful attempt's output; `on_usage` hears every
    attempt's usage as it arrives.
    """
    for attempt in range(1, policy.max_attempts + 1):
        try:
            return await _collect(backend, request, attempt, on_usage)
        except ProviderError as exc:
            if not exc.retryable or attempt == policy.max_attempts:
                raise
            await sleep(policy.delay(attempt, exc, _JITTER))
    raise AssertionError("unreachable: the last attempt returns or raises")


async def _collect(
    backend: Backend, request: Request, attempt: int, on_usage: UsageCallback | None
) -> Completion:
    text: list[str] = []
    calls: list[ToolCall] = []
    usage, reported = Usage(), False
    events = backend.stream(request)
    try:
        async for event in events:
            if isinstance(event, TextDelta):
                text.append(event.text)
            elif isinstance(event, ToolCall):
                calls.append(event)
            elif isinstance(event, Usage):
                usage = usage + event
                if on_usage is not None:
                    await on_usage(event, not reported)
                    reported = True
            elif isinstance(event, Done):
                return Completion("".join(text), tuple(calls), usage, event.stop_reason, attempt)
    finally:
        if isinstance(events, AsyncGenerator):  # close it now, not when it is collected
            await events.aclose()
    raise ProviderUnavailable(backend.provider, "stream ended early (no Done event); retry the call")


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds from `retry-after-ms`, or `Retry-After` as seconds or an HTTP date; None if absent."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when: datetime = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
