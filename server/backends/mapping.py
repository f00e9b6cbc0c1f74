"""What every backend's error mapping shares: an SDK call's failures raised as conclave.errors, and the
failures of the transport under the SDK (httpx2) in one wording.

Each backend reads its SDK's errors (their bodies differ) and `status_error` turns the status, or the
kind of error the provider named, into our type by one rule; `mapped` runs a backend's mapping around
its stream of events, so a failure is translated in one place (anthropic.py, gemini.py, openai.py).
A failure after the first event whose cause is the transport is a cut stream on every provider: it is
read from the exception's cause chain, not its class, since SDK releases rewrap it (anthropic 2.17 turned
it into a connection error).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Literal, TypeVar

from conclave import errors
from conclave.backends.base import redact
from conclave.errors import ProviderError

T = TypeVar("T")
ErrorKind = Literal["rate_limited", "auth", "refused", "unavailable"]


async def mapped(
    events: AsyncIterator[T], map_error: Callable[[Exception], ProviderError | None], *, provider: str
) -> AsyncIterator[T]:
    """`events`, with an exception `map_error` knows raised as its ProviderError (from it), and one whose
    cause is the transport, after the first event, as StreamCut; our own errors and anything else
    neither knows (a bug) pass unchanged."""
    began = False
    try:
        async for event in events:
            began = True
            yield event
    except ProviderError:
        raise
    except Exception as exc:
        cause = cut_cause(exc) if began else None
        if cause is not None:
            # the cause's type only: its text can quote the provider's reply, and "connect" misleads
            reason = f"the stream was cut after the response began ({type(cause).__name__})"
            raise errors.StreamCut(provider, reason) from exc
        error = map_error(exc)
        if error is None:
            raise
        raise error from exc


def cut_cause(exc: BaseException) -> BaseException | None:
    """The dropped connection under `exc`, itself or along its cause and context chain; None if it has
    none, or if a timeout is on the chain (a timeout is reported as one, not as a cut)."""
    import anyio
    import httpx2

    dropped = (httpx2.TransportError, ConnectionError, anyio.EndOfStream, anyio.BrokenResourceError)
    found: BaseException | None = None
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (httpx2.TimeoutException, TimeoutError)):
            return None
        if found is None and isinstance(current, dropped):
            found = current
        current = current.__cause__ or current.__context__
    return found


def transport_error(
    provider: str, exc: Exception, api_key: str, timeout_s: float | None = None
) -> ProviderError | None:
    """A timeout, a cut connection or a reply that is not JSON, under the SDK; None for anything else."""
    import httpx2

    if isinstance(exc, httpx2.TimeoutException):
        within = f" within {timeout_s:g}s" if timeout_s is not None else ""
        return errors.ProviderUnavailable(provider, f"no answer{within}: the request or the stream timed out")
    if isinstance(exc, httpx2.TransportError):
        reason = redact(str(exc), api_key) or type(exc).__name__
        return errors.ProviderUnavailable(provider, f"the connection failed or was cut: {reason}")
    if isinstance(exc, json.JSONDecodeError):
        return errors.MalformedResponse(provider, f"a reply was not JSON: {exc.msg}")
    return None


def status_error(
    provider: str,
    status: int | None,
    message: str,
    *,
    retry_after: float | None = None,
    kind: ErrorKind | None = None,
) -> ProviderError:
    """An error reply in our terms: `kind` when the provider named one (an error inside a stream comes
    with HTTP 200), else by its status: 429 rate limited, 401 and 403 a refused key, any other 4xx but
    408 a bad request, the rest (408, 5xx, none) unavailable; rate limits and unavailability are retried."""
    if kind is None:
        client_error = status is not None and 400 <= status < 500 and status != 408
        kind = (
            "rate_limited"
            if status == 429
            else "auth"
            if status in (401, 403)
            else "refused"
            if client_error
            else "unavailable"
        )
    match kind:
        case "rate_limited":
            return errors.RateLimited(provider, message, status=status, retry_after=retry_after)
        case "auth":
            return errors.AuthFailed(provider, message, status=status)
        case "refused":
            return errors.BadRequest(provider, message, status=status)
    return errors.ProviderUnavailable(provider, message, status=status)
