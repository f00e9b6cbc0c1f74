"""Anthropic Messages API backend, with prompt caching on the stable prefix (system and tools).

Wire facts this module relies on (anthropic 2.12):
- the system prompt goes as one text block marked `cache_control: ephemeral`; the last tool is marked
  too, so a job's tools + system prefix is cached across its calls;
- `usage.input_tokens` excludes cache reads and writes: Conclave's input is their sum;
- a stream's `message_start` carries the input usage (and an early output count), `message_delta` the
  cumulative output: each is reported as it arrives (a Usage of what is new), so a stream cut or
  cancelled after its start still counts the input it was billed;
- structured output is `output_config={"format": {"type": "json_schema", "schema": ...}}`;
- streamed replies are raw SSE events (`create(stream=True)`), folded here by `_StreamFold`;
- API version 2026-10-21 (the SDK's default) rejects temperature/top_p/top_k with a 400 and the SDK has
  no such parameters: `Request.temperature` is not sent; `seed` has no Anthropic equivalent either.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from typing import Any, ClassVar

from conclave.backends.base import (
    Done,
    Endpoint,
    JsonObject,
    Message,
    Request,
    StreamEvent,
    TextDelta,
    ToolCall,
    Usage,
    redact,
)
from conclave.backends.mapping import ErrorKind, mapped, status_error, transport_error
from conclave.backends.retry import parse_retry_after
from conclave.backends.tls import client_context
from conclave.errors import (
    MalformedResponse,
    ProviderError,
    ProviderUnavailable,
    StreamCut,
)

PROVIDER = "anthropic"
CACHE_MARK = {"type": "ephemeral"}
ERROR_KINDS: dict[str, ErrorKind] = {
    "rate_limit_error": "rate_limited",
    "authentication_error": "auth",
    "permission_error": "auth",
    "invalid_request_error": "refused",
    "not_found_error": "refused",
    "request_too_large": "refused",
}  # any other (overloaded_error, api_error, unknown): unavailable
COUNTS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


class AnthropicBackend:
    """Claude models through `anthropic.AsyncAnthropic` (SDK retries off: `retry.py` owns retries)."""

    provider: ClassVar[str] = PROVIDER

    def __init__(self, endpoint: Endpoint) -> None:
        import anthropic  # lazily: `import conclave` works without the SDK

        self._endpoint = endpoint
        self._client = anthropic.AsyncAnthropic(
            api_key=endpoint.api_key,
            base_url=endpoint.base_url,
            max_retries=0,
            timeout=endpoint.timeout_s,
            http_client=anthropic.DefaultAsyncHttpxClient(verify=client_context()),  # backends/tls.py
        )

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        params = build_params(self._endpoint.model, request)
        events = self._streamed(params) if self._endpoint.stream else self._whole(params)
        async for event in mapped(
            events, lambda exc: map_error(exc, self._endpoint.api_key), provider=PROVIDER
        ):
            yield event

    async def _whole(self, params: JsonObject) -> AsyncIterator[StreamEvent]:
        for event in read_message(await self._client.messages.create(**params)):
            yield event

    async def _streamed(self, params: JsonObject) -> AsyncIterator[StreamEvent]:
        fold = _StreamFold()
        async with await self._client.messages.create(**params, stream=True) as events:
            async for raw in events:
                try:
                    produced = fold.feed(raw)
                except (AttributeError, TypeError, KeyError) as exc:
                    raise MalformedResponse(PROVIDER, f"unreadable stream event: {exc}") from exc
                for event in produced:
                    yield event
        if not fold.started:
            raise MalformedResponse(PROVIDER, "the stream carried no message_start event")
        if not fold.stopped:
            raise StreamCut(
                PROVIDER, "the stream was cut after the response began (it ended before message_stop)"
            )
        rest = fold.unreported()
        if rest != Usage():
            yield rest
        yield Done(fold.stop_reason)

    async def aclose(self) -> None:
        await self._client.close()


# --- request -------------------------------------------------------------------------------------


def build_params(model: str, request: Request) -> JsonObject:
    """The `messages.create` keyword arguments for one request."""
    params: JsonObject = {
        "model": model,
        "max_tokens": request.max_tokens,  # required by the Messages API
        "messages": to_messages(request.messages),
    }
    if request.system:
        params["system"] = [{"type": "text", "text": request.system, "cache_control": CACHE_MARK}]
    if request.tools:
        tools: list[JsonObject] = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in request.tools
        ]
        tools[-1]["cache_control"] = CACHE_MARK
        params["tools"] = tools
        # In json mode the tools stay declared (a history with tool_use blocks needs them, and the cached
        # prefix stays the same) but the model may not call them.
        choice = "none" if request.response_schema is not None else request.tool_choice
        params["tool_choice"] = {"type": {"auto": "auto", "required": "any", "none": "none"}[choice]}
    if request.response_schema is not None:
        params["output_config"] = {"format": {"type": "json_schema", "schema": request.response_schema}}
    return params


def to_messages(messages: Iterable[Message]) -> list[JsonObject]:
    """Conclave messages as Anthropic turns: tool results are user turns; same-role turns merge."""
    turns: list[JsonObject] = []
    for message in messages:
        role, blocks = _blocks(message)
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return turns


def _blocks(message: Message) -> tuple[str, list[JsonObject]]:
    if message.role == "tool":
        block: JsonObject = {"type": "tool_result", "tool_use_id": message.tool_call_id or ""}
        if message.content:
            block["content"] = message.content
        return "user", [block]
    blocks: list[JsonObject] = [{"type": "text", "text": message.content}] if message.content else []
    for call in message.tool_calls:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments})
    return message.role, blocks


# --- response ------------------------------------------------------------------------------------


def tool_call(call_id: str, name: str, raw: str) -> ToolCall:
    """A ToolCall from raw JSON arguments; bad arguments give `error` instead of raising."""
    if not raw.strip():
        return ToolCall(call_id, name, {}, raw)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        why = f"arguments are not valid JSON: {exc.msg} at character {exc.pos}"
        return ToolCall(call_id, name, {}, raw, why)
    if not isinstance(value, dict):
        why = f"arguments must be a JSON object, not {type(value).__name__}"
        return ToolCall(call_id, name, {}, raw, why)
    return ToolCall(call_id, name, value, raw)


def read_message(message: Any) -> list[StreamEvent]:
    """The events of a non-streamed reply; MalformedResponse when it is not a Message."""
    try:
        if getattr(message, "type", None) != "message":
            raise TypeError(f"expected a message object, got {type(message).__name__}")
        events: list[StreamEvent] = []
        for block in message.content:
            if block.type == "text" and block.text:
                events.append(TextDelta(block.text))
            elif block.type == "tool_use":
                data = block.input
                raw = data if isinstance(data, str) else json.dumps(data)
                events.append(tool_call(block.id, block.name, raw))
        u = message.usage
        events.append(
            _usage(u.input_tokens, u.output_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens)
        )
        events.append(Done(str(message.stop_reason or "end_turn")))
    except (AttributeError, TypeError, KeyError, ValueError) as exc:
        raise MalformedResponse(PROVIDER, f"unreadable reply: {exc}") from exc
    return events


def _usage(raw_input: Any, output: Any, cache_read: Any, cache_write: Any) -> Usage:
    cached = int(cache_read or 0)
    return Usage(int(raw_input or 0) + cached + int(cache_write or 0), int(output or 0), cached)


class _StreamFold:
    """Folds raw stream events into Conclave events; a tool call is emitted when its block stops."""

    def __init__(self) -> None:
        self.started = self.stopped = False
        self.stop_reason = "end_turn"
        self.counts: dict[str, Any] = {}  # message_delta counts are cumulative: later values win
        self.reported = Usage()  # what earlier Usage events of this stream already said
        self.tools: dict[int, tuple[str, str, list[str]]] = {}

    def feed(self, event: Any) -> list[StreamEvent]:
        kind = event.type
        if kind == "message_start":
            self.started = True
            self._count(event.message.usage)
            return [self.unreported()]  # the input side, billed whatever happens to the rest of the stream
        elif kind == "content_block_start":
            block = event.content_block
            if block.type == "tool_use":
                self.tools[event.index] = (block.id, block.name, [])
            elif block.type == "text" and block.text:
                return [TextDelta(block.text)]
        elif kind == "content_block_delta":
            delta = event.delta
            if delta.type == "text_delta" and delta.text:
                return [TextDelta(delta.text)]
            if delta.type == "input_json_delta":
                self.tools[event.index][2].append(delta.partial_json)
        elif kind == "content_block_stop" and event.index in self.tools:
            call_id, name, parts = self.tools.pop(event.index)
            return [tool_call(call_id, name, "".join(parts))]
        elif kind == "message_delta":
            self.stop_reason = str(event.delta.stop_reason or self.stop_reason)
            self._count(event.usage)
        elif kind == "message_stop":
            self.stopped = True
        return []

    def _count(self, usage: Any) -> None:
        for name in COUNTS:
            value = getattr(usage, name, None)
            if value is not None:
                self.counts[name] = value

    def usage(self) -> Usage:
        c = self.counts
        return _usage(
            c.get("input_tokens"),
            c.get("output_tokens"),
            c.get("cache_read_input_tokens"),
            c.get("cache_creation_input_tokens"),
        )

    def unreported(self) -> Usage:
        """The usage counted so far that no Usage event has said yet (and mark it said)."""
        now = self.usage()
        new, self.reported = now - self.reported, now
        return new


# --- errors --------------------------------------------------------------------------------------


def map_error(exc: Exception, api_key: str) -> ProviderError | None:
    """The Conclave error for an SDK or transport exception; None for anything else (a bug)."""
    import anthropic

    if isinstance(exc, anthropic.APIStatusError):
        return _status_error(exc, api_key)
    if isinstance(exc, anthropic.APIResponseValidationError):
        return MalformedResponse(PROVIDER, redact(exc.message, api_key), status=exc.status_code)
    if isinstance(exc, anthropic.APITimeoutError):
        return ProviderUnavailable(PROVIDER, "the request timed out")
    if isinstance(exc, anthropic.APIConnectionError):
        cause = redact(str(exc.__cause__ or exc), api_key)
        return ProviderUnavailable(PROVIDER, f"could not connect: {cause}")
    return transport_error(PROVIDER, exc, api_key)


def _status_error(exc: Any, api_key: str) -> ProviderError:
    status: int = exc.status_code
    message = redact(exc.api_message or exc.message, api_key)
    # error.type of the body decides for an in-stream `error` event, which comes with HTTP 200
    kind = ERROR_KINDS.get(exc.type or "") if status < 400 else None
    retry_after = parse_retry_after(exc.response.headers)
    return status_error(PROVIDER, status, message, retry_after=retry_after, kind=kind)
