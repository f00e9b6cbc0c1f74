"""Who may read the web view's data: one check, `WebAuth.check`, for every snapshot, list, event stream,
cancel and sign-out.

A request passes when
- its Host names this server (a loopback name, or the address the server was bound to) and its Origin,
  when the browser sends one, is this same origin: a page on another site, or a name rebound to
  127.0.0.1 (DNS rebinding), gets nothing (the same rule FastMCP applies to /mcp);
- it carries `Authorization: Bearer <token>` (scripts, the CLI) or `X-Conclave-Session: <key>`, a
  session the page's script keeps in sessionStorage (sessions.py). Neither is a cookie: a browser sends
  no header of ours by itself, so no other site and no other port of this host can make it send one
  (no CSRF value is needed), and a cookie read by a server on another port of 127.0.0.1 is worth nothing.

The HTML pages hold no job data (the script fetches it with the header), so they are served to anyone
who names this server in Host. Signing in (`/api/sign-in`) must come from this very origin.

The tokens are read on every request (`Callers`, app/tokens.py `TokenSource` under `serve --http`):
a token taken out of http-tokens.json is refused from then on, and the sessions and codes made from it
end. Under `serve --http` each token names its caller, who sees only its own jobs, as over MCP;
`conclave web` has one random token of its own for the local user, who sees every job
(`Caller.name`, passed to every read of jobs/lookup.py; see docs/web-view.md).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable, Iterable, Mapping
from urllib.parse import urljoin, urlsplit, urlunsplit

from starlette.requests import Request

from conclave.web.sessions import Caller, Sessions, digest

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
SESSION_HEADER = "x-conclave-session"
SIGN_IN_HINT = (
    "sign in: open /login (`conclave web --link` prints a one-time link), or send Authorization: Bearer "
    "<token>"
)

# token -> the caller it names (None: the local user): read again on every request
Callers = Callable[[], Awaitable[Mapping[str, str | None]]]


class Refused(Exception):
    """A request the web view does not serve: its HTTP status and why, in words."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def fixed_callers(token: str) -> Callers:
    """The one token of `conclave web`, naming the local user."""
    if not token:
        raise ValueError("the web view needs a non-empty token")

    async def callers() -> Mapping[str, str | None]:
        return {token: None}

    return callers


class WebAuth:
    """The tokens (each naming a caller), this server's sessions and codes, and the hosts it answers to."""

    def __init__(self, callers: Callers, port: int, hosts: Iterable[str] = ()) -> None:
        self._callers = callers
        self.sessions = Sessions()
        self.port = port
        extra = {host.strip("[]").lower() for host in hosts}
        self._any_host = bool(extra & {"0.0.0.0", "::", ""})  # all interfaces: the token alone guards it
        self._hosts = LOOPBACK_NAMES | extra

    async def current(self) -> dict[str, Caller]:
        """Token -> caller as the server's tokens are now; sessions and codes of any other token end."""
        current = {token: Caller(name, digest(token)) for token, name in (await self._callers()).items()}
        self.sessions.revoke(set(current.values()))
        return current

    async def caller_of_token(self, token: str) -> Caller | None:
        found = None
        for known, caller in (await self.current()).items():  # every one compared, in constant time
            if hmac.compare_digest(token.encode(), known.encode()):
                found = caller
        return found

    def check_origin(self, request: Request, *, required: bool = False) -> None:
        """Host is ours; Origin, if any (always, when `required`), is this very origin."""
        host = request.headers.get("host", "")
        name = _host_name(host)
        if not (self._any_host or name in self._hosts):
            raise Refused(
                421, f"this server does not answer to Host {host!r}; open it as http://127.0.0.1:{self.port}/"
            )
        origin = request.headers.get("origin")
        if origin is None and not required:
            return
        if origin != f"{request.url.scheme}://{host}":
            raise Refused(
                403, f"cross-origin request refused (Origin {origin!r}): sign in from this server's page"
            )

    async def check(self, request: Request) -> Caller:
        """The one check every data request of the web view passes; raises Refused, else the caller."""
        self.check_origin(request)
        bearer = request.headers.get("authorization", "")
        if bearer[:7].lower() == "bearer ":
            caller = await self.caller_of_token(bearer[7:].strip())
        else:
            await self.current()  # ends the sessions of tokens the server no longer has
            key = request.headers.get(SESSION_HEADER)
            caller = self.sessions.caller_of(key) if key else None
        if caller is None:
            raise Refused(401, SIGN_IN_HINT)
        return caller


# What a browser drops from a URL before reading it (the WHATWG URL standard): ASCII tab and newline
# anywhere, C0 controls and spaces at either end. A backslash it reads as a slash (http and https).
_DROPPED = {ord("\t"): None, ord("\n"): None, ord("\r"): None}
_TRIMMED = "".join(chr(code) for code in range(0x21))


def landing(target: str, origin: str) -> str:
    """The page of `origin` (`http://127.0.0.1:8765`) that `target` (a sign-in's `next`) leads to, read as
    a browser reads it; the origin's root when it leads anywhere else."""
    cleaned = target.translate(_DROPPED).strip(_TRIMMED).replace("\\", "/")
    parts = urlsplit(urljoin(origin + "/", cleaned))
    # a browser reads any number of slashes at the start as a host to come (`///evil.example/`)
    if cleaned.startswith("//") or f"{parts.scheme}://{parts.netloc}" != origin or parts.username is not None:
        return origin + "/"
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", parts.query, parts.fragment))


def _host_name(host: str) -> str:
    """The name part of a Host header: 'localhost:8765' -> 'localhost', '[::1]:80' -> '::1'."""
    if host.startswith("["):
        return host[1 : host.find("]")].lower() if "]" in host else host.lower()
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name.lower()
