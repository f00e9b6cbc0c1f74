"""What every backend's error mapping shares: an SDK call's failures raised as conclave.errors, and the
failures of the transport under the SDK (httpx2) in one wording.

Each backend still maps its SDK's own status errors (their bodies differ); `mapped` runs that mapping
around a stream of events, so a failure is translated in one place (anthropic.py, gemini.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from conclave.backends.base import redact
from conclave.errors import MalformedResponse, ProviderError, ProviderUnavailable

T = TypeVar("T")


async def mapped(
    events: AsyncIterator[T], map_error: Callable[[Exception], ProviderError | None]
) -> AsyncIterator[T]:
    """`events`, with an exception `map_error` knows raised as its ProviderError (from it); our own
    errors and anything it does not know (a bug) pass unchanged."""
    try:
        async for event in events:
            yield event
    except ProviderError:
        raise
    except Exception as exc:
        error = map_error(exc)
        if error is None:
            raise
        raise error from exc


def transport_error(
    provider: str, exc: Exception, api_key: str, timeout_s: float | None = None
) -> ProviderError | None:
    """A timeout, a cut connection or a reply that is not JSON, under the SDK; None for anything else."""
    import httpx2

    if isinstance(exc, httpx2.TimeoutException):
        within = f" within {timeout_s:g}s" if timeout_s is not None else ""
        return ProviderUnavailable(provider, f"no answer{within}: the request or the stream timed out")
    if isinstance(exc, httpx2.TransportError):
        reason = redact(str(exc), api_key) or type(exc).__name__
        return ProviderUnavailable(provider, f"the connection failed or was cut: {reason}")
    if isinstance(exc, json.JSONDecodeError):
        return MalformedResponse(provider, f"a reply was not JSON: {exc.msg}")
    return None
