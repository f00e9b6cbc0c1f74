"""The web view over plain HTTP: `conclave web` as a real process on a state folder, its one auth check
(token or cookie, Host, Origin, CSRF), the snapshot, the event stream, cancel, and the URL in JobViews.
The browser tests are in tests/test_web_browser.py.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from conclave.cli.main import main
from conclave.cli.render import answer_text
from conclave.coordination.prompts import turn_prompt
from conclave.coordination.reports import AgentProgress, Check, JobEvent, Progress
from conclave.errors import JobNotFound
from conclave.jobs.lookup import JobLookup
from conclave.jobs.service import JobService
from conclave.jobs.store import Store
from conclave.jobs.views import JobView
from conclave.jobs.web_link import served
from conclave.settings import Settings
from conclave.web.snapshot import job_page, timeline
from tests.fakes.processes import web_server
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, install, voter, write_team

JOB = "cj-0123456789ab"


def record(store: Store, kind: str, letter: str | None = None, **data: object) -> None:
    agents = [AgentProgress(letter=x, model=f"openai/m-{x}", state="working") for x in "AB"]
    store.record(
        JOB, JobEvent(kind=kind, letter=letter, data=data, at=1.0), Progress(phase="", agents=agents), None
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    store = Store(home / "conclave.db")
    store.create_job(JOB, "Say <b>42</b>", "t", "{}", os.getpid(), "someone-else")
    store.set_state(JOB, "running", "working")
    record(store, "answer", "A", label="A1", revision=1, content="<script>alert(1)</script>")
    store.close()
    return home


@pytest.fixture
def web(home: Path, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """`conclave web` on a free port: (its base URL, the token from the link it printed)."""
    process, link = web_server(home)
    try:
        found = re.search(r"(http://127\.0\.0\.1:\d+)/login\?token=(\S+)", link)
        assert found, link
        yield found.group(1), found.group(2)
    finally:
        process.terminate()
        rest = process.communicate(timeout=20)[0]
        assert process.returncode == 0, rest
    assert not (home / "web.json").exists()  # withdrawn at exit


def test_conclave_web_announces_itself_and_jobviews_carry_the_url(web: tuple[str, str], home: Path) -> None:
    base, token = web
    found = served(home)
    assert found is not None and found.url == base and found.token == token
    assert (home / "web.json").stat().st_mode & 0o077 == 0


@pytest.mark.anyio
async def test_a_jobview_carries_the_url_when_a_web_view_is_served(web: tuple[str, str], home: Path) -> None:
    base, _token = web
    async with JobService.open(Settings(home=home)) as service:
        view = await service.view(JOB)
        assert view.web_url == f"{base}/jobs/{JOB}" and f"Watch it live: {base}/jobs/{JOB}" in view.text()


def test_every_route_needs_the_token(web: tuple[str, str]) -> None:
    base, token = web
    forged_cookie = {f"conclave_web_{base.rsplit(':', 1)[1]}": token}
    with (
        httpx2.Client(base_url=base, timeout=10) as http,
        httpx2.Client(base_url=base, timeout=10, cookies=forged_cookie) as forged,
    ):
        for path in (
            "/",
            f"/jobs/{JOB}",
            "/api/jobs",
            f"/api/jobs/{JOB}",
            f"/api/jobs/{JOB}/events",
            "/api/session",
        ):
            refused = http.get(path)
            assert refused.status_code == 401, path
            assert "<b>42" not in refused.text and "alert(1)" not in refused.text and JOB not in refused.text
            assert http.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert forged.get(path).status_code == 401  # the cookie holds an HMAC of the token, not the token
        assert http.post(f"/api/jobs/{JOB}/cancel", headers={"Origin": base}).status_code == 401
        assert http.get("/static/app.js").status_code == 200  # the assets are public: they hold no data


def test_login_sets_an_httponly_cookie_that_is_not_the_token(web: tuple[str, str]) -> None:
    base, token = web
    with httpx2.Client(base_url=base, timeout=10) as http:
        signed = http.get("/login", params={"token": token, "next": f"/jobs/{JOB}"})
        assert signed.status_code == 303 and signed.headers["location"] == f"/jobs/{JOB}"
        cookie = signed.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and token not in cookie
        page = http.get(f"/jobs/{JOB}")
        assert (
            page.status_code == 200 and "alert(1)" not in page.text
        )  # the page is static: data comes as JSON
        csp = page.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "unsafe-inline" not in csp and "script-src 'self'" in csp
        assert (
            http.get("/login", params={"token": token, "next": "//evil.example/x"}).headers["location"] == "/"
        )
        assert http.get("/login", params={"token": "wrong"}).status_code == 401


def test_host_and_origin_are_checked(web: tuple[str, str]) -> None:
    base, token = web
    auth = {"Authorization": f"Bearer {token}"}
    with httpx2.Client(base_url=base, timeout=10) as http:
        assert http.get("/api/jobs", headers=auth).status_code == 200
        assert http.get("/api/jobs", headers={**auth, "Host": "evil.example"}).status_code == 421
        assert http.get("/api/jobs", headers={**auth, "Origin": "http://evil.example"}).status_code == 403
        port = base.rsplit(":", 1)[1]
        assert http.get("/api/jobs", headers={**auth, "Host": f"localhost:{port}"}).status_code == 200
        form = http.post("/login", content=f"token={token}", headers={"Origin": "http://evil.example"})
        assert form.status_code == 403


def test_cancel_needs_the_same_origin_and_the_csrf_value(web: tuple[str, str], home: Path) -> None:
    base, token = web
    auth = {"Authorization": f"Bearer {token}"}
    with httpx2.Client(base_url=base, timeout=10) as http:
        csrf = http.get("/api/session", headers=auth).json()["csrf"]
        assert csrf not in http.get(f"/jobs/{JOB}", headers=auth).text
        path = f"/api/jobs/{JOB}/cancel"
        assert http.post(path, headers={**auth, "Origin": base}).status_code == 403  # no CSRF value
        assert http.post(path, headers={**auth, "X-Conclave-CSRF": csrf}).status_code == 403  # no Origin
        evil = {**auth, "X-Conclave-CSRF": csrf, "Origin": "http://evil.example"}
        assert http.post(path, headers=evil).status_code == 403
        store = Store(home / "conclave.db")
        try:
            assert store.job(JOB).cancel_requested is False  # type: ignore[union-attr]
            assert (
                http.post(path, headers={**auth, "X-Conclave-CSRF": csrf, "Origin": base}).status_code == 202
            )
            assert store.job(JOB).cancel_requested is True  # type: ignore[union-attr]  # the owner honours it
        finally:
            store.close()


def test_the_stream_sends_each_change_and_ends_with_the_job(web: tuple[str, str], home: Path) -> None:
    base, token = web
    store = Store(home / "conclave.db")
    pages: list[dict[str, object]] = []
    try:
        with (
            httpx2.Client(base_url=base, timeout=30) as http,
            http.stream(
                "GET", f"/api/jobs/{JOB}/events", headers={"Authorization": f"Bearer {token}"}
            ) as stream,
        ):
            assert stream.headers["content-type"].startswith("text/event-stream")
            kind = ""
            for line in stream.iter_lines():
                if line.startswith("event:"):
                    kind = line.split(":", 1)[1].strip()
                elif line.startswith("data:") and kind == "job":
                    pages.append(json.loads(line[5:]))
                    if len(pages) == 1:  # the page as it is, then one write: the vote
                        record(store, "vote", "B", label="A1", reason="right")
                    elif len(pages) == 2:
                        store.set_state(JOB, "interrupted", "the server that ran this job stopped")
                elif kind == "end":
                    break
    finally:
        store.close()
    assert [page["seq"] for page in pages] == [1, 2, 2]
    states = [page["view"]["state"] for page in pages]  # type: ignore[index]
    assert states == ["running", "running", "interrupted"]
    assert pages[0]["answers"]["A"][0]["content"] == "<script>alert(1)</script>"  # type: ignore[index]
    assert pages[1]["timeline"][-1]["text"] == "B voted for A1"  # type: ignore[index]


def test_the_timeline_shows_which_votes_a_new_answer_cleared() -> None:
    events = [
        JobEvent(kind="answer", letter="A", data={"label": "A1", "revision": 1, "content": "x"}, at=1),
        JobEvent(kind="vote", letter="A", data={"label": "A1", "reason": "mine"}, at=2),
        JobEvent(kind="tool_call", letter="B", data={"name": "read_file"}, at=2.5),
        JobEvent(kind="answer", letter="B", data={"label": "B1", "revision": 1, "content": "y"}, at=3),
        JobEvent(kind="answer", letter="C", data={"label": "C1", "revision": 1, "content": "z"}, at=4),
        JobEvent.model_construct(kind="steered", letter=None, data={"note": "prefer the short one"}, at=4.5),
        JobEvent(kind="finished", data={"winner": "B1", "reason": "all voted"}, at=5),
    ]
    moments = timeline(events)
    assert [m.kind for m in moments] == [
        "answer",
        "vote",
        "invalidated",
        "answer",
        "answer",
        "steer",
        "finished",
    ]
    assert moments[2].text == "a new answer cleared A's vote for A1"
    assert moments[5].body == "prefer the short one"  # steering notes (when jobs have them) show


OPENER = """#!{python}
import sys, urllib.request
browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
with browser.open(sys.argv[1]) as page:  # follows the sign-in redirect, with the cookie it set
    open({record!r}, "w").write(sys.argv[1] + "\\n" + page.url + "\\n" + str(page.status))
"""


def test_ask_web_opens_the_page_and_prints_its_url(
    tmp_path: Path, fakes: FakeProviders, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    install(fakes.script, TRIO, voter())
    team = write_team(tmp_path / "trio.yaml", fakes, TRIO)
    opener, record = tmp_path / "open-browser", tmp_path / "opened.txt"
    opener.write_text(OPENER.format(python=sys.executable, record=str(record)))
    opener.chmod(0o700)
    monkeypatch.setenv("BROWSER", f"{opener} %s")  # the webbrowser module runs it, as it would a browser
    monkeypatch.setenv("CONCLAVE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv(KEY_ENV, "test-key")
    monkeypatch.delenv("CONCLAVE_HTTP_TOKEN", raising=False)
    assert main(["ask", "What is six times seven?", "--team", str(team), "--web", "--json"]) == 0
    captured = capsys.readouterr()
    view = JobView.model_validate(json.loads(captured.out))
    printed = re.search(r"Watch it live: (http://127\.0\.0\.1:\d+)/jobs/(cj-\w+)", captured.err)
    assert printed and printed.group(2) == view.job_id
    opened, landed, status = record.read_text().splitlines()
    assert opened.startswith(f"{printed.group(1)}/login?token=") and opened.endswith(
        f"&next=/jobs/{view.job_id}"
    )
    assert landed == f"{printed.group(1)}/jobs/{view.job_id}" and status == "200"
    assert not (tmp_path / "state" / "web.json").exists()  # the page went with the command


@pytest.mark.anyio
async def test_a_page_carries_each_answers_check_and_output(home: Path) -> None:
    store = Store(home / "conclave.db")
    agents = [AgentProgress(letter=x, model=f"openai/m-{x}", state="working") for x in "AB"]
    checks = {"A1": Check(status="failed", exit_code=1, duration_s=2.0, tail=["1 failed"])}
    store.record(
        JOB,
        JobEvent(
            kind="checked",
            letter="A",
            at=2.0,
            data={
                "label": "A1",
                "status": "failed",
                "exit_code": 1,
                "tail": ["1 failed"],
                "output": "E   assert 1 == 2\n1 failed",
            },
        ),
        Progress(phase="", agents=agents, checks=checks),
        None,
    )
    store.close()
    async with JobLookup.open(Settings(home=home)) as jobs:
        page = job_page(await jobs.page(JOB), "http://127.0.0.1/jobs/x")
        with pytest.raises(JobNotFound):
            await jobs.page(JOB, caller="not-the-owner")  # a caller's own jobs only, as over MCP
    (card,) = page.answers["A"]
    assert (card.check, card.check_status) == ("failed (exit 1): 1 failed", "failed")
    assert card.check_output == "E   assert 1 == 2\n1 failed" and card.latest and page.answers["B"] == []
    # the one record each reader renders: this card, `conclave show --answers`, a voter's prompt
    shown = answer_text(card)
    assert shown.startswith("## A1 (agent A, ") and "check failed (exit 1): 1 failed)\n" in shown
    assert shown.endswith(f"\n{card.content}")
    assert "## Answer A1 - verify failed (exit 1): 1 failed\n" in turn_prompt("B", [card], ["A1"], True)
    assert (
        page.timeline[-1].text == "check of A1: failed (exit 1)"
        and page.view.web_url == "http://127.0.0.1/jobs/x"
    )


def test_the_shipped_pages_have_no_inline_script_and_the_script_writes_no_markup() -> None:
    static = Path(__file__).resolve().parents[1] / "server" / "web" / "static"
    for page in static.glob("*.html"):
        html = page.read_text()
        assert re.findall(r"<script\b[^>]*>", html) == ['<script src="/static/app.js" defer>'], page.name
        assert not re.search(r"\son[a-z]+\s*=|\sstyle\s*=|javascript:", html, re.IGNORECASE), page.name
    code = "\n".join(
        line for line in (static / "app.js").read_text().splitlines() if not line.lstrip().startswith("//")
    )
    for sink in (
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
        "new Function",
        'setAttribute("on',
        "srcdoc",
    ):
        assert sink not in code, f"app.js uses {sink}: model text must go through textContent"
