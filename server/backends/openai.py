"""OpenAI Chat Completions, and every server that speaks it (vLLM, Ollama, LM Studio, OpenRouter, llama.cpp).

The `openai` SDK is imported when a backend is built, so `import conclave` works without it. Its own
retries are off (`retry.py` retries); its exceptions are mapped to `conclave.errors` in `_map_error`.
Streamed tool calls arrive as fragments keyed by index and are assembled here; a stream that ends
before a `finish_reason` is a cut stream (the SDK ends such a stream silently).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

from conclave.backends.base import (
    Done,
    Endpoint,
    JsonObject,
    Request,
    StreamEvent,
    TextDelta,
    ToolCall,
    Usage,
    redact,
)
from conclave.backends.mapping import mapped, status_error
from conclave.backends.retry import parse_retry_after
from conclave.backends.tls import client_context
from conclave.errors import (
    ConfigError,
    MalformedResponse,
    ProviderError,
    ProviderUnavailable,
    StreamCut,
)


class OpenAIBackend:
    """Chat Completions through `openai.AsyncOpenAI`; `endpoint.base_url` picks the server."""

    provider: ClassVar[str] = "openai"
    # OpenAI's reasoning models refuse `max_tokens`; a subclass for an older server may say "max_tokens".
    max_tokens_field: ClassVar[str] = "max_completion_tokens"

    def __init__(self, endpoint: Endpoint) -> None:
        try:
            import openai
        except ImportError as exc:
            raise ConfigError(
                f"the {self.provider} provider needs the openai package: pip install openai"
            ) from exc
        self._sdk = openai
        self._endpoint = endpoint
        self._client = openai.AsyncOpenAI(
            api_key=endpoint.api_key or "no-key",  # keyless local servers; the SDK refuses an empty key
            base_url=endpoint.base_url,
            timeout=endpoint.timeout_s,
            max_retries=0,
            http_client=openai.DefaultAsyncHttpxClient(verify=client_context()),  # backends/tls.py
        )
        # the SDK imports this resource's modules when it is first reached (a tenth of a second or more):
        # reached here, they load with the backend, not in a first request (and in a worker before any
        # job: preload in backends/__init__.py)
        _ = self._client.chat.completions

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        """Yield TextDelta and ToolCall events, then one Usage, then Done."""
        params = self._params(request)
        events = self._streamed(params) if self._endpoint.stream else self._whole(params)
        async for event in mapped(events, self._sdk_error, provider=self.provider):
            yield event

    async def _whole(self, params: dict[str, Any]) -> AsyncIterator[StreamEvent]:
        completion = await self._client.chat.completions.create(**params)
        for event in _completion_events(completion, self.provider):
            yield event

    def _sdk_error(self, exc: Exception) -> ProviderError | None:
        """The SDK's own exceptions mapped; anything else is not the SDK's (a bug) and passes."""
        return self._map_error(exc) if isinstance(exc, self._sdk.OpenAIError) else None

    async def aclose(self) -> None:
        await self._client.close()

    def _params(self, request: Request) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": self._endpoint.model,
            "messages": _messages(request),
            self.max_tokens_field: request.max_tokens,
        }
        if request.temperature is not None:
            params["temperature"] = request.temperature
        if request.seed is not None:
            params["seed"] = request.seed
        if request.response_schema is not None:
            # No `strict`: OpenAI's strict mode rejects common schemas (oneOf, optional keys) with a 400;
            # llama.cpp and vLLM turn the schema into a grammar either way.
            schema = {"name": "response", "schema": request.response_schema}
            params["response_format"] = {"type": "json_schema", "json_schema": schema}
        elif request.tools:
            params["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in request.tools
            ]
            params["tool_choice"] = request.tool_choice
        return params

    async def _streamed(self, params: dict[str, Any]) -> AsyncIterator[StreamEvent]:
        chunks = await self._client.chat.completions.create(
            **params, stream=True, stream_options={"include_usage": True}
        )
        calls: dict[int, _PartialCall] = {}
        usage: Usage | None = None
        finish: str | None = None
        async with chunks:
            # mapped here too: the first chunk, not the first event, is where the response began
            async for chunk in mapped(
                _checked(chunks, self.provider), self._sdk_error, provider=self.provider
            ):
                with _parsing(self.provider):
                    if chunk.usage is not None:
                        usage = _usage(chunk.usage)
                    for choice in chunk.choices or ():
                        delta = choice.delta
                        for text in (delta.content, delta.refusal):
                            if text:
                                yield TextDelta(text)
                        for part in delta.tool_calls or ():
                            calls.setdefault(part.index, _PartialCall()).add(part)
                        finish = choice.finish_reason or finish
        if finish is None:
            raise StreamCut(
                self.provider, "the stream was cut after the response began (it ended before a finish_reason)"
            )
        for index in sorted(calls):
            yield calls[index].tool_call()
        yield usage or Usage()
        yield Done(finish)

    def _map_error(self, exc: Exception) -> ProviderError:
        """The one place SDK exceptions become Conclave errors."""
        sdk, name = self._sdk, self.provider
        if isinstance(exc, sdk.APIStatusError):
            message, retry_after = (
                self._scrub(_provider_message(exc)),
                parse_retry_after(exc.response.headers),
            )
            return status_error(name, exc.status_code, message, retry_after=retry_after)
        if isinstance(exc, sdk.APITimeoutError):
            return ProviderUnavailable(name, f"no answer within {self._endpoint.timeout_s:g}s")
        if isinstance(exc, sdk.APIConnectionError):
            cause = f" ({type(exc.__cause__).__name__}: {exc.__cause__})" if exc.__cause__ else ""
            return ProviderUnavailable(name, self._scrub(f"connection failed{cause}"))
        if isinstance(exc, sdk.APIResponseValidationError):
            return MalformedResponse(name, self._scrub(exc.message))
        if isinstance(exc, sdk.APIError):  # an error event inside a stream
            return ProviderUnavailable(name, self._scrub(exc.message))
        return ProviderUnavailable(name, self._scrub(f"{type(exc).__name__}: {exc}"))

    def _scrub(self, text: str) -> str:
        return redact(text, self._endpoint.api_key)


@dataclass
class _PartialCall:
    """One streamed tool call, assembled from its fragments."""

    id: str = ""
    name: str = ""
    arguments: str = ""

    def add(self, part: Any) -> None:
        self.id = self.id or part.id or ""
        if part.function is not None:
            self.name += part.function.name or ""
            self.arguments += part.function.arguments or ""

    def tool_call(self) -> ToolCall:
        return _tool_call(self.id, self.name, self.arguments)


def _messages(request: Request) -> list[JsonObject]:
    out: list[JsonObject] = [{"role": "system", "content": request.system}] if request.system else []
    for message in request.messages:
        if message.role == "tool":
            out.append({"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content})
        elif message.role == "assistant" and message.tool_calls:
            calls = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.name,
                        # a malformed call goes back as the model wrote it, so it can see its mistake
                        "arguments": call.raw_arguments if call.error else json.dumps(call.arguments),
                    },
                }
                for call in message.tool_calls
            ]
            out.append({"role": "assistant", "content": message.content or None, "tool_calls": calls})
        else:
            out.append({"role": message.role, "content": message.content})
    return out


def _completion_events(completion: Any, provider: str) -> list[StreamEvent]:
    with _parsing(provider):
        if isinstance(completion, str) or not completion.choices:
            raise MalformedResponse(provider, "the reply has no choices")
        choice = completion.choices[0]
        message = choice.message
        events: list[StreamEvent] = [TextDelta(text) for text in (message.content, message.refusal) if text]
        events += [
            _tool_call(call.id, call.function.name, call.function.arguments)
            for call in message.tool_calls or ()
            if call.type == "function"
        ]
        usage = _usage(completion.usage) if completion.usage is not None else Usage()
        return [*events, usage, Done(choice.finish_reason or "stop")]


def _usage(usage: Any) -> Usage:
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details is not None else 0
    return Usage(usage.prompt_tokens or 0, usage.completion_tokens or 0, cached)


def _tool_call(call_id: str | None, name: str, raw: str) -> ToolCall:
    call_id = call_id or f"call_{uuid.uuid4().hex[:24]}"  # some local servers send no ids
    try:
        arguments = json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        return ToolCall(
            call_id, name, {}, raw, f"the arguments are not valid JSON ({exc}); send one JSON object"
        )
    if not isinstance(arguments, dict):
        kind = type(arguments).__name__
        return ToolCall(call_id, name, {}, raw, f"the arguments must be a JSON object, not a {kind}")
    return ToolCall(call_id, name, arguments)


def _provider_message(exc: Any) -> str:
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("message"), str) and body["message"]:
        return str(body["message"])
    return str(exc.message)


async def _checked(chunks: Any, provider: str) -> AsyncIterator[Any]:
    """The SDK's chunks; an event that is not JSON becomes MalformedResponse."""
    iterator = chunks.__aiter__()
    while True:
        with _parsing(provider):
            try:
                chunk = await iterator.__anext__()
            except StopAsyncIteration:
                return
        yield chunk


@contextmanager
def _parsing(provider: str) -> Iterator[None]:
    """Reading a reply's shape: the SDK builds models without validation, so a wrong shape shows up here."""
    try:
        yield
    except (ValueError, AttributeError, TypeError, KeyError) as exc:
        raise MalformedResponse(provider, f"unreadable reply ({type(exc).__name__}: {exc})") from exc
