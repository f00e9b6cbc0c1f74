"""The error mapping every backend shares (backends/mapping.py): a stream cut after it began is a cut
stream, whatever shape the SDK gives the exception, and anything else keeps its own mapping."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx2
import pytest

from conclave.backends.mapping import mapped
from conclave.errors import ProviderError, ProviderUnavailable, StreamCut


class FutureSDKError(Exception):
    """An exception class no SDK has today: a later release may wrap a cut this way."""


def _wrapped(cause: BaseException, *, as_cause: bool) -> Exception:
    try:
        try:
            raise cause
        except BaseException as inner:
            if as_cause:
                raise FutureSDKError("stream failed") from inner
            raise FutureSDKError("stream failed")  # noqa: B904  (implicit __context__, as some SDKs do)
    except FutureSDKError as outer:
        return outer


SHAPES = {
    "httpx2 RemoteProtocolError": httpx2.RemoteProtocolError("peer closed connection"),
    "httpx2 ReadError": httpx2.ReadError("connection reset"),
    "a bare ConnectionResetError": ConnectionResetError(104, "Connection reset by peer"),
    "anyio EndOfStream": anyio.EndOfStream(),
    "a new SDK class, cause set": _wrapped(
        httpx2.RemoteProtocolError("incomplete chunked read"), as_cause=True
    ),
    "a new SDK class, context only": _wrapped(ConnectionResetError(104, "reset"), as_cause=False),
}


async def _events(after: int, error: BaseException) -> AsyncIterator[str]:
    for index in range(after):
        yield f"event {index}"
    raise error


def _unknown(exc: Exception) -> ProviderError | None:
    return None  # the backend knows none of these: only the shared rule can classify them


def _as_connect(exc: Exception) -> ProviderError | None:
    return ProviderUnavailable("acme", f"could not connect: {exc}")


@pytest.mark.anyio
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("map_error", [_unknown, _as_connect])
async def test_a_cut_after_the_first_event_is_a_cut_stream(shape: str, map_error: object) -> None:
    seen: list[str] = []
    with pytest.raises(StreamCut) as caught:
        async for event in mapped(_events(2, SHAPES[shape]), map_error, provider="acme"):  # type: ignore[arg-type]
            seen.append(event)
    assert seen == ["event 0", "event 1"]
    assert str(caught.value).startswith("acme: the stream was cut after the response began")
    assert caught.value.retryable and "connect" not in str(caught.value)


@pytest.mark.anyio
async def test_a_failure_before_the_first_event_keeps_its_own_mapping() -> None:
    with pytest.raises(ProviderUnavailable) as caught:
        async for _ in mapped(_events(0, httpx2.ConnectError("refused")), _as_connect, provider="acme"):
            pass
    assert type(caught.value) is ProviderUnavailable and "could not connect" in str(caught.value)


@pytest.mark.anyio
async def test_a_timeout_or_a_bug_mid_stream_is_not_a_cut() -> None:
    with pytest.raises(ProviderUnavailable) as timed_out:
        async for _ in mapped(_events(1, httpx2.ReadTimeout("slow")), _as_connect, provider="acme"):
            pass
    assert type(timed_out.value) is ProviderUnavailable
    with pytest.raises(KeyError):  # a bug in our own code passes unchanged
        async for _ in mapped(_events(1, KeyError("choices")), _unknown, provider="acme"):
            pass
