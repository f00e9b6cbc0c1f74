"""The web view's sign-in codes and sessions, kept in the memory of the server that made them.

- A **code** signs one browser in: made for a caller who proved a token (`conclave web --link`, `conclave
  ask --web`), used once, dead after CODE_TTL_S. It is what goes into a URL and a browser's command
  line, never the token; the sign-in page swaps it at once for a code of its own (`claim`) and uses
  that one when the user confirms.
- A **session** is a random key the page keeps in sessionStorage and sends in the X-Conclave-Session
  header (auth.py). It ends after SESSION_TTL_S, at sign-out, and when the token it was made from is no
  longer one of the server's (auth.py checks that on every request). No cookie holds it: every server
  on 127.0.0.1 receives every cookie of 127.0.0.1, whatever its port, while sessionStorage and the
  headers a page's script sends stay with the page's own origin (scheme, host and port).

Both are stored under the SHA-256 of the secret, so a lookup's timing says nothing about the secret.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Collection
from dataclasses import dataclass

CODE_TTL_S = 60.0
SESSION_TTL_S = 8 * 3600.0
MAX_CODES = 1000  # codes wait at most a minute: more than this at once is someone minting in a loop
MAX_SESSIONS = 10_000  # past this, a new session ends the oldest (a token holder signing in in a loop)


@dataclass(frozen=True)
class Caller:
    """Who a request comes from: the caller its token names (None: the local user of `conclave web`, who
    sees every job, as the CLI does; a name: that caller's own jobs only, as over MCP), and the SHA-256
    of that token, by which a session made from it is revoked with it."""

    name: str | None
    token_digest: str

    @property
    def shown(self) -> str:
        return self.name or "local"


@dataclass(frozen=True)
class _Grant:
    caller: Caller
    expires: float  # time.monotonic()


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class Sessions:
    """One server's codes and sessions."""

    def __init__(self) -> None:
        self._codes: dict[str, _Grant] = {}
        self._sessions: dict[str, _Grant] = {}

    def code_for(self, caller: Caller) -> str:
        """A new one-time sign-in code for `caller`."""
        self._prune(self._codes, MAX_CODES)
        code = secrets.token_urlsafe(24)
        self._codes[digest(code)] = _Grant(caller, time.monotonic() + CODE_TTL_S)
        return code

    def claim(self, code: str) -> tuple[str, Caller] | None:
        """Use a code up for a new one of the same caller, which only the page that claimed it knows: the
        code in a URL (and in a browser's command line) dies as the page loads, while the sign-in waits
        for the user to confirm it. None for an unknown, used or expired code."""
        grant = self._codes.pop(digest(code), None)
        if grant is None or grant.expires <= time.monotonic():
            return None
        return self.code_for(grant.caller), grant.caller

    def redeem(self, code: str) -> tuple[str, Caller] | None:
        """Use a code up: a new session's key and its caller; None for an unknown, used or expired code."""
        grant = self._codes.pop(digest(code), None)
        if grant is None or grant.expires <= time.monotonic():
            return None
        return self.open(grant.caller), grant.caller

    def open(self, caller: Caller) -> str:
        """A new session for `caller`: its key."""
        self._prune(self._sessions, MAX_SESSIONS)
        key = secrets.token_urlsafe(32)
        self._sessions[digest(key)] = _Grant(caller, time.monotonic() + SESSION_TTL_S)
        return key

    def caller_of(self, key: str) -> Caller | None:
        """The caller of a live session."""
        grant = self._sessions.get(digest(key))
        if grant is None or grant.expires <= time.monotonic():
            return None
        return grant.caller

    def end(self, key: str) -> None:
        self._sessions.pop(digest(key), None)

    def revoke(self, current: Collection[Caller]) -> None:
        """End every session and code whose caller is not among `current` (the token is no longer the
        server's, or names another caller now)."""
        for grants in (self._sessions, self._codes):
            for key in [key for key, grant in grants.items() if grant.caller not in current]:
                del grants[key]

    @staticmethod
    def _prune(grants: dict[str, _Grant], room_for: int) -> None:
        """Drop the expired grants, then the oldest (dicts keep their order) until one more fits."""
        now = time.monotonic()
        for key in [key for key, grant in grants.items() if grant.expires <= now]:
            del grants[key]
        while len(grants) >= room_for:
            del grants[next(iter(grants))]
