"""Signing in to the web view the way its page does (server/web/static/app.js), for tests that speak
plain HTTP: a one-time code for a token, the confirmed code for a session, the session's header."""

from __future__ import annotations

import httpx2

SESSION_HEADER = "X-Conclave-Session"


def code_for(base: str, token: str) -> str:
    """A one-time sign-in code, asked for with the token (what `conclave web --link` does)."""
    answer = httpx2.post(f"{base}/api/sign-in/link", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["code"])


def session_of(base: str, code: str) -> dict[str, str]:
    """The header of the session a code opens, confirmed from the page's own origin."""
    answer = httpx2.post(
        f"{base}/api/sign-in", json={"code": code, "confirm": True}, headers={"Origin": base}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    return {SESSION_HEADER: answer.json()["session"]}
