"""The web view over plain HTTP: `conclave web` as a real process on a state folder, its one auth check
(token or session header, Host, Origin), signing in with one-time codes, the snapshot, the event stream,
cancel, and the URL in JobViews. The browser tests are in tests/test_web_browser.py; the attacks on the
sign-in are in tests/security/test_web_sessions.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import webbrowser
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from conclave.cli.main import main
from conclave.cli.render import answer_text
from conclave.coordination.prompts import turn_prompt
from conclave.coordination.reports import (
    AgentProgress,
    AnswerEvent,
    Check,
    CheckedEvent,
    FinishedEvent,
    JobResult,
    Progress,
    SteeredEvent,
    ToolCallEvent,
    VoteEvent,
    stored_event,
)
from conclave.errors import JobNotFound
from conclave.jobs.lookup import JobLookup
from conclave.jobs.read.views import JobView
from conclave.jobs.read.web_link import served
from conclave.jobs.service import JobService
from conclave.jobs.store.sql import Store
from conclave.settings import Settings
from conclave.web import sessions
from conclave.web.sessions import Caller, Sessions, digest
from conclave.web.snapshot import job_page, timeline
from tests.fakes.new_jobs import new_job
from tests.fakes.processes import web_server
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, TRIO, install, voter, write_team
from tests.web_sign_in import SESSION_HEADER, code_for, session_of

JOB = "cj-0123456789ab"


def record(store: Store, kind: str, letter: str | None = None, **data: object) -> None:
    agents = [AgentProgress(letter=x, model=f"openai/m-{x}", state="working") for x in "AB"]
    store.record(JOB, stored_event(kind, letter, 1.0, data), Progress(phase="", agents=agents), None)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    store = Store.of(Settings(home=home))
    store.create_job(new_job(JOB, "Say <b>42</b>", team="t"), os.getpid(), "someone-else")
    store.set_state(JOB, "running", "working")
    record(store, "answer", "A", label="A1", revision=1, content="<script>alert(1)</script>")
    store.close()
    return home


@pytest.fixture
def web(home: Path, tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """`conclave web` on a free port: (its base URL, its token from web.json, the code it printed)."""
    process, link = web_server(home)
    try:
        found = re.search(r"(http://127\.0\.0\.1:\d+)/login\?code=(\S+)", link)
        running = served(home)
        assert found and running is not None, link
        yield found.group(1), running.token, found.group(2)
    finally:
        process.terminate()
        rest = process.communicate(timeout=20)[0]
        assert process.returncode == 0, rest
    assert not (home / "web.json").exists()  # withdrawn at exit


def test_conclave_web_announces_itself_and_jobviews_carry_the_url(
    web: tuple[str, str, str], home: Path
) -> None:
    base, token, code = web
    found = served(home)
    assert found is not None and found.url == base and found.token == token and token not in code
    assert (home / "web.json").stat().st_mode & 0o077 == 0


@pytest.mark.anyio
async def test_a_jobview_carries_the_url_when_a_web_view_is_served(
    web: tuple[str, str, str], home: Path
) -> None:
    base, _token, _code = web
    async with JobService.open(Settings(home=home)) as service:
        view = await service.lookup.view(JOB)
        assert view.web_url == f"{base}/jobs/{JOB}" and f"Watch it live: {base}/jobs/{JOB}" in view.text()


def test_every_data_route_needs_a_token_or_a_session(web: tuple[str, str, str]) -> None:
    base, token, _code = web
    port = base.rsplit(":", 1)[1]
    with httpx2.Client(base_url=base, timeout=10, cookies={f"conclave_web_{port}": token}) as http:
        for path in ("/api/jobs", f"/api/jobs/{JOB}", f"/api/jobs/{JOB}/events", "/api/session"):
            refused = http.get(path)  # a cookie, even one holding the token, is no credential
            assert refused.status_code == 401, path
            assert "<b>42" not in refused.text and "alert(1)" not in refused.text and JOB not in refused.text
            assert http.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert http.get(path, headers={SESSION_HEADER: token}).status_code == 401
        for path in ("/", f"/jobs/{JOB}", "/login"):  # the pages are static: the script fetches the data
            page = http.get(path)
            assert page.status_code == 200 and "<b>42" not in page.text and "alert(1)" not in page.text
            csp = page.headers["content-security-policy"]
            assert "default-src 'self'" in csp and "unsafe-inline" not in csp and "script-src 'self'" in csp
        for path in (f"/api/jobs/{JOB}/cancel", "/api/sign-in/link", "/api/sign-out"):
            assert http.post(path, headers={"Origin": base}).status_code == 401, path
        assert http.get("/static/app.js").status_code == 200  # the assets are public: they hold no data


def test_a_one_time_code_names_its_caller_and_signs_in_once(web: tuple[str, str, str]) -> None:
    base, token, printed = web
    same = {"Origin": base}
    with httpx2.Client(base_url=base, timeout=10) as http:
        evil = {"Origin": "http://127.0.0.1:1"}
        for refused in ({}, evil):  # the page's own origin only
            assert http.post("/api/sign-in", json={"code": printed}, headers=refused).status_code == 403
        claimed = http.post("/api/sign-in", json={"code": printed}, headers=same)  # the page, as it loads
        assert claimed.status_code == 200 and claimed.json()["caller"] == "local"  # shown before it is used
        mine = claimed.json()["code"]
        dead = http.post("/api/sign-in", json={"code": printed, "confirm": True}, headers=same)
        assert dead.status_code == 401  # the link's code died as the page loaded: /proc shows a dead one
        signed = session_of(base, mine)  # the page's own code, when the user confirms
        assert http.get("/api/session", headers=signed).json() == {"caller": "local"}
        lines = http.get("/api/jobs", headers=signed).json()
        assert [line["job_id"] for line in lines] == [JOB]  # the local user sees every job
        again = http.post("/api/sign-in", json={"code": mine, "confirm": True}, headers=same)
        assert again.status_code == 401 and "conclave web --link" in again.json()["error"]  # used up
        wrong = http.post("/api/sign-in", json={"token": "not-the-token"}, headers=same)
        assert wrong.status_code == 401
        typed = http.post("/api/sign-in", json={"token": token}, headers=same)  # the form
        assert typed.status_code == 200 and typed.json()["caller"] == "local"
        assert http.post("/api/sign-in", content=b"token=" + token.encode(), headers=same).status_code == 400
        assert http.post("/api/sign-out", headers=signed).status_code == 200
        assert http.get("/api/jobs", headers=signed).status_code == 401  # signed out: the key is dead
        other = session_of(base, code_for(base, token))
        assert http.get("/api/jobs", headers=other).status_code == 200


def test_conclave_web_link_prints_a_new_code(web: tuple[str, str, str], home: Path) -> None:
    base, _token, printed = web
    env = {key: value for key, value in os.environ.items() if key != "CONCLAVE_HTTP_TOKEN"}
    done = subprocess.run(
        [sys.executable, "-m", "conclave", "web", "--link"],
        env={**env, "CONCLAVE_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    found = re.fullmatch(rf"{re.escape(base)}/login\?code=(\S+)\n", done.stdout)
    assert done.returncode == 0 and found, done
    assert found.group(1) != printed
    assert session_of(base, found.group(1))


def test_host_and_origin_are_checked(web: tuple[str, str, str]) -> None:
    base, token, _code = web
    auth = {"Authorization": f"Bearer {token}"}
    with httpx2.Client(base_url=base, timeout=10) as http:
        assert http.get("/api/jobs", headers=auth).status_code == 200
        assert http.get("/api/jobs", headers={**auth, "Host": "evil.example"}).status_code == 421
        assert http.get("/", headers={"Host": "evil.example"}).status_code == 421
        assert http.get("/api/jobs", headers={**auth, "Origin": "http://evil.example"}).status_code == 403
        port = base.rsplit(":", 1)[1]
        assert http.get("/api/jobs", headers={**auth, "Host": f"localhost:{port}"}).status_code == 200
        form = http.post("/api/sign-in", json={"token": token}, headers={"Origin": "http://evil.example"})
        assert form.status_code == 403


def test_cancel_needs_a_token_or_a_session_and_no_other_origin(web: tuple[str, str, str], home: Path) -> None:
    base, token, code = web
    auth = {"Authorization": f"Bearer {token}"}
    with httpx2.Client(base_url=base, timeout=10) as http:
        path = f"/api/jobs/{JOB}/cancel"
        assert http.post(path, headers={"Origin": base}).status_code == 401
        assert http.post(path, headers={**auth, "Origin": "http://evil.example"}).status_code == 403
        store = Store.of(Settings(home=home))
        try:
            assert store.job(JOB).cancel_requested is False  # type: ignore[union-attr]
            assert http.post(path, headers={**session_of(base, code), "Origin": base}).status_code == 202
            assert store.job(JOB).cancel_requested is True  # type: ignore[union-attr]  # the owner honours it
        finally:
            store.close()


def test_the_stream_sends_each_change_and_ends_with_the_job(web: tuple[str, str, str], home: Path) -> None:
    base, token, _code = web
    store = Store.of(Settings(home=home))
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
        AnswerEvent(letter="A", label="A1", revision=1, content="x", at=1),
        VoteEvent(letter="A", label="A1", reason="mine", at=2),
        ToolCallEvent(letter="B", name="read_file", at=2.5),
        AnswerEvent(letter="B", label="B1", revision=1, content="y", at=3),
        AnswerEvent(letter="C", label="C1", revision=1, content="z", at=4),
        SteeredEvent(note="prefer the short one", round=3, at=4.5),
        FinishedEvent(result=JobResult(winner="B1", consensus=True, reason="all voted"), at=5),
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
import json, sys, urllib.parse, urllib.request
# what the sign-in page's script does with the link: confirm its code, then read the job with the session
link = urllib.parse.urlsplit(sys.argv[1])
base = link.scheme + "://" + link.netloc
query = urllib.parse.parse_qs(link.query)
confirm = urllib.request.Request(
    base + "/api/sign-in", json.dumps({{"code": query["code"][0], "confirm": True}}).encode(),
    {{"Origin": base, "Content-Type": "application/json"}},
)
with urllib.request.urlopen(confirm) as answer:
    key = json.load(answer)["session"]
path = "/api/" + query["next"][0].lstrip("/")
read = urllib.request.Request(base + path, headers={{"X-Conclave-Session": key}})
with urllib.request.urlopen(read) as page:
    job_id = json.load(page)["view"]["job_id"]
    open({record!r}, "w").write(sys.argv[1] + "\\n" + job_id + "\\n" + str(page.status))
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
    monkeypatch.setattr(webbrowser, "_tryorder", None)  # it reads BROWSER once per process: read it again
    monkeypatch.setenv("CONCLAVE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv(KEY_ENV, "test-key")
    monkeypatch.delenv("CONCLAVE_HTTP_TOKEN", raising=False)
    assert main(["ask", "What is six times seven?", "--team", str(team), "--web", "--json"]) == 0
    captured = capsys.readouterr()
    view = JobView.model_validate(json.loads(captured.out))
    printed = re.search(r"Watch it live: (http://127\.0\.0\.1:\d+)/jobs/(cj-\w+)", captured.err)
    assert printed and printed.group(2) == view.job_id
    opened, landed, status = record.read_text().splitlines()
    assert opened.startswith(f"{printed.group(1)}/login?code=") and opened.endswith(
        f"&next=/jobs/{view.job_id}"
    )
    assert landed == view.job_id and status == "200"
    assert not (tmp_path / "state" / "web.json").exists()  # the page went with the command


@pytest.mark.anyio
async def test_a_page_carries_each_answers_check_and_output(home: Path) -> None:
    store = Store.of(Settings(home=home))
    agents = [AgentProgress(letter=x, model=f"openai/m-{x}", state="working") for x in "AB"]
    checks = {"A1": Check(status="failed", exit_code=1, duration_s=2.0, tail=["1 failed"])}
    store.record(
        JOB,
        CheckedEvent(
            letter="A", at=2.0, label="A1", check=checks["A1"], output="E   assert 1 == 2\n1 failed"
        ),
        Progress(phase="", agents=agents, checks=checks),
        None,
    )
    store.close()
    async with JobLookup.open(Settings(home=home), {}) as jobs:
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


def test_the_page_shows_the_tally_as_served_and_adds_no_votes_up() -> None:
    """The job page draws the tally by answer from JobView.by_answer, grouped once by the server (the
    browser test compares the two); it reads no per-answer tally or groups to add up itself."""
    code = (Path(__file__).resolve().parents[1] / "server" / "web" / "static" / "app.js").read_text()
    body = re.search(r"^function tally\(view\) \{\n(.*?)^\}", code, re.MULTILINE | re.DOTALL)
    assert body is not None, "app.js has no tally(view)"
    drawn = body.group(1)
    assert "view.by_answer" in drawn
    assert not re.search(r"\.tally\b|\bagree\b|reduce\(|\+=", drawn), drawn


def test_codes_and_sessions_expire_and_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sessions, "CODE_TTL_S", 0.05)  # a minute and 8 hours, made short to watch them end
    monkeypatch.setattr(sessions, "SESSION_TTL_S", 0.05)
    grants, alice = Sessions(), Caller("alice", digest("alice-token"))
    code = grants.code_for(alice)
    claimed = grants.claim(code)
    assert claimed is not None and claimed[1] == alice and grants.claim(code) is None  # swapped once
    time.sleep(0.1)  # sleep-ok: outlives the shortened lifetimes; nothing else runs to wait for
    assert grants.redeem(claimed[0]) is None  # the page's code expires too
    opened = grants.redeem(grants.code_for(alice))
    assert opened is not None and grants.caller_of(opened[0]) == alice
    time.sleep(0.1)  # sleep-ok: as above
    assert grants.caller_of(opened[0]) is None
    key = grants.open(alice)
    grants.revoke({Caller("alice", digest("alice-new-token"))})  # alice's token replaced: her session ends
    assert grants.caller_of(key) is None
