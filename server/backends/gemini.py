"""Gemini through google-genai's async client (`genai.Client(...).aio`), streamed (SSE) or not.

Wire facts this module relies on (google-genai 3.4, Gemini Developer API):
- `HttpOptions.timeout` is in milliseconds; `retry_options=HttpRetryOptions(attempts=1)` turns off
  both tenacity's retries and the implicit aiohttp reconnect (`retry_options=None` would leave the
  latter on); `automatic_continuation=False` keeps the stream to one request.
- The SDK's default API version is `v1`; we pin `v1beta`, where function calling, JSON schemas and
  thought signatures are all served.
- Function calls come whole (no partial arguments on the Gemini API) and usually without an id: we
  name them `call_<n>`. Their `thought_signature` must go back with them in the next turn (Gemini 3
  answers 400 otherwise): we remember it by call id, and send Google's documented
  `skip_thought_signature_validator` for calls we did not see (history from another backend).
- Arguments the model could not write come back as `finish_reason=MALFORMED_FUNCTION_CALL` and no
  parts: we yield one ToolCall with `error` set. The API's `finishMessage` quotes the call, but the
  SDK's Gemini-API converter drops it (only Vertex keeps it), so the name is known only when the
  request offered one tool, and `raw_arguments` stays empty.
- Errors: `errors.APIError` with `.code`; a 429's delay is in the Retry-After header when a proxy
  sets one, else in the body's google.rpc RetryInfo `retryDelay` ("3s"). A bad key is a 400 with
  ErrorInfo reason API_KEY_INVALID, so it maps to AuthFailed, not BadRequest.
- Caching is implicit on Gemini (no marker to set); `prompt_token_count` includes
  `cached_content_token_count`; thinking tokens (`thoughts_token_count`) are billed as output.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from conclave.backends.base import (
    Done,
    Endpoint,
    Message,
    Request,
    StreamEvent,
    TextDelta,
    ToolCall,
    Usage,
    redact,
)
from conclave.backends.mapping import mapped, status_error, transport_error
from conclave.backends.retry import parse_retry_after
from conclave.backends.tls import client_context
from conclave.errors import (
    MalformedResponse,
    ProviderError,
    StreamCut,
)

SKIP_SIGNATURE = b"skip_thought_signature_validator"
_GENERATED_ID = re.compile(r"call_\d+")
_AUTH_REASONS = {"API_KEY_INVALID", "API_KEY_SERVICE_BLOCKED", "API_KEY_HTTP_REFERRER_BLOCKED"}
_STOP_REASONS = {"STOP": "stop", "MAX_TOKENS": "length"}


class GeminiBackend:
    """One Gemini model behind `google.genai.Client(...).aio`."""

    provider: ClassVar[str] = "gemini"

    def __init__(self, endpoint: Endpoint) -> None:
        from google import genai
        from google.genai import types

        self._endpoint, self._types = endpoint, types
        options = types.HttpOptions(
            base_url=endpoint.base_url,
            api_version="v1beta",
            timeout=max(1, round(endpoint.timeout_s * 1000)),  # milliseconds
            retry_options=types.HttpRetryOptions(attempts=1),  # retry.py retries, not the SDK
            # the shared TLS context (backends/tls.py) for its HTTP clients and its websocket one
            client_args={"verify": client_context()},
            async_client_args={"verify": client_context(), "ssl": client_context()},
        )
        self._client = genai.Client(enterprise=False, api_key=endpoint.api_key, http_options=options)
        self._ids = itertools.count(1)
        self._signatures: dict[str, bytes | None] = {}  # call id -> its thought signature

    async def aclose(self) -> None:
        await self._client.aio.aclose()

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        """Yield TextDelta/ToolCall as they arrive, then Done.

        Usage as each chunk reports more (running totals).
        """
        turn = _Turn(self, request)
        async for response in self._responses(request):
            for event in turn.feed(response):
                yield event
        for event in turn.finish(streamed=self._endpoint.stream):
            yield event

    async def _responses(self, request: Request) -> AsyncIterator[Any]:
        """The SDK's GenerateContentResponse objects (one unless streamed), its errors mapped."""
        models = self._client.aio.models
        contents, config = self._contents(request.messages), self._config(request)
        kwargs = {"model": self._endpoint.model, "contents": contents, "config": config}

        async def responses() -> AsyncIterator[Any]:
            if self._endpoint.stream:
                async for chunk in await models.generate_content_stream(**kwargs):
                    yield chunk
            else:
                yield await models.generate_content(**kwargs)

        async for response in mapped(responses(), self._map_error, provider=self.provider):
            yield response

    def _config(self, request: Request) -> Any:
        types = self._types
        config = types.GenerateContentConfig(
            system_instruction=request.system or None,
            temperature=request.temperature,
            max_output_tokens=request.max_tokens,
            seed=request.seed,
            automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
            automatic_continuation=False,
        )
        if request.response_schema is not None:
            config.response_mime_type = "application/json"
            config.response_json_schema = request.response_schema
        elif request.tools:
            declarations = [  # raw JSON schema: `parameters` would want the SDK's OpenAPI Schema
                types.FunctionDeclaration(
                    name=tool.name, description=tool.description, parameters_json_schema=tool.parameters
                )
                for tool in request.tools
            ]
            config.tools = [types.Tool(function_declarations=declarations)]
            mode = "ANY" if request.tool_choice == "required" else "AUTO"
            calling = types.FunctionCallingConfig(mode=types.FunctionCallingConfigMode(mode))
            config.tool_config = types.ToolConfig(function_calling_config=calling)
        return config

    def _contents(self, messages: tuple[Message, ...]) -> list[Any]:
        """Our history as Gemini turns: `model` turns with function_call parts, results as user turns."""
        calls = {c.id: c for m in messages for c in m.tool_calls}
        turns: list[tuple[str, list[Any]]] = []
        for message in messages:
            text = [self._types.Part(text=message.content)] if message.content else []
            if message.role == "assistant":
                role, parts = "model", text + self._call_parts(message.tool_calls)
            elif message.role == "tool":
                role, parts = "user", [self._result_part(message, calls.get(message.tool_call_id or ""))]
            else:
                role, parts = "user", text
            if turns and turns[-1][0] == role:  # parallel results go back in one turn
                turns[-1][1].extend(parts)
            else:
                turns.append((role, parts))
        empty = self._types.Part(text="")
        return [self._types.Content(role=role, parts=parts or [empty]) for role, parts in turns]

    def _call_parts(self, tool_calls: tuple[ToolCall, ...]) -> list[Any]:
        types, parts, first = self._types, [], True
        for call in tool_calls:
            if call.error is not None:  # never a valid call: say what the model wrote
                quoted = call.raw_arguments or "arguments that were not a JSON object"
                parts.append(types.Part(text=f"[malformed call to {call.name or 'a tool'}: {quoted}]"))
                continue
            # Gemini signs the first call of a turn; unknown calls get the documented bypass
            signature = self._signatures.get(call.id, SKIP_SIGNATURE if first else None)
            function_call = types.FunctionCall(id=_own_id(call.id), name=call.name, args=call.arguments)
            parts.append(types.Part(function_call=function_call, thought_signature=signature))
            first = False
        return parts

    def _result_part(self, message: Message, call: ToolCall | None) -> Any:
        name = message.tool_name or (call.name if call else None)
        if not name or (call is not None and call.error is not None):
            return self._types.Part(text=f"[result of {message.tool_call_id}]: {message.content}")
        output = {"output": message.content}  # the key the API documents for a function's result
        result = self._types.FunctionResponse(id=_own_id(message.tool_call_id), name=name, response=output)
        return self._types.Part(function_response=result)

    def _map_error(self, exc: Exception) -> ProviderError | None:
        """The one translation of SDK and transport exceptions into ours; None for bugs."""
        import pydantic
        from google.genai import errors

        name = self.provider
        if isinstance(exc, errors.APIError):
            code = exc.code if isinstance(exc.code, int) else None
            message = self._scrub(exc.message or exc.status or "no message")
            bad_key = code == 400 and bool(_error_reasons(exc) & _AUTH_REASONS)  # a bad key is a 400
            if bad_key or code in (401, 403):
                message += " (check the Gemini API key)"
            retry_after = _retry_after(exc) if code == 429 else None
            return status_error(
                name, code, message, retry_after=retry_after, kind="auth" if bad_key else None
            )
        if isinstance(exc, (errors.UnknownApiResponseError, pydantic.ValidationError)):
            return MalformedResponse(name, f"unreadable response: {self._scrub(str(exc), 200)}")
        return transport_error(name, exc, self._endpoint.api_key, self._endpoint.timeout_s)

    def _scrub(self, text: str, limit: int = 500) -> str:
        """A provider's text fit for our messages: never the key, never a whole HTML page."""
        return redact(text, self._endpoint.api_key, limit)


class _Turn:
    """Folds one call's GenerateContentResponse chunks into events; remembers what Done needs."""

    def __init__(self, backend: GeminiBackend, request: Request) -> None:
        self._backend = backend
        self._only_tool = request.tools[0].name if len(request.tools) == 1 else ""
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.reported = Usage()  # what this call's earlier Usage events said (a stream sends running totals)
        self.blocked: str | None = None
        self.calls = 0

    def feed(self, response: Any) -> list[StreamEvent]:
        events = self._feed(response)
        if response.usage_metadata is not None:
            self.usage = response.usage_metadata  # running totals: each chunk's news is reported at once
            new = self._usage() - self.reported
            if new != Usage():
                events.append(new)
                self.reported += new
        return events

    def _feed(self, response: Any) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        feedback = response.prompt_feedback
        if feedback is not None and feedback.block_reason is not None:
            self.blocked = str(getattr(feedback.block_reason, "value", feedback.block_reason))
        if not response.candidates:
            return events
        candidate = response.candidates[0]
        for part in (candidate.content.parts or []) if candidate.content else []:
            if part.function_call is not None:
                events.append(self._call(part))
            elif part.text and not part.thought:
                events.append(TextDelta(part.text))
        if candidate.finish_reason is not None:
            self.finish_reason = str(getattr(candidate.finish_reason, "value", candidate.finish_reason))
            if self.finish_reason == "MALFORMED_FUNCTION_CALL":
                events.append(self._malformed())
        return events

    def _usage(self) -> Usage:
        def count(field: str) -> int:
            return getattr(self.usage, field, None) or 0

        output = count("candidates_token_count") + count("thoughts_token_count")
        return Usage(count("prompt_token_count"), output, count("cached_content_token_count"))

    def finish(self, *, streamed: bool) -> list[StreamEvent]:
        """What usage is left to report, then Done; raises when the response never said it was complete."""
        if self.finish_reason is None and self.blocked is None:
            if streamed:
                raise StreamCut(
                    "gemini", "the stream was cut after the response began (it ended before a finish_reason)"
                )
            if self.usage is None:
                raise MalformedResponse("gemini", "the response has neither candidates nor prompt feedback")

        rest = self._usage() - self.reported
        events: list[StreamEvent] = [rest] if rest != Usage() or self.reported == Usage() else []
        if self.blocked is not None:
            stop = "blocked"
        elif self.calls and self.finish_reason == "STOP":
            stop = "tool_calls"
        else:
            reason = self.finish_reason or "STOP"
            stop = _STOP_REASONS.get(reason, reason.lower())
        events.append(Done(stop))
        return events

    def _call(self, part: Any) -> ToolCall:
        call = part.function_call
        self.calls += 1
        call_id = call.id or f"call_{next(self._backend._ids)}"
        self._backend._signatures[call_id] = part.thought_signature
        arguments = dict(call.args or {})
        raw = json.dumps(arguments)
        return ToolCall(id=call_id, name=call.name or "", arguments=arguments, raw_arguments=raw)

    def _malformed(self) -> ToolCall:
        self.calls += 1
        return ToolCall(
            id=f"call_{next(self._backend._ids)}",
            name=self._only_tool,
            error="Gemini could not parse the function call it wrote (MALFORMED_FUNCTION_CALL); "
            "write the arguments as one JSON object matching the tool's schema",
        )


def _own_id(call_id: str | None) -> str | None:
    """The id to send back: Gemini's own, never one we generated (the API did not issue it)."""
    return None if call_id is None or _GENERATED_ID.fullmatch(call_id) else call_id


def _error_reasons(exc: Any) -> set[str]:
    return {d.get("reason", "") for d in _error_details(exc)}


def _error_details(exc: Any) -> list[dict[str, Any]]:
    details = exc.details.get("error", exc.details) if isinstance(exc.details, dict) else {}
    items = details.get("details") if isinstance(details, dict) else None
    return [d for d in items if isinstance(d, dict)] if isinstance(items, list) else []


def _retry_after(exc: Any) -> float | None:
    """Seconds to wait: a Retry-After header (a proxy's), else the body's RetryInfo `retryDelay`."""
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    seconds = parse_retry_after({k.lower(): v for k, v in headers.items()})
    if seconds is not None:
        return seconds
    for detail in _error_details(exc):
        delay = detail.get("retryDelay")  # a google.protobuf.Duration: "3s", "0.5s"
        if detail.get("@type", "").endswith("google.rpc.RetryInfo") and isinstance(delay, str):
            try:
                return max(0.0, float(delay.removesuffix("s")))
            except ValueError:
                return None
    return None
