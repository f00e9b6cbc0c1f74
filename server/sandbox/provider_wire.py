"""What a key-mode member's egress proxy lets through to its provider, and the usage it reads back.

    wire = "anthropic"                       # the member's API, from its CLI and login (clis/)
    endpoint_refusal(wire, "/gw", "POST", "/gw/v1/messages/batches")  # a reason: not a turn's endpoint
    meter = ResponseMeter(wire)
    usage = meter.feed(chunk)                # each chunk of the provider's response, as it passes

A member's key is its owner's plan: only the calls a CLI makes for a turn may spend it. `ENDPOINTS`
lists them per wire as a method and a path below the member's endpoint (its base URL's path); anything
else (batches, files, fine-tuning, admin APIs: work that outlives the job, uncounted) is refused.

`ResponseMeter` reads what the provider billed from the response as it passes, untouched: the HTTP
framing (Content-Length, chunked, or to the close), then the body as one JSON document or as
server-sent events, each carrying the usage its wire reports. A response's usage is the field-wise
largest of its reports: each wire's reports within one response are running totals (Anthropic's
`message_start` then `message_delta`, Gemini's chunks) or a single one (OpenAI's last chunk,
`response.completed`). Input counts its cached part (`Billed`), as Conclave's usage does.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ENDPOINTS", "AllowedCall", "Billed", "ResponseMeter", "Wire", "endpoint_refusal", "usage_of"]

Wire = Literal["anthropic", "openai", "gemini"]
MAX_JSON = 32 * 1024 * 1024  # a plain JSON response read for its usage; past it only its framing is followed
MAX_EVENT = 8 * 1024 * 1024  # one server-sent event


@dataclass(frozen=True)
class Billed:
    """Tokens a provider's response says it billed: input (its cached part included), output, and the
    cached part of the input. The clis layer turns it into a member's usage (clis/meter.py)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Billed) -> Billed:
        return Billed(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
        )

    def __sub__(self, other: Billed) -> Billed:
        return Billed(
            self.input_tokens - other.input_tokens,
            self.output_tokens - other.output_tokens,
            self.cached_input_tokens - other.cached_input_tokens,
        )

    def most(self, other: Billed) -> Billed:
        """Field by field the larger: two running totals of one response taken together."""
        return Billed(
            max(self.input_tokens, other.input_tokens),
            max(self.output_tokens, other.output_tokens),
            max(self.cached_input_tokens, other.cached_input_tokens),
        )


@dataclass(frozen=True)
class AllowedCall:
    """One call a turn makes: its method and its path below the member's endpoint (a full match)."""

    method: str
    path: re.Pattern[str]


def _endpoints(*pairs: tuple[str, str]) -> tuple[AllowedCall, ...]:
    return tuple(AllowedCall(method, re.compile(path)) for method, path in pairs)


_MODEL = r"[A-Za-z0-9._-]+"
# Paths below the endpoint the CLI is given: Claude Code's and Copilot's Anthropic base URL has no /v1,
# Codex's and Copilot's OpenAI one ends in it, Gemini CLI's is the host with the API's version after it.
ENDPOINTS: dict[Wire, tuple[AllowedCall, ...]] = {
    "anthropic": _endpoints(
        ("POST", r"/v1/messages"),
        ("POST", r"/v1/messages/count_tokens"),
        ("GET", rf"/v1/models(/{_MODEL})?"),
    ),
    "openai": _endpoints(
        ("POST", r"/responses"),
        ("POST", r"/responses/compact"),  # Codex's remote compaction of a long conversation
        ("POST", r"/chat/completions"),
        ("GET", rf"/models(/{_MODEL})?"),
    ),
    "gemini": _endpoints(
        ("POST", rf"/v1(beta|alpha)?/models/{_MODEL}:(generateContent|streamGenerateContent|countTokens)"),
        ("GET", rf"/v1(beta|alpha)?/models(/{_MODEL})?"),
    ),
}


def endpoint_refusal(wire: Wire, prefix: str, method: str, target: str) -> str | None:
    """Why a request to the bridge may not go to the member's provider, or None when it is one of the
    calls a turn makes. `prefix`: the endpoint's own path; `target`: the request's path and query."""
    path = target.partition("?")[0].partition("#")[0]
    prefix = prefix.rstrip("/")
    if path.startswith(prefix + "/"):
        below = path[len(prefix) :]
        for endpoint in ENDPOINTS[wire]:
            if endpoint.method == method and endpoint.path.fullmatch(below):
                return None
    calls = ", ".join(f"{e.method} {prefix}{e.path.pattern}" for e in ENDPOINTS[wire])
    return (
        f"conclave egress: {method} to this path is not a call a CLI turn makes, so the member's key is "
        f"not sent with it (its {wire} endpoint takes only: {calls})"
    )


class ResponseMeter:
    """The usage one provider response reports, read from its bytes as they pass (never altered)."""

    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self.usage = Billed()
        self._head = bytearray()
        self._headed = False
        self._length: int | None = None  # Content-Length; None: chunked or to the close
        self._chunked = False
        self._sse = False
        self._chunk_left = 0  # bytes left in the current chunk (chunked framing)
        self._chunk_line = bytearray()  # a chunk-size line being read
        self._chunk_crlf = 0  # bytes of the CRLF after a chunk still to skip
        self._body = bytearray()  # a JSON body, or what is not yet a whole event
        self._done = False

    def feed(self, data: bytes) -> Billed:
        """Read the next bytes of the response; the usage it has reported so far."""
        if self._done:
            return self.usage
        if not self._headed:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                if len(self._head) > 64 * 1024:
                    self._done = True  # not an HTTP response head: nothing to read
                return self.usage
            head, data = bytes(self._head[:end]), bytes(self._head[end + 4 :])
            self._head.clear()
            if self._start(head):  # an interim 1xx response: the real one follows
                return self.feed(data)
        self._body_bytes(data)
        return self.usage

    def finish(self) -> Billed:
        """The response ended (its connection closed): a body read to the close is whole now."""
        if not self._done and self._headed and not self._sse:
            self._json(bytes(self._body))
        self._done = True
        return self.usage

    def _start(self, head: bytes) -> bool:
        lines = head.split(b"\r\n")
        status = lines[0].split(b" ")
        if len(status) > 1 and status[1].startswith(b"1"):
            return True
        self._headed = True
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"content-length" and value.isdigit():
                self._length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value:
                self._chunked = True
            elif name == b"content-type" and value.startswith(b"text/event-stream"):
                self._sse = True
        if self._chunked:
            self._length = None
        if self._length == 0:
            self.finish()
        return False

    def _body_bytes(self, data: bytes) -> None:
        if not self._chunked:
            if self._length is not None:
                data = data[: self._length]
                self._length -= len(data)
            self._content(data)
            if self._length == 0:
                self.finish()
            return
        while data and not self._done:
            if self._chunk_crlf:
                skip = min(self._chunk_crlf, len(data))
                self._chunk_crlf -= skip
                data = data[skip:]
            elif self._chunk_left:
                piece = data[: self._chunk_left]
                self._chunk_left -= len(piece)
                data = data[len(piece) :]
                self._content(piece)
                if not self._chunk_left:
                    self._chunk_crlf = 2
            else:
                end = data.find(b"\n")
                if end < 0:
                    self._chunk_line += data
                    return
                self._chunk_line += data[: end + 1]
                data = data[end + 1 :]
                size = bytes(self._chunk_line).split(b";")[0].strip()
                self._chunk_line.clear()
                try:
                    self._chunk_left = int(size, 16)
                except ValueError:
                    self._done = True  # not chunked framing after all: stop reading
                    return
                if self._chunk_left == 0:
                    self.finish()

    def _content(self, data: bytes) -> None:
        if len(self._body) + len(data) > (MAX_EVENT if self._sse else MAX_JSON):
            self._body.clear()  # no usage hides in a response this large: keep memory bounded
            return
        self._body += data
        if not self._sse:
            return
        while True:
            match = re.search(rb"\r?\n\r?\n", self._body)
            if match is None:
                return
            event = bytes(self._body[: match.start()])
            del self._body[: match.end()]
            payload = b"\n".join(
                line[5:].lstrip() for line in event.split(b"\n") if line.rstrip(b"\r").startswith(b"data:")
            )
            self._json(payload.rstrip(b"\r"))

    def _json(self, payload: bytes) -> None:
        try:
            value: Any = json.loads(payload)
        except ValueError:
            return
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict) and (found := usage_of(self.wire, item)) is not None:
                self.usage = self.usage.most(found)


def usage_of(wire: Wire, item: dict[str, Any]) -> Billed | None:
    """The usage one JSON object of `wire` reports (a whole response, an event, a chunk), if any."""
    if wire == "gemini":  # generateContent, or Code Assist's wrapper around it
        report = _dict(item.get("usageMetadata")) or _dict(_dict(item.get("response")).get("usageMetadata"))
        if not report:
            return None
        cached = _int(report, "cachedContentTokenCount")
        prompt = _int(report, "promptTokenCount") + _int(report, "toolUsePromptTokenCount")
        output = _int(report, "candidatesTokenCount") + _int(report, "thoughtsTokenCount")
        return Billed(prompt, output, cached)
    report = (
        _dict(item.get("usage"))
        or _dict(_dict(item.get("message")).get("usage"))  # Anthropic's message_start
        or _dict(_dict(item.get("response")).get("usage"))  # the Responses API's response.completed
    )
    if not report:
        return None
    if wire == "anthropic":  # cache reads and writes are beside its input_tokens
        cached = _int(report, "cache_read_input_tokens")
        written = _int(report, "cache_creation_input_tokens")
        return Billed(_int(report, "input_tokens") + cached + written, _int(report, "output_tokens"), cached)
    if "prompt_tokens" in report:  # Chat Completions
        details = _dict(report.get("prompt_tokens_details"))
        return Billed(
            _int(report, "prompt_tokens"), _int(report, "completion_tokens"), _int(details, "cached_tokens")
        )
    details = _dict(report.get("input_tokens_details"))  # Responses: input counts its cached part
    return Billed(_int(report, "input_tokens"), _int(report, "output_tokens"), _int(details, "cached_tokens"))


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(report: dict[str, Any], name: str) -> int:
    value = report.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
