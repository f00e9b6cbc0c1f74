"""A key-mode member's provider, served by its egress proxy in reverse: the key stays on the host.

A container that holds a secret can be made to write it into its workspace (a prompt-injected member
runs `env`, or reads its CLI's /proc/<pid>/environ), and from there it reaches the caller's diff, the
peers and their providers. So a CLI member that logs in with a key gets, inside its container, a fixed
placeholder as its key and the bridge (http://127.0.0.1:3128 plus its endpoint's path, sandbox/member.py)
as its base URL. Its requests then reach the proxy as plain HTTP to the bridge itself: in origin form
(`POST /v1/messages HTTP/1.1`) or in absolute form naming the bridge (`POST http://127.0.0.1:3128/v1/...`,
from a client that sends everything through HTTP_PROXY). The proxy (sandbox/egress.py) forwards those to
the member's real endpoint, over TLS from the host when it is https, with every credential the request
carries (`x-api-key`, `authorization`, `x-goog-api-key`, `api-key` headers, a `key=` query parameter)
replaced by the real key. Bodies and streamed responses pass through as they come; `Connection: close`.
A response that echoes the key (a gateway reflecting its request, an error quoting it) has it masked on the
way back (`KeyScrubber`, same length, so the response's framing holds), and the request asks for an
uncompressed response so that an echo cannot hide in a compressed body.

Plan logins (login files, OAuth tokens, GitHub tokens) are not served here: their CLIs talk to their
providers' hosts through CONNECT, as docs/subscriptions.md says.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from functools import cached_property
from urllib.parse import quote, urlsplit

from conclave.config.hosts import normal_host
from conclave.errors import ConfigError
from conclave.sandbox.provider_wire import Wire

__all__ = [
    "BRIDGE_HOSTS",
    "BRIDGE_PORT",
    "CREDENTIAL_HEADERS",
    "HOP_HEADERS",
    "KeyScrubber",
    "ProviderKey",
    "is_bridge",
    "provider_head",
    "tls_context",
]

BRIDGE_PORT = 3128  # where the member's container reaches its proxy (its relay: sandbox/egress_channel.py)
BRIDGE_HOSTS = ("127.0.0.1", "localhost")  # the names a client inside gives the bridge
# Where a provider SDK or CLI puts its key: Anthropic's x-api-key, a bearer token (OpenAI, Anthropic's
# auth token, OpenAI-compatible gateways), Gemini's x-goog-api-key, Azure's api-key.
CREDENTIAL_HEADERS = (b"x-api-key", b"authorization", b"x-goog-api-key", b"api-key")
# Hop-by-hop headers a proxy consumes (RFC 9110 7.6.1) and the proxy's own; never forwarded.
HOP_HEADERS = {
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"proxy-authorization",
    b"te",
    b"trailer",
    b"upgrade",
}


@dataclass(frozen=True)
class ProviderKey:
    """A key-mode member's endpoint (`url`: its scheme, host, port, and the path the bridge serves it
    under), the key its requests carry there, and the API it speaks there (`wire`: which calls pass and
    how its responses say their usage, sandbox/provider_wire.py). Never printed: `repr` leaves the key
    out."""

    url: str
    key: str = field(repr=False)
    wire: Wire

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"base_url {self.url!r}: an http(s) URL with a host, e.g. https://llm.internal/v1"
            )
        try:
            parts.port  # noqa: B018 - a port outside 1-65535 raises here, where the endpoint is named
        except ValueError as exc:
            raise ConfigError(f"base_url {self.url!r}: its port is outside 1-65535") from exc

    @cached_property
    def host(self) -> str:
        return normal_host(urlsplit(self.url).hostname or "")

    @cached_property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or (443 if parts.scheme == "https" else 80)

    @cached_property
    def prefix(self) -> str:
        """The endpoint's own path: every call the bridge forwards lies below it."""
        return str(urlsplit(self.url).path).rstrip("/")

    @property
    def tls(self) -> bool:
        return urlsplit(self.url).scheme == "https"

    @property
    def authority(self) -> str:
        """The Host header the provider expects (its port only when not the scheme's default)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.tls else 80
        return host if self.port == default else f"{host}:{self.port}"

    def bridge_url(self) -> str:
        """The base URL the CLI is given inside its container: the bridge, with the endpoint's path (the
        proxy forwards paths as they come, so the provider sees the path it would have seen)."""
        return f"http://{BRIDGE_HOSTS[0]}:{BRIDGE_PORT}{urlsplit(self.url).path.rstrip('/')}"


def is_bridge(host: str, port: int) -> bool:
    """Whether a request (absolute form, or CONNECT) names the bridge itself: the member's own provider."""
    return port == BRIDGE_PORT and normal_host(host) in BRIDGE_HOSTS


def provider_head(method: str, path: str, headers: list[bytes], provider: ProviderKey) -> bytes:
    """The head to send the provider for a request to the bridge: `path` kept (its `key=` parameter, if
    any, holding the real key), the credential headers holding the real key, the provider's Host, hop
    headers dropped, `Connection: close` (one client connection never carries a second request)."""
    forwarded = [
        f"{method} {_with_key(path, provider.key)} HTTP/1.1".encode(),
        b"Host: " + provider.authority.encode(),
    ]
    for line in headers:
        name, sep, value = line.partition(b":")
        lowered = name.strip().lower()
        # the provider's Host is set above; no Accept-Encoding: an uncompressed response, for `KeyScrubber`
        if not sep or lowered in HOP_HEADERS or lowered in (b"host", b"accept-encoding"):
            continue
        if lowered in CREDENTIAL_HEADERS:
            line = name.strip() + b": " + _credential(lowered, value.strip(), provider.key)
        forwarded.append(line)
    return b"\r\n".join([*forwarded, b"Connection: close", b"", b""])


class KeyScrubber:
    """Masks every occurrence of a key in a response stream fed chunk by chunk by as many `*`: the
    stream's length (and so its framing) is unchanged. An occurrence counts in what the member's HTTP
    client reads: split across the stream's chunks, and across the chunks of a chunked body (its size
    lines and their line ends are framing, which the client drops: a key cut by one is still a key).
    It holds back only a tail that could begin the key (with the framing after it), so a stream of
    events still passes as it comes. The responses on one connection are read one after another (their
    heads, by Content-Length or chunked framing); anything it cannot frame is scanned as it is."""

    MAX_HEAD = 64 * 1024  # past this, a response head is not parsed: the rest is scanned as it is

    def __init__(self, key: str) -> None:
        self.key = key.encode()
        self._raw = bytearray()  # received, not yet passed on
        self._spans: list[tuple[int, int]] = []  # [start, end) of `_raw` the client reads (not framing)
        self._state = "head"  # head, size, data, crlf, trailer, body (by Content-Length), rest
        self._line = bytearray()  # the head, a size line or a trailer line read so far
        self._left = 0  # bytes left in this data, crlf or body

    def feed(self, chunk: bytes) -> bytes:
        start = len(self._raw)
        self._raw += chunk
        for begin, end in self._read(chunk):
            self._content(start + begin, start + end)
        return self._release()

    def flush(self) -> bytes:
        """What was held back, at the end of the stream (it never completed the key)."""
        held = bytes(self._raw)
        self._raw, self._spans = bytearray(), []
        return held

    def _content(self, begin: int, end: int) -> None:
        if begin >= end:
            return
        if self._spans and self._spans[-1][1] == begin:
            self._spans[-1] = (self._spans[-1][0], end)
        else:
            self._spans.append((begin, end))

    def _release(self) -> bytes:
        """Mask each key the content holds; pass on everything before a tail that could begin one."""
        content = b"".join(self._raw[begin:end] for begin, end in self._spans)
        found = content.find(self.key)
        while found >= 0:
            for offset in range(found, found + len(self.key)):
                self._raw[self._at(offset)] = ord("*")
            found = content.find(self.key, found + len(self.key))
        keep = next(
            (n for n in range(min(len(self.key) - 1, len(content)), 0, -1) if content.endswith(self.key[:n])),
            0,
        )
        cut = self._at(len(content) - keep) if keep else len(self._raw)
        out = bytes(self._raw[:cut])
        del self._raw[:cut]
        self._spans = [(max(begin, cut) - cut, end - cut) for begin, end in self._spans if end > cut]
        return out

    def _at(self, offset: int) -> int:
        """The position in `_raw` of the content's `offset`-th byte."""
        for begin, end in self._spans:
            if offset < end - begin:
                return begin + offset
            offset -= end - begin
        raise IndexError(offset)

    def _read(self, chunk: bytes) -> list[tuple[int, int]]:
        """The parts of `chunk` that are content, [start, end) by offset, as the framing goes."""
        spans: list[tuple[int, int]] = []
        at = 0
        while at < len(chunk):
            state = self._state
            if state in ("rest", "head", "trailer"):  # the client reads these (a key in a head counts)
                if state == "rest":
                    spans.append((at, len(chunk)))
                    return spans
                end = self._line_end(chunk, at, b"\r\n\r\n" if state == "head" else b"\r\n")
                spans.append((at, end))
                at = end
            elif state == "size":
                at = self._line_end(chunk, at, b"\r\n")
            else:  # data, body (content) or crlf (framing): a known count of bytes
                end = min(len(chunk), at + self._left)
                if state != "crlf":
                    spans.append((at, end))
                self._left -= end - at
                at = end
                if not self._left:
                    self._state = {"data": "crlf", "crlf": "size", "body": "head"}[state]
                    self._left = 2 if state == "data" else 0  # the line end after a chunk's data
        return spans

    def _line_end(self, chunk: bytes, at: int, ending: bytes) -> int:
        """Read a head (to its blank line) or a line from `at`; where this read of it stops in `chunk`.
        A complete one moves the state on."""
        seen = len(self._line)
        self._line += chunk[at:]
        found = self._line.find(ending, max(0, seen - len(ending) + 1))
        if found < 0:
            if len(self._line) > self.MAX_HEAD:
                self._state = "rest"
            return len(chunk)
        line = bytes(self._line[: found + len(ending)])
        self._line = bytearray()
        self._next(line)
        return at + len(line) - seen

    def _next(self, line: bytes) -> None:
        """The state after a complete head, size line or trailer line."""
        if self._state == "trailer":
            self._state = "head" if line == b"\r\n" else "trailer"
            return
        if self._state == "size":
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                self._state = "rest"
                return
            self._state, self._left = ("data", size) if size else ("trailer", 0)
            return
        headers = line.lower().split(b"\r\n")
        status = headers[0].split(b" ")[1:2]
        fields = dict(field.split(b":", 1) for field in headers[1:] if b":" in field)
        length = fields.get(b"content-length", b"").strip()
        if status and status[0].startswith(b"1"):
            self._state = "head"  # 100 Continue: the response comes next
        elif b"chunked" in fields.get(b"transfer-encoding", b""):
            self._state = "size"
        elif length.isdigit():
            self._state, self._left = ("body", int(length)) if int(length) else ("head", 0)
        else:
            self._state = "rest"


def _credential(name: bytes, value: bytes, key: str) -> bytes:
    """The header's value with the real key: an Authorization header keeps its scheme (`Bearer`)."""
    if name == b"authorization":
        scheme = value.split(b" ", 1)[0] if b" " in value else b"Bearer"
        return scheme + b" " + key.encode()
    return key.encode()


def _with_key(path: str, key: str) -> str:
    """`path` with its `key=` query parameters (Gemini's REST form) holding the real key; the rest of the
    query byte for byte."""
    base, sep, query = path.partition("?")
    if not sep:
        return path
    items = [
        f"key={quote(key, safe='')}" if item.split("=", 1)[0] == "key" else item for item in query.split("&")
    ]
    return f"{base}?{'&'.join(items)}"


def tls_context(extra_ca: str | None = None) -> ssl.SSLContext:
    """The host's TLS client context for a provider: the system's roots (and `extra_ca`'s, when given:
    the egress route's, sandbox/route.py). Blocking (it reads the roots): build it in a worker."""
    context = ssl.create_default_context()
    if extra_ca is not None:
        context.load_verify_locations(extra_ca)
    return context
