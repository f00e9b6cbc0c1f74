"""The providers' own hosts, faked over HTTPS on 127.0.0.1, for CLIs that use the user's login.

A CLI logged in with its credentials file (a Claude plan, a ChatGPT plan) calls its provider's real
hosts, not a base_url. A test serves those names here, with a certificate from a test CA, and gives the
job a `ProviderRedirect` as its egress route (tests/fakes/redirect.py): the member's egress proxy admits
the host by its allowlist, then connects it to this port; the member's container trusts the test CA.

    with LoginHosts(script, tmp_path / "tls") as hosts:
        redirect = hosts.redirect()           # every host below -> this port, and the CA file
        hosts.seen                            # every request: host, method, path, Authorization, body
        hosts.tokens["platform.claude.com"] = {"access_token": ...}   # what a token refresh gets

The model paths of each host map onto the fake providers (tests/fakes/server.py), one agent name a host:
`api.anthropic.com/v1/messages` is agent "claude" of the Anthropic fake, `chatgpt.com/backend-api/codex/
responses` (and `api.openai.com/v1/responses`, for a key) agent "codex" of the Responses fake,
Copilot's model host agent "copilot" of the Anthropic fake (tests/fakes/copilot_api.py, whose plan and
models replies are in `FIXED`). A login's token refresh
(`TOKEN_PATHS`) gets the JSON the test put in `tokens` for its host. Every other request is recorded and
answered 404 (a CLI's side calls: profiles, feature flags), so a test sees what a CLI asked for.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import uvicorn
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from tests.fakes import code_assist_server, copilot_api
from tests.fakes.redirect import ProviderRedirect
from tests.fakes.script import Script
from tests.fakes.server import build_app, free_port
from tests.fakes.threaded import serving
from tests.fakes.tls_ca import TestCa

# host -> (its model path's prefix, the fake provider's prefix for it)
MODEL_PATHS: dict[str, tuple[str, str]] = {
    "api.anthropic.com": ("/v1/messages", "/anthropic/claude/v1/messages"),
    "chatgpt.com": ("/backend-api/codex/", "/responses/codex/v1/"),
    "api.openai.com": ("/v1/responses", "/responses/codex/v1/responses"),  # Codex on an OpenAI key
    "cloudcode-pa.googleapis.com": ("/v1internal:", "/code-assist/gemini/v1internal:"),
    **copilot_api.MODEL_PATHS,
}
# The token refresh of each login (Claude Code's OAuth TOKEN_URL, Codex's refresh URL).
TOKEN_PATHS = {
    "platform.claude.com": "/v1/oauth/token",
    "auth.openai.com": "/oauth/token",
    "oauth2.googleapis.com": "/token",
}
# Fixed answers: Gemini CLI checks a cached Google login's token at start (google-auth-library's
# getTokenInfo) before it uses it; Copilot CLI asks for the user's plan and its models.
FIXED: dict[tuple[str, str], dict[str, object]] = {
    ("oauth2.googleapis.com", "/tokeninfo"): {
        "aud": "gemini-cli.apps.googleusercontent.com",
        "scope": "https://www.googleapis.com/auth/cloud-platform",
        "expires_in": "3599",
        "email": "member@example.com",
        "access_type": "offline",
    },
    **copilot_api.FIXED,  # Copilot CLI's GitHub login: the user's plan, then the models (copilot_api.py)
}


@dataclass(frozen=True)
class Seen:
    """One request to a faked host, as the test reads it (the credentials' token is in `authorization`)."""

    host: str
    method: str
    path: str
    authorization: str
    headers: dict[str, str]
    body: bytes = b""
    at: float = dataclasses.field(default_factory=time.monotonic)  # when it came (a test's diagnostics)


class _HostRouter:
    """Records every request, then sends a known host's model path to its fake provider's route."""

    def __init__(self, app: ASGIApp, seen: list[Seen], tokens: dict[str, dict[str, object]]) -> None:
        self.app, self.seen, self.tokens = app, seen, tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "").rsplit(":", 1)[0]
        path = scope["path"]
        seen = Seen(host, scope["method"], path, headers.get("authorization", ""), headers)
        if TOKEN_PATHS.get(host) == path or (host, path) in FIXED:  # the body (a token) is what counts
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            self.seen.append(dataclasses.replace(seen, body=body))
            answer = FIXED.get((host, path)) or (
                self.tokens.get(host) if TOKEN_PATHS.get(host) == path else None
            )
            await _reply(send, 200, json.dumps(answer).encode() if answer else b"")
            return
        self.seen.append(seen)
        real, fake = MODEL_PATHS.get(host, ("", ""))
        if not real or not path.startswith(real):
            await _reply(send, 404, b"")
            return
        routed = fake + path[len(real) :]
        await self.app({**scope, "path": routed, "raw_path": routed.encode()}, receive, send)


async def _reply(send: Send, status: int, body: bytes) -> None:
    """A JSON answer; an empty `body` is the not-found error."""
    if not body:
        status, body = 404, b'{"error": {"type": "not_found_error", "message": "not faked"}}'
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class LoginHosts:
    """The faked provider hosts for one test, on one loopback port with one certificate for all."""

    def __init__(self, script: Script, folder: Path) -> None:
        self.script = script
        self.seen: list[Seen] = []
        self.tokens: dict[str, dict[str, object]] = {}  # token host -> its refresh's JSON reply
        self.hosts = tuple(dict.fromkeys([*MODEL_PATHS, *TOKEN_PATHS, *(host for host, _ in FIXED)]))
        self.ca = TestCa.create(folder, [*self.hosts, "127.0.0.1"])
        self.port = free_port()
        config = uvicorn.Config(
            _HostRouter(
                Starlette(routes=[*build_app(script).routes, *code_assist_server.routes(script)]),
                self.seen,
                self.tokens,
            ),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="off",
            ssl_certfile=str(self.ca.cert_file),
            ssl_keyfile=str(self.ca.key_file),
            timeout_graceful_shutdown=1,
        )
        self._serving = serving(config, "login-hosts")

    def redirect(self) -> ProviderRedirect:
        return ProviderRedirect({host: self.port for host in self.hosts}, self.ca.ca_file)

    def __enter__(self) -> LoginHosts:
        self._serving.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._serving.__exit__(exc_type, exc, tb)
