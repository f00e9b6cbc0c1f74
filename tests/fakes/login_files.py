"""Login files in each CLI's own format, as its sign-in writes them, with made-up tokens:

    claude_credentials(token, refresh, expires_in_s)   # ~/.claude/.credentials.json (a Claude plan)
    codex_auth(token, refresh, account)                # ~/.codex/auth.json (a ChatGPT plan)
    gemini_oauth_creds(token, refresh)                 # ~/.gemini/oauth_creds.json (a Google login)
    copilot_config(token, login)                       # ~/.copilot/config.json (GitHub, no keychain)

The formats are the pinned CLIs' (read from their code, and seen accepted by them in
tests/clis/test_cli_logins_e2e.py): Claude Code refreshes a token that expires within five minutes
(`expiresAt`), Codex 0.169 an access token past its JWT `exp` (a `last_refresh` nine days old alone did not
make it refresh); neither checks a token's signature itself (the provider does), so made-up JWTs carry
the claims Codex reads (plan, account, expiry).
"""

from __future__ import annotations

import base64
import datetime
import json
import time
from typing import Any


def claude_credentials(token: str, refresh: str, expires_in_s: float = 36_000) -> bytes:
    """Claude Code's `claudeAiOauth` login; `expires_in_s` below 300 makes it refresh at start."""
    login = {
        "accessToken": token,
        "refreshToken": refresh,
        "expiresAt": int((time.time() + expires_in_s) * 1000),  # wall-time: the file's own expiry stamp
        "scopes": ["user:inference", "user:profile", "user:sessions:claude_code"],
        "subscriptionType": "max",
        "rateLimitTier": "default_claude_max_5x",
    }
    return json.dumps({"claudeAiOauth": login}).encode()


def jwt(claims: dict[str, Any]) -> str:
    """An unsigned-looking JWT (header.claims.signature) with these claims."""

    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"


def codex_claims(account: str, nonce: str, expires_in_s: float = 36_000) -> dict[str, Any]:
    """The ID token's claims Codex reads: the e-mail, the ChatGPT plan and account, the expiry."""
    return {
        "email": "member@example.com",
        "https://api.openai.com/auth": {
            "chatgpt_plan_type": "plus",
            "chatgpt_account_id": account,
            "chatgpt_user_id": "user-conclave-test",
        },
        "exp": int(time.time() + expires_in_s),  # wall-time: the token's own expiry claim
        "nonce": nonce,
    }


def codex_auth(token: str, refresh: str, account: str, refreshed_days_ago: float = 0) -> bytes:
    """Codex's ChatGPT login: no API key, the tokens, the account, and when they were last refreshed."""
    when = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=refreshed_days_ago)
    auth = {
        "OPENAI_API_KEY": None,
        "tokens": {
            "id_token": jwt(codex_claims(account, "id")),
            "access_token": token,
            "refresh_token": refresh,
            "account_id": account,
        },
        "last_refresh": when.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }
    return json.dumps(auth).encode()


def gemini_oauth_creds(token: str, refresh: str, expires_in_s: float = 3_600) -> bytes:
    """Gemini CLI's Google login (google-auth-library's cached credentials, `oauth-personal`)."""
    creds = {
        "access_token": token,
        "refresh_token": refresh,
        "scope": "https://www.googleapis.com/auth/cloud-platform openid "
        "https://www.googleapis.com/auth/userinfo.email https://www.googleapis.com/auth/userinfo.profile",
        "token_type": "Bearer",
        "id_token": jwt({"email": "member@example.com", "aud": "gemini-cli"}),
        "expiry_date": int((time.time() + expires_in_s) * 1000),  # wall-time: the file's own expiry stamp
    }
    return json.dumps(creds).encode()


def copilot_config(token: str, login: str = "member-octocat") -> bytes:
    """~/.copilot/config.json as `copilot login` writes it where it may keep the token in plain text
    (no keychain, `storeTokenPlaintext`): JSON after two comment lines. With a keychain the same file
    names the user (`loggedInUsers`, `lastLoggedInUser`) but holds no `authTokens`."""
    host = "https://github.com"
    config = {
        "authTokens": {f"{host}:{login}:github": {"token": token}, f"{host}:{login}": {"token": token}},
        "loggedInUsers": [{"host": host, "login": login, "kind": "githubDotCom"}],
        "lastLoggedInUser": {"host": host, "login": login},
    }
    head = "// User settings belong in settings.json.\n// This file is managed automatically.\n"
    return (head + json.dumps(config, indent=2)).encode()
