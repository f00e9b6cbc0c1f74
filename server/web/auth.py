"""Who may open the web view: one check, `WebAuth.check`, for every page, snapshot, event stream and cancel.

A request passes when
- its Host names this server (a loopback name, or the address the server was bound to) and its Origin,
  when the browser sends one, is this same origin: a page on another site, or a name rebound to
  127.0.0.1 (DNS rebinding), gets nothing (the same rule FastMCP applies to /mcp);
- it carries the token: `Authorization: Bearer <token>` (scripts), or the session cookie that /login
  sets (browsers). The cookie is HttpOnly and SameSite=Strict, and holds an HMAC of the token, never
  the token itself, so no script on the page and nothing written into a page can read the token;
- a POST (cancel) also has an Origin equal to this origin and the `X-Conclave-CSRF` header: an HMAC
  of the token that the page's script fetches from /api/session (a cross-site page cannot read that
  answer, and no HTML ever contains it).

Callers: under `serve --http` every token of the server (app/tokens.py) names its caller, who sees only
its own jobs, as over MCP; `conclave web` has one token of its own for the local user, who sees every job
(`Caller.name`, passed to every read of jobs/lookup.py; see docs/web-view.md).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from starlette.requests import Request

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
CSRF_HEADER = "x-conclave-csrf"


class Refused(Exception):
    """A request the web view does not serve: its HTTP status and why, in words."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


@dataclass(frozen=True)
class Caller:
    """Who a request comes from: the caller its token names, who may see, read and cancel its own jobs
    only, as over MCP (None: the local user of `conclave web`, who sees every job, as the CLI does), and
    the token, kept for the values derived from it."""

    name: str | None
    token: bytes = field(repr=False)

    def _derived(self, purpose: bytes) -> str:
        return hmac.new(self.token, purpose, hashlib.sha256).hexdigest()

    @property
    def session(self) -> str:
        return self._derived(b"conclave web session")

    @property
    def csrf(self) -> str:
        return self._derived(b"conclave web csrf")


class WebAuth:
    """The tokens (each naming a caller), the hosts this server answers to, and the cookie and CSRF values
    derived from each token."""

    def __init__(self, tokens: str | Mapping[str, str | None], port: int, hosts: Iterable[str] = ()) -> None:
        named = {tokens: None} if isinstance(tokens, str) else dict(tokens)
        if not named or not all(named):
            raise ValueError("the web view needs a non-empty token")
        self._callers = [Caller(name, token.encode()) for token, name in named.items()]
        self.port = port
        extra = {host.strip("[]").lower() for host in hosts}
        self._any_host = bool(extra & {"0.0.0.0", "::", ""})  # all interfaces: the token alone guards it
        self._hosts = LOOPBACK_NAMES | extra
        self.cookie = (
            f"conclave_web_{port}"  # cookies ignore ports: two servers on one host keep theirs apart
        )

    def caller_of(self, token: str | None, session: str | None) -> Caller | None:
        """The caller a bearer token or a session cookie names; None for neither or a wrong one."""
        for caller in self._callers:
            if token is not None and hmac.compare_digest(token.encode(), caller.token):
                return caller
            if session is not None and hmac.compare_digest(session.encode(), caller.session.encode()):
                return caller
        return None

    def check_origin(self, request: Request, *, write: bool = False) -> None:
        """Host is ours; Origin, if any (always, for a write), is this very origin."""
        host = request.headers.get("host", "")
        name = _host_name(host)
        if not (self._any_host or name in self._hosts):
            raise Refused(
                421, f"this server does not answer to Host {host!r}; open it as http://127.0.0.1:{self.port}/"
            )
        origin = request.headers.get("origin")
        if origin is None and not write:
            return
        if origin != f"{request.url.scheme}://{host}":
            raise Refused(403, f"cross-origin request refused (Origin {origin!r})")

    def check(self, request: Request, *, write: bool = False) -> Caller:
        """The one check every request of the web view passes; raises Refused, else returns the caller."""
        self.check_origin(request, write=write)
        bearer = request.headers.get("authorization", "")
        token = bearer[7:].strip() if bearer[:7].lower() == "bearer " else None
        caller = self.caller_of(token, request.cookies.get(self.cookie))
        if caller is None:
            raise Refused(401, "this page needs the server's token: open /login")
        if write and not hmac.compare_digest(
            request.headers.get(CSRF_HEADER, "").encode(), caller.csrf.encode()
        ):
            raise Refused(403, f"a change needs the {CSRF_HEADER} header from /api/session")
        return caller


def _host_name(host: str) -> str:
    """The name part of a Host header: 'localhost:8765' -> 'localhost', '[::1]:80' -> '::1'."""
    if host.startswith("["):
        return host[1 : host.find("]")].lower() if "]" in host else host.lower()
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name.lower()
