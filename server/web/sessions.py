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
# Both caps are each caller's (each token's): one who mints codes or signs in in a loop ends only their
# own oldest, never another caller's.
MAX_CODES = 1000  # a caller's codes wait at most a minute: more than this at once is minting in a loop
MAX_SESSIONS = 10_000  # past this, a caller's new session ends that caller's oldest


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


class Grants:
    """Codes or sessions: by the SHA-256 of the secret (a lookup is one dict read, whatever their
    number), each caller's also in the order made, so a cap and a revocation touch that caller's alone."""

    def __init__(self, cap: int, ttl_s: float) -> None:
        self.cap, self.ttl_s = cap, ttl_s
        self._by_digest: dict[str, _Grant] = {}
        self._by_caller: dict[Caller, dict[str, None]] = {}  # digests, oldest first (dicts keep order)

    def add(self, caller: Caller) -> str:
        """A new secret for `caller`, after dropping its expired ones and then its oldest over the cap."""
        mine = self._by_caller.setdefault(caller, {})
        now = time.monotonic()
        while mine:  # a caller's grants expire in the order made: the oldest first
            oldest = next(iter(mine))
            grant = self._by_digest.get(oldest)
            if grant is not None and grant.expires > now and len(mine) < self.cap:
                break
            del mine[oldest]
            self._by_digest.pop(oldest, None)
        secret = secrets.token_urlsafe(32)
        key = digest(secret)
        self._by_digest[key] = _Grant(caller, now + self.ttl_s)
        mine[key] = None
        return secret

    def get(self, secret: str) -> Caller | None:
        grant = self._by_digest.get(digest(secret))
        return grant.caller if grant is not None and grant.expires > time.monotonic() else None

    def pop(self, secret: str) -> Caller | None:
        """Use `secret` up: its caller, or None for one unknown or expired."""
        caller = self.get(secret)
        self._drop(digest(secret))
        return caller

    def callers(self) -> set[Caller]:
        return set(self._by_caller)

    def revoke(self, caller: Caller) -> None:
        for key in self._by_caller.pop(caller, {}):
            self._by_digest.pop(key, None)

    def _drop(self, key: str) -> None:
        grant = self._by_digest.pop(key, None)
        mine = self._by_caller.get(grant.caller) if grant is not None else None
        if grant is not None and mine is not None:
            mine.pop(key, None)
            if not mine:
                del self._by_caller[grant.caller]


class Sessions:
    """One server's codes and sessions."""

    def __init__(self) -> None:
        self._codes = Grants(MAX_CODES, CODE_TTL_S)
        self._sessions = Grants(MAX_SESSIONS, SESSION_TTL_S)

    def code_for(self, caller: Caller) -> str:
        """A new one-time sign-in code for `caller`."""
        return self._codes.add(caller)

    def claim(self, code: str) -> tuple[str, Caller] | None:
        """Use a code up for a new one of the same caller, which only the page that claimed it knows: the
        code in a URL (and in a browser's command line) dies as the page loads, while the sign-in waits
        for the user to confirm it. None for an unknown, used or expired code."""
        caller = self._codes.pop(code)
        return (self.code_for(caller), caller) if caller is not None else None

    def redeem(self, code: str) -> tuple[str, Caller] | None:
        """Use a code up: a new session's key and its caller; None for an unknown, used or expired code."""
        caller = self._codes.pop(code)
        return (self.open(caller), caller) if caller is not None else None

    def open(self, caller: Caller) -> str:
        """A new session for `caller`: its key."""
        return self._sessions.add(caller)

    def caller_of(self, key: str) -> Caller | None:
        """The caller of a live session."""
        return self._sessions.get(key)

    def end(self, key: str) -> None:
        self._sessions.pop(key)

    def revoke(self, current: Collection[Caller]) -> None:
        """End every session and code whose caller is not among `current` (the token is no longer the
        server's, or names another caller now): a walk over the callers, not their sessions."""
        for grants in (self._sessions, self._codes):
            for caller in grants.callers() - set(current):
                grants.revoke(caller)
