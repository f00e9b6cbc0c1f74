"""The web view's tokens mean what they say: each attack of the security review, run the way it ran.

Before (4cd1b02):
- `conclave web` took CONCLAVE_HTTP_TOKEN as the local user's token: its holder listed, read and cancelled
  caller alice's job;
- `conclave ask --web` put the token in the browser's command line (/login?token=...), readable by every
  local user in /proc/PID/cmdline;
- an unauthenticated POST /login of 256 MB took the server from 101 MB to 869 MB before its 401: the body
  was read and parsed whole;
- the session cookie (a fixed HMAC of the token, no expiry) went to every port of 127.0.0.1: a server on
  another port got it, replayed it, and read alice's job;
- a cross-site redirect to /login?token=<bob's token> replaced alice's session with bob's (login CSRF);
- a rewritten http-tokens.json took effect only at restart.
"""

from __future__ import annotations

import json
import os
import re
import select
import socket
import sys
import threading
import webbrowser
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx2
import pytest

from conclave.cli.main import main
from conclave.jobs.store.sql import Store
from conclave.settings import Settings
from conclave.web.sessions import MAX_CODES, MAX_SESSIONS, Caller, Sessions, digest
from tests.fakes.new_jobs import new_job
from tests.fakes.processes import http_process, web_server
from tests.fakes.raw_mcp import HEADERS, INIT
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, install, voter, write_team
from tests.web_browser import chromium, missing, text_of, until
from tests.web_sign_in import SESSION_HEADER, code_for

JOB = "cj-a11ce0000001"
ALICE, BOB = "alice-token-0123456789abcdef", "bob-token-0123456789abcdef"
HTTP = "http-token-0123456789abcdef"  # CONCLAVE_HTTP_TOKEN: the `http` caller
browser = pytest.mark.skipif(missing() is not None, reason=str(missing()))


def tokens_file(home: Path, callers: dict[str, str]) -> None:
    path = home / "http-tokens.json"
    path.write_text(json.dumps(callers))
    path.chmod(0o600)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A state folder holding a running job of caller alice, and alice's and bob's tokens."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    store = Store.of(Settings(home=home))
    store.create_job(
        new_job(JOB, "alice's secret task", team="t", caller="alice"), os.getpid(), "someone-else"
    )
    store.set_state(JOB, "running", "working")
    store.close()
    tokens_file(home, {"alice": ALICE, "bob": BOB})
    return home


@contextmanager
def serve_http(tmp_path: Path, home: Path, token: str | None = None) -> Iterator[tuple[str, int]]:
    """`conclave serve --http` on a free port for the state folder `home`: its base URL and its process
    id (CONCLAVE_HTTP_TOKEN only when `token` is given)."""
    with http_process(tmp_path, {"CONCLAVE_HOME": str(home)}, token) as (base, process):
        yield base, process.pid
        process.terminate()
        process.wait(timeout=60)


class Elsewhere:
    """A server on another port of 127.0.0.1, as anyone on the machine may run: it records the cookies the
    browser sends it, and redirects /go to `target` (a cross-site link)."""

    def __init__(self) -> None:
        self.cookies: list[str | None] = []
        self.target = "/"
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name
                outer.cookies.append(self.headers.get("Cookie"))
                if self.path == "/go":
                    self.send_response(302)
                    self.send_header("Location", outer.target)
                    self.end_headers()
                    return
                body = b"<!doctype html><title>elsewhere</title><p>nothing here"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Elsewhere:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def signed_in_with_the_form(driver: Any, base: str, token: str) -> None:
    """Sign the browser in by typing the token into /login's form (the same steps before and after)."""
    driver.get(f"{base}/login")
    until(driver, lambda d: d.find_element("id", "token").is_displayed(), what="the sign-in form")
    driver.find_element("id", "token").send_keys(token)
    driver.find_element("css selector", "form button").click()


def sees_the_job(driver: Any) -> bool:
    """The list of jobs shows alice's job (bob's would not): the tab is signed in as alice."""
    found = until(driver, lambda d: d.find_elements("css selector", f'[data-job="{JOB}"]'), 20, "alice's job")
    return bool(found)


# 1. CONCLAVE_HTTP_TOKEN is the `http` caller's, not the local user's
def test_the_http_token_opens_nothing_in_conclave_web(home: Path) -> None:
    process, _link = web_server(home, {"CONCLAVE_HTTP_TOKEN": HTTP})
    try:
        base = _link.split("/login", 1)[0]
        auth = {"Authorization": f"Bearer {HTTP}"}
        with httpx2.Client(base_url=base, timeout=10) as http:
            listed = http.get("/api/jobs", headers=auth)
            assert listed.status_code == 401 and JOB not in listed.text
            assert http.get(f"/api/jobs/{JOB}", headers=auth).status_code == 401
            assert http.post(f"/api/jobs/{JOB}/cancel", headers={**auth, "Origin": base}).status_code == 401
            assert (
                http.post("/api/sign-in", json={"token": HTTP}, headers={"Origin": base}).status_code == 401
            )
        store = Store.of(Settings(home=home))
        try:
            assert store.job(JOB).cancel_requested is False  # type: ignore[union-attr]
        finally:
            store.close()
    finally:
        process.terminate()
        process.communicate(timeout=20)


# 2. No long-lived token in a browser's command line
OPENER = """#!{python}
import json, os, sys, urllib.error, urllib.parse, urllib.request
# a browser that records its command line (what /proc/PID/cmdline shows every local user), then uses the link
token = json.load(open(os.path.join(os.environ["CONCLAVE_HOME"], "web.json")))["token"]
link = urllib.parse.urlsplit(sys.argv[1])
base = link.scheme + "://" + link.netloc
code = urllib.parse.parse_qs(link.query).get("code", [""])[0]
def sign_in(body):
    headers = {{"Origin": base, "Content-Type": "application/json"}}
    ask = urllib.request.Request(base + "/api/sign-in", json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(ask) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as refused:
        return refused.code, {{}}
statuses = []
claimed, page = sign_in({{"code": code}})  # what the page does as it loads
statuses.append(claimed)
statuses.append(sign_in({{"code": code, "confirm": True}})[0])  # a replay of the code read from /proc
statuses.append(sign_in({{"code": page.get("code", code), "confirm": True}})[0])  # the user confirms
json.dump({{"argv": sys.argv, "token": token, "statuses": statuses}}, open({record!r}, "w"))
"""


def test_ask_web_puts_a_one_time_code_in_the_browsers_command_line(
    tmp_path: Path, fakes: FakeProviders, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(fakes.script, TRIO, voter())
    team = write_team(tmp_path / "trio.yaml", fakes, TRIO)
    opener, record = tmp_path / "open-browser", tmp_path / "opened.json"
    opener.write_text(OPENER.format(python=sys.executable, record=str(record)))
    opener.chmod(0o700)
    monkeypatch.setenv("BROWSER", f"{opener} %s")
    monkeypatch.setattr(webbrowser, "_tryorder", None)  # it reads BROWSER once per process: read it again
    monkeypatch.setenv("CONCLAVE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv(KEY_ENV, "test-key")
    monkeypatch.delenv("CONCLAVE_HTTP_TOKEN", raising=False)
    assert main(["ask", "What is six times seven?", "--team", str(team), "--web", "--json"]) == 0
    opened = json.loads(record.read_text())
    command_line = " ".join(opened["argv"])
    assert opened["token"] not in command_line
    assert re.search(r"/login\?code=[\w-]+", command_line)
    # the page swaps the link's code for its own as it loads: a replay of the link gets nothing, and the
    # user's confirmation signs the browser in
    assert opened["statuses"] == [200, 401, 200]


# 3. Every body is capped before it is parsed
BIG = 64 * 1024 * 1024
CHUNK = 1024 * 1024


def peak_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def post_big(port: int, path: str, *, chunked: bool, headers: str = "") -> int | None:
    """POST BIG bytes to `path`, declared (Content-Length) or streamed (chunked), stopping as soon as the
    server answers: its status, or None when it cut the connection before an answer could be read."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {BIG}"
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/x-www-form-urlencoded\r\n{headers}{framing}\r\n\r\n".encode()
        )
        piece = b"token=" + b"a" * (CHUNK - 6)
        try:
            answered = bool(select.select([sock], [], [], 1.0)[0])  # a cap on Content-Length answers at once
            sent = 0
            while not answered and sent < BIG:
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                sent += len(piece)
                answered = bool(select.select([sock], [], [], 0.02)[0])
            if not answered and chunked:
                sock.sendall(b"0\r\n\r\n")
            head = sock.recv(4096)
        except (BrokenPipeError, ConnectionResetError):
            return None
        found = re.match(rb"HTTP/1\.1 (\d+)", head)
        return int(found.group(1)) if found else None


def test_a_huge_body_is_refused_before_it_is_read(tmp_path: Path, home: Path) -> None:
    with serve_http(tmp_path, home) as (base, pid):
        port = int(base.rsplit(":", 1)[1])
        same = f"Origin: {base}\r\n"  # as the server's own page sends it: the routes go on to the body
        alice = f"Authorization: Bearer {ALICE}\r\n"
        before = peak_rss_kb(pid)
        answers = [
            post_big(port, "/login", chunked=False, headers=same),  # the review's request: no token
            post_big(port, "/api/sign-in", chunked=False, headers=same),
            post_big(port, "/api/sign-in", chunked=True, headers=same),
            post_big(port, "/mcp", chunked=False, headers=alice),  # signed in or not, the same cap
            post_big(port, "/mcp", chunked=True, headers=alice),
        ]
        grown_mb = (peak_rss_kb(pid) - before) / 1024
        # a streamed body is refused mid-stream: the 413 may be lost when the server drops the rest
        assert answers[:2] == [413, 413] and answers[3] == 413, (answers, grown_mb)
        assert answers[2] in (413, None) and answers[4] in (413, None), (answers, grown_mb)
        assert grown_mb < 24, f"the server's peak memory grew by {grown_mb:.0f} MB for five refused bodies"
        with httpx2.Client(timeout=10) as http:  # and it still serves
            initialized = http.post(
                f"{base}/mcp", json=INIT, headers={**HEADERS, "Authorization": f"Bearer {ALICE}"}
            )
            assert initialized.status_code == 200


# 4. A cookie read on another port of the host is useless
@browser
def test_what_another_port_receives_from_the_browser_opens_nothing(tmp_path: Path, home: Path) -> None:
    with serve_http(tmp_path, home) as (base, _pid), Elsewhere() as elsewhere, chromium() as driver:
        signed_in_with_the_form(driver, base, ALICE)
        assert sees_the_job(driver)
        driver.get(f"{elsewhere.url}/")  # the browser visits the other server: it gets every 127.0.0.1 cookie
        assert driver.execute_script("return sessionStorage.length") == 0  # another origin's storage
        cookies = {cookie for cookie in elsewhere.cookies if cookie}  # the page, and the browser's favicon
        replayed = {"Cookie": "; ".join(cookies)} if cookies else {}
        with httpx2.Client(base_url=base, timeout=10) as http:
            for path in ("/api/jobs", f"/api/jobs/{JOB}", "/api/session", f"/jobs/{JOB}", "/"):
                answer = http.get(path, headers=replayed)
                assert "alice's secret task" not in answer.text, path
                assert answer.status_code == 401 or not path.startswith("/api/"), path
            assert (
                http.post(f"/api/jobs/{JOB}/cancel", headers={**replayed, "Origin": base}).status_code == 401
            )


# 5. A cross-site link cannot replace a session (login CSRF)
@browser
def test_a_cross_site_redirect_to_a_sign_in_link_does_not_replace_the_session(
    tmp_path: Path, home: Path
) -> None:
    with serve_http(tmp_path, home) as (base, _pid), Elsewhere() as elsewhere, chromium() as driver:
        signed_in_with_the_form(driver, base, ALICE)
        assert sees_the_job(driver)
        # bob, who holds his own token, gets a one-time code for himself (where the server makes them)
        minted = httpx2.post(
            f"{base}/api/sign-in/link", headers={"Authorization": f"Bearer {BOB}"}, timeout=10
        )
        code = minted.json()["code"] if minted.status_code == 200 else ""
        elsewhere.target = f"{base}/login?token={BOB}&code={code}&next=/"
        driver.get(f"{elsewhere.url}/go")  # bob's page sends alice's tab to the sign-in link
        until(driver, lambda d: d.current_url.startswith(f"{base}/"), what="the redirect")
        driver.get(f"{base}/")
        assert sees_the_job(driver)  # still alice: bob would see none of her jobs
        assert "alice" in text_of(driver, "#who")
        # a link shows whose it is and what it replaces, and signs in only when the user confirms
        fresh = httpx2.post(
            f"{base}/api/sign-in/link", headers={"Authorization": f"Bearer {BOB}"}, timeout=10
        )
        driver.get(f"{base}/login?code={fresh.json()['code']}&next=/")
        until(driver, lambda d: d.find_element("id", "confirm").is_displayed(), what="the confirmation")
        assert text_of(driver, "#confirm-caller") == "bob" and text_of(driver, "#current-caller") == "alice"


# 6. A changed tokens file takes effect at once
def test_a_rewritten_tokens_file_takes_effect_without_a_restart(tmp_path: Path, home: Path) -> None:
    tokens_file(home, {"alice": ALICE})
    with serve_http(tmp_path, home) as (base, _pid), httpx2.Client(base_url=base, timeout=10) as http:

        def mcp(token: str) -> int:
            return http.post(
                "/mcp", json=INIT, headers={**HEADERS, "Authorization": f"Bearer {token}"}
            ).status_code

        def web(token: str) -> httpx2.Response:
            return http.get("/api/jobs", headers={"Authorization": f"Bearer {token}"})

        assert mcp(ALICE) == 200 and web(ALICE).status_code == 200 and mcp(BOB) == 401
        tokens_file(home, {"bob": BOB})  # alice's token taken out, bob's put in; no restart
        assert mcp(BOB) == 200 and mcp(ALICE) == 401
        assert web(BOB).status_code == 200 and JOB not in web(BOB).text  # bob sees none of alice's jobs
        assert web(ALICE).status_code == 401


def test_removing_a_token_ends_its_sessions_and_codes(tmp_path: Path, home: Path) -> None:
    with serve_http(tmp_path, home) as (base, _pid), httpx2.Client(base_url=base, timeout=10) as http:
        same = {"Origin": base}
        alice = {
            SESSION_HEADER: http.post("/api/sign-in", json={"token": ALICE}, headers=same).json()["session"]
        }
        bob = {SESSION_HEADER: http.post("/api/sign-in", json={"token": BOB}, headers=same).json()["session"]}
        code = http.post("/api/sign-in/link", headers={"Authorization": f"Bearer {ALICE}"}).json()["code"]
        assert [line["job_id"] for line in http.get("/api/jobs", headers=alice).json()] == [JOB]
        tokens_file(home, {"bob": BOB})
        assert http.get("/api/jobs", headers=alice).status_code == 401
        assert (
            http.post("/api/sign-in", json={"code": code, "confirm": True}, headers=same).status_code == 401
        )
        tokens_file(home, {"alice": ALICE, "bob": BOB})  # the token back: its old session stays ended
        assert http.get("/api/jobs", headers=alice).status_code == 401
        assert http.get("/api/jobs", headers=bob).json() == []  # bob's session lives on, his own jobs only


# 7. One caller cannot sign another out: the caps on codes and sessions are each caller's own
def test_one_caller_minting_codes_and_sessions_evicts_only_their_own() -> None:
    sessions = Sessions()
    alice, bob = Caller("alice", digest(ALICE)), Caller("bob", digest(BOB))
    alice_code, alice_session = sessions.code_for(alice), sessions.open(alice)
    bob_codes = [sessions.code_for(bob) for _ in range(MAX_CODES + 5)]
    bob_sessions = [sessions.open(bob) for _ in range(MAX_SESSIONS + 5)]
    assert sessions.caller_of(alice_session) == alice  # bob's 10,000 sign-ins left hers alone
    assert sessions.redeem(alice_code) is not None  # and his 1,000 codes her pending one
    assert sessions.caller_of(bob_sessions[0]) is None and sessions.caller_of(bob_sessions[-1]) == bob
    assert sessions.redeem(bob_codes[0]) is None and sessions.redeem(bob_codes[-1]) is not None


def test_a_session_lookup_reads_no_other_session() -> None:
    """A request's check looks up its own session by its digest, and ends the sessions of a token only
    when the server's tokens changed: it never walks the other sessions."""
    sessions = Sessions()
    alice, bob = Caller("alice", digest(ALICE)), Caller("bob", digest(BOB))
    keys = [sessions.open(bob) for _ in range(50)]
    mine = sessions.open(alice)
    walked = Walks(sessions)
    for _ in range(20):
        sessions.revoke({alice, bob})
        assert sessions.caller_of(mine) == alice
    assert walked.count == 0
    sessions.revoke({alice})  # bob's token taken out: his sessions end, hers stays
    assert sessions.caller_of(keys[0]) is None and sessions.caller_of(mine) == alice


class Walks:
    """Counts the walks over any dict of the sessions' that holds 50 entries or more (where they keep the
    sessions): each such dict, at any depth of their attributes, replaced by a counting one."""

    def __init__(self, sessions: Sessions) -> None:
        self.count = 0
        outer = self

        class Counted(dict):  # type: ignore[type-arg]
            def __iter__(self) -> Any:
                outer.count += 1
                return super().__iter__()

            def items(self) -> Any:
                outer.count += 1
                return super().items()

            def values(self) -> Any:
                outer.count += 1
                return super().values()

        def swap(holder: Any, depth: int) -> None:
            for name, value in list(vars(holder).items()):
                if isinstance(value, dict) and len(value) >= 50:
                    setattr(holder, name, Counted(value))
                elif isinstance(value, dict):
                    for key, item in list(value.items()):
                        if isinstance(item, dict) and len(item) >= 50:
                            value[key] = Counted(item)
                elif hasattr(value, "__dict__") and depth < 3:
                    swap(value, depth + 1)

        swap(sessions, 0)


# 8. After signing in, the tab goes to a page of this server only
def redirects(elsewhere: str) -> list[str]:
    """`next` values a browser reads as another origin (WHATWG URL: tab and newline dropped anywhere,
    leading C0 controls and spaces trimmed, a backslash read as a slash)."""
    return [
        f"/\t/{elsewhere}/",
        f"/\n/{elsewhere}/",
        f"/\r/{elsewhere}/",
        f"/\\{elsewhere}/",
        f"\\\\{elsewhere}/",
        f"/\\/{elsewhere}/",
        f"  //{elsewhere}/",
        f"\x01//{elsewhere}/",
        f"//{elsewhere}/",
        f"http://{elsewhere}/",
        f"http:/\\{elsewhere}/",
        f"\thttp://{elsewhere}/",
        f"http:\t//{elsewhere}/",
        "javascript:alert(1)//",
    ]


def test_sign_in_sends_the_tab_to_this_origin_only(tmp_path: Path, home: Path) -> None:
    """What /api/sign-in answers as the page to go to, through the form (a token) and a one-time link."""
    with serve_http(tmp_path, home) as (base, _pid), httpx2.Client(base_url=base, timeout=10) as http:
        same = {"Origin": base}

        def by_form(wanted: str) -> str:
            answer = http.post("/api/sign-in", json={"token": ALICE, "next": wanted}, headers=same)
            assert answer.status_code == 200, answer.text
            return str(answer.json()["next"])

        def by_link(wanted: str) -> str:
            code = http.post("/api/sign-in/link", headers={"Authorization": f"Bearer {ALICE}"}).json()["code"]
            claimed = http.post("/api/sign-in", json={"code": code}, headers=same).json()["code"]
            answer = http.post(
                "/api/sign-in", json={"code": claimed, "confirm": True, "next": wanted}, headers=same
            )
            assert answer.status_code == 200, answer.text
            return str(answer.json()["next"])

        for sign_in in (by_form, by_link):
            for wanted in redirects("evil.example") + redirects(
                base.removeprefix("http://") + "@evil.example"
            ):
                assert sign_in(wanted) == f"{base}/", (sign_in.__name__, wanted)
            assert sign_in(f"/jobs/{JOB}?tab=diff#top") == f"{base}/jobs/{JOB}?tab=diff#top"
            assert sign_in(f"  /jobs/{JOB}") == f"{base}/jobs/{JOB}"
            assert sign_in(f"{base}/jobs/{JOB}") == f"{base}/jobs/{JOB}"
            assert sign_in("") == f"{base}/"


@browser
def test_the_tab_stays_on_this_server_after_signing_in(tmp_path: Path, home: Path) -> None:
    """In the real browser, through the form and a one-time link: every `next` that would lead to the
    other server leaves the tab on this one's list."""
    with serve_http(tmp_path, home) as (base, _pid), Elsewhere() as elsewhere, chromium() as driver:
        other = elsewhere.url.removeprefix("http://")
        for wanted in redirects(other)[:4]:
            query = "next=" + quote(wanted, safe="")
            driver.get(f"{base}/login?{query}")
            until(driver, lambda d: d.find_element("id", "token").is_displayed(), what="the sign-in form")
            driver.find_element("id", "token").send_keys(ALICE)
            driver.find_element("css selector", "form button").click()
            until(driver, lambda d: "/login" not in d.current_url, what="the page after signing in")
            assert driver.current_url == f"{base}/", wanted
            assert sees_the_job(driver)
            driver.get(f"{base}/login?code={code_for(base, ALICE)}&{query}")
            until(driver, lambda d: d.find_element("id", "confirm").is_displayed(), what="the confirmation")
            driver.find_element("id", "confirm-button").click()
            until(driver, lambda d: "/login" not in d.current_url, what="the page after the link")
            assert driver.current_url == f"{base}/", wanted
        assert elsewhere.cookies == []  # the other server was never visited
