"""The HTTP transport's callers: bearer tokens, each naming a caller, and the check FastMCP runs on them.

HTTP always needs a token, on loopback too: other users and processes of the machine are not the user.
Where the tokens come from, all of them accepted at once:

    CONCLAVE_HTTP_TOKEN                     one token; its caller is `http`
    $CONCLAVE_HOME/http-tokens.json         {"caller name": "token", ...}: one token per caller (0600); an
                                            entry {"token": "...", "roots": ["/abs/folder", ...]} also
                                            narrows the folders that caller may name
                                            (jobs/admission/access.py)
    $CONCLAVE_HOME/http-token               made (0600) when neither of the above gives a token; caller `http`

A job belongs to the caller that started it (jobs/service.py); `local` (the CLI and stdio) is not a name a
token may take.

A running server rereads them when http-tokens.json changes (`TokenSource`): a new token works and a
removed one is refused from the next request on, on /mcp and the web view alike, without a restart.
"""

from __future__ import annotations

import errno
import hmac
import json
import os
import re
import secrets
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fastmcp.server.auth import AccessToken, TokenVerifier

from conclave.errors import ConfigError
from conclave.jobs.service import LOCAL
from conclave.jobs.store.connections import private_dir
from conclave.jobs.store.lanes import Lane
from conclave.settings import Settings

TOKEN_FILE = "http-token"
TOKENS_FILE = "http-tokens.json"
DEFAULT_CALLER = "http"
CALLER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
MIN_TOKEN = 16
RACY_NS = 1_000_000_000  # a file changed this recently may change again within one timestamp: reread it


@dataclass(frozen=True)
class HttpTokens:
    """Token -> caller name, and what to tell the user about where the tokens came from."""

    callers: dict[str, str]
    notice: str = ""
    # caller name -> the folders its entry's "roots" lists (it may name folders only under them, besides
    # the server's roots); a caller not here has the server's roots alone
    roots: dict[str, tuple[Path, ...]] = field(default_factory=dict)


def load_tokens(settings: Settings) -> HttpTokens:
    """Every token this server accepts.

    With none configured, the one stored under CONCLAVE_HOME (made once).
    """
    callers: dict[str, str] = {}
    roots: dict[str, tuple[Path, ...]] = {}
    if settings.http_token is not None:
        callers[_checked_token(settings.http_token.get_secret_value(), "CONCLAVE_HTTP_TOKEN")] = (
            DEFAULT_CALLER
        )
    named = settings.home / TOKENS_FILE
    if named.exists():
        for caller, (token, own) in _read_named(named).items():
            callers[token] = caller
            if own is not None:
                roots[caller] = own
    if callers:
        return HttpTokens(callers, roots=roots)
    path, made = stored_token(settings.home)
    token = _read_private(path).strip()
    said = "made a bearer token" if made else "using the bearer token"
    notice = (
        f"conclave: HTTP needs a bearer token; {said} in {path} (mode 0600). Give clients the header "
        f"`Authorization: Bearer <that token>`, e.g. export CONCLAVE_HTTP_TOKEN=$(cat {path}) where the "
        "client runs and register with `conclave install TARGET --http URL`; for one token per caller, "
        f'write {named} as {{"caller name": "token"}}'
    )
    return HttpTokens({_checked_token(token, str(path)): DEFAULT_CALLER}, notice)


def stored_token(home: Path) -> tuple[Path, bool]:
    """`home/http-token`, made with a new random token when missing (O_EXCL, no link followed, 0600)."""
    private_dir(home)
    path = home / TOKEN_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return path, False
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_urlsafe(32) + "\n")
    return path, True


def _read_private(path: Path) -> str:
    """A token file's text: a regular file of ours that no one else may read, never reached through a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(
                f"{path} is a symlink; a token file must be a regular file: replace it"
            ) from exc
        raise ConfigError(f"{path}: cannot read the token file ({exc.strerror})") from exc
    with os.fdopen(fd) as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise ConfigError(
                f"{path} must be a regular file of yours that only you can read: run chmod 600 {path}"
            )
        return handle.read()


TokenEntry = tuple[str, tuple[Path, ...] | None]  # a caller's token, and its own roots (None: the server's)


def _read_named(path: Path) -> dict[str, TokenEntry]:
    try:
        data = json.loads(_read_private(path))
    except json.JSONDecodeError as exc:
        raise ConfigError(f'{path} is not JSON ({exc}); write it as {{"caller name": "token", ...}}') from exc
    if not isinstance(data, dict):
        raise ConfigError(f'{path}: write it as {{"caller name": "token", ...}}')
    entries: dict[str, TokenEntry] = {}
    for caller, value in data.items():
        if not CALLER_NAME.fullmatch(caller) or caller == LOCAL:
            raise ConfigError(
                f"{path}: caller name {caller!r} is not valid: use letters, digits, '_.@-' (not "
                f"{LOCAL!r}, the local user's name)"
            )
        token, roots = _entry(path, caller, value)
        entries[caller] = (_checked_token(token, f"{path} ({caller})"), roots)
    if len({token for token, _ in entries.values()}) != len(entries):
        raise ConfigError(f"{path}: two callers share a token; give each caller a token of its own")
    return entries


def _entry(path: Path, caller: str, value: object) -> TokenEntry:
    """One caller's entry: "token", or {"token": "...", "roots": ["/abs/folder", ...]}."""
    if isinstance(value, str):
        return value, None
    shape = f'{{"token": "...", "roots": ["/srv/projects/{caller}"]}}'
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("token"), str)
        or set(value) - {"token", "roots"}
    ):
        raise ConfigError(f'{path} ({caller}): write the entry as "token" or as {shape}')
    roots = value.get("roots")
    if roots is None:
        return value["token"], None
    if not isinstance(roots, list) or not all(isinstance(r, str) and os.path.isabs(r) for r in roots):
        raise ConfigError(
            f'{path} ({caller}): "roots" is a list of absolute folders that caller may name, as in {shape} '
            "([] for none)"
        )
    return value["token"], tuple(Path(root) for root in roots)


def _checked_token(token: str, where: str) -> str:
    if len(token) < MIN_TOKEN:
        raise ConfigError(
            f"{where}: a token needs at least {MIN_TOKEN} characters; make one with "
            "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return token


Stamp = tuple[int, int, int, int] | None


def _stamp(path: Path) -> Stamp:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


class TokenSource:
    """The tokens a running server accepts now: `load_tokens` again whenever http-tokens.json changed
    (another inode, size or time stamp; a file written within the last second is reread every time).

    A tokens file that has become unreadable or invalid is not guessed at: every token is refused until it
    is fixed (the error goes to stderr once per change), since the file may be halfway through removing
    one. The stat and the read run in a thread of the source's own.
    """

    def __init__(self, settings: Settings, first: HttpTokens) -> None:
        self._settings = settings
        self._path = settings.home / TOKENS_FILE
        self._stamp = _stamp(self._path)
        self._callers: dict[str, str] = dict(first.callers)
        self._roots: dict[str, tuple[Path, ...]] = dict(first.roots)
        # one thread: one reread at a time, the others queued behind it use its answer. Every request
        # looks, and a lane's call is two turns of the event loop where anyio's to_thread is four
        # (jobs/store/lanes.py): on a busy front, those turns are what a request waits for
        self._lane = Lane(1, "conclave-tokens")

    async def callers(self) -> dict[str, str]:
        """Token -> caller name, as the tokens file says now."""
        return await self._lane.run(self._current)

    def roots(self, caller: str) -> tuple[Path, ...] | None:
        """The folders `caller`'s entry lists (None: the server's roots alone), as the tokens file said
        when a request's token was last checked (every request's is, before it is served)."""
        return self._roots.get(caller)

    def _current(self) -> dict[str, str]:
        self._refresh()
        return self._callers

    def _refresh(self) -> None:
        stamp = _stamp(self._path)
        racy = stamp is not None and time.time_ns() - stamp[2] <= RACY_NS
        if stamp == self._stamp and not racy:
            return
        self._stamp = stamp
        try:
            loaded = load_tokens(self._settings)
            self._callers, self._roots = dict(loaded.callers), dict(loaded.roots)
        except ConfigError as exc:
            if self._callers:
                print(f"conclave: {exc}; every token is refused until it is fixed", file=sys.stderr)
            self._callers = {}


class CallerTokens(TokenVerifier):
    """FastMCP's bearer check: a known token becomes an AccessToken whose client_id is the caller's name."""

    def __init__(self, tokens: TokenSource) -> None:
        super().__init__()
        self._tokens = tokens

    async def verify_token(self, token: str) -> AccessToken | None:
        given = token.encode()
        found = None
        for known, caller in (await self._tokens.callers()).items():  # every one compared, in constant time
            if hmac.compare_digest(given, known.encode()):
                found = caller
        return None if found is None else AccessToken(token=token, client_id=found, scopes=[])
