"""The web view in a real headless Chromium, against `conclave serve --http` running a scripted job.

The job is ordered by gates (tests/fakes/script.py `Reply.gate`): ann's first answer comes at once and
the others wait until the test has seen what it wants on the page, so nothing here sleeps. The page is
loaded once and must follow the job without a reload (a marker set on `window` survives to the end).
Screenshots go to the test's folder; with CONCLAVE_WEB_SCREENSHOT=<file> the finished job's page is
saved there too (that is how docs/web-view.png is made).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import yaml
from fastmcp import Client

from conclave.backends.base import Usage
from conclave.jobs.read.views import JobView
from conclave.jobs.store.sql import Store
from conclave.settings import Settings
from tests.fakes.processes import http_server
from tests.fakes.script import RecordedRequest, Reply, Script
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_ENV, decide, is_presentation, vote_labels, write_team
from tests.web_browser import chromium, full_page_png, missing, text_of, until
from tests.web_sign_in import code_for

TOKEN = "web-test-token-0123456789"
MEMBERS = (("openai", "ann"), ("anthropic", "bob"), ("gemini", "cy"))
FIX = "Fixed add(): it subtracted instead of adding; calc.py now returns a + b.\nAnswer: return a + b"
SAME = (
    "Answer from cy: add() should add, not subtract.\nAnswer: return a + b"  # the same final answer as ann's
)
MARK = "Fixed add()"  # how the fakes find ann's answer among the labels they are shown
PRESENTED = (
    "add() in calc.py subtracted its arguments; the fix makes it return a + b. The two other answers "
    "found the same bug.\n<script>alert(1)</script>\nAnswer: return a + b"
)
MARKUP = (
    '<script>window.__pwned = 1; alert("xss")</script><img src=x onerror="window.__pwned = 2">'
    '<b id="bold">not bold</b> The bug: add() returns a - b.'
)
NEW_LINE = "return a + b  # </pre><script>window.__pwned = 3</script>"
LONG_PROMPT = "You fix bugs with care and say what you changed. " * 200  # over the fakes' 1,024 to cache

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))


class Gates:
    """What the test lets happen next."""

    def __init__(self) -> None:
        self.bob, self.cy, self.ann_again = threading.Event(), threading.Event(), threading.Event()
        self.ann_votes = 0

    def open_all(self) -> None:
        for gate in (self.bob, self.cy, self.ann_again):
            gate.set()


def label_with(request: RecordedRequest, needle: str) -> str | None:
    text = request.text()
    for label in vote_labels(request):
        if needle in text.split(f"## Answer {label}", 1)[-1].split("## Answer", 1)[0]:
            return label
    return None


def script_team(fakes: FakeProviders, gates: Gates) -> None:
    def ann(request: RecordedRequest) -> Reply:
        if is_presentation(request):
            return Reply(text=PRESENTED)
        mine = label_with(request, MARK)
        if mine is None:
            if "replaced 1 occurrence in calc.py" in request.text():
                return decide("new_answer", {"content": FIX}, request)
            return Reply(
                tool_calls=[
                    ("edit_file", {"path": "calc.py", "old_text": "return a - b", "new_text": NEW_LINE})
                ]
            )
        gates.ann_votes += 1
        reply = decide("vote", {"answer": mine, "reason": "my fix is tested"}, request)
        reply.gate = None if gates.ann_votes == 1 else gates.ann_again  # the first vote at once
        return reply

    def peer(gate: threading.Event, content: str) -> Any:
        def respond(request: RecordedRequest) -> Reply:
            if is_presentation(request):
                return Reply(text="FINAL (unexpected presenter)")
            if "(your own answer)" not in request.text():
                reply = decide("new_answer", {"content": content}, request)
                reply.gate = gate
                return reply
            fix = label_with(request, MARK)
            return decide(
                "vote",
                {"answer": fix or vote_labels(request)[0], "reason": "<i>the fix</i> is right"},
                request,
            )

        return respond

    fakes.script.set_default("ann", ann)
    fakes.script.set_default("bob", peer(gates.bob, MARKUP))
    fakes.script.set_default("cy", peer(gates.cy, SAME))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, FakeProviders, Gates, Path]]:
    gates = Gates()
    with FakeProviders(
        Script(prompt_cache=True)
    ) as fakes:  # ann's long prompt is cached after its first call
        script_team(fakes, gates)
        config = tmp_path / "config"
        team = write_team(config / "conclave" / "teams" / "web-trio.yaml", fakes, MEMBERS, name="web-trio")
        data = yaml.safe_load(team.read_text(encoding="utf-8"))
        data["agents"][0]["price"] = {"input": 2.0, "output": 8.0}  # ann's alone: the total is partial
        data["agents"][0]["system_prompt"] = LONG_PROMPT
        team.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        project = tmp_path / "proj"
        project.mkdir()
        (project / "calc.py").write_text("def add(a, b):\n    return a - b\n")
        env = {
            "CONCLAVE_HOME": str(tmp_path / "home"),
            "CONCLAVE_HTTP_TOKEN": TOKEN,
            "XDG_CONFIG_HOME": str(config),
            KEY_ENV: "test-key",
        }
        try:
            with http_server(tmp_path, env) as url:
                yield url.removesuffix("/mcp"), fakes, gates, project
        finally:
            gates.open_all()  # a failed test must not leave the fake's replies waiting


def ask(base: str, tool: str, arguments: dict[str, Any]) -> JobView:
    async def call() -> JobView:
        async with Client(f"{base}/mcp", auth=TOKEN) as client:
            result = await client.call_tool(tool, arguments)
            return JobView.model_validate(result.structured_content)

    return anyio.run(call)


def sign_in(driver: Any, base: str, job_id: str) -> None:
    """Open a one-time link to the job's page, as `conclave ask --web` does, and confirm it on the page."""
    driver.get(f"{base}/login?code={code_for(base, TOKEN)}&next=/jobs/{job_id}")
    until(driver, lambda d: d.find_element("id", "confirm").is_displayed(), what="the confirmation")
    assert text_of(driver, "#confirm-caller") == "http" and "code=" not in driver.current_url
    driver.find_element("id", "confirm-button").click()
    until(driver, lambda d: d.current_url == f"{base}/jobs/{job_id}", what="the job's page")


def column(driver: Any, agent: str) -> str:
    """The text of the agent's column (found by its model name, since letters are shuffled per job)."""
    return str(
        driver.execute_script(
            "for (const c of document.querySelectorAll('.agent')) if (c.textContent.includes(arguments[0]))"
            " return c.textContent; return ''",
            f"fake-{agent}",
        )
    )


def nothing_ran(driver: Any) -> None:
    """The model's markup is text on the page: no script of its ran, no element of its exists."""
    assert driver.execute_script("return window.__pwned") is None
    assert driver.execute_script("return document.scripts.length") == 1  # app.js alone
    assert driver.execute_script("return document.querySelectorAll('img, #bold, main script').length") == 0
    assert not [entry for entry in driver.get_log("browser") if "xss" in entry.get("message", "")]


def test_the_page_follows_a_job_live(served: tuple[str, FakeProviders, Gates, Path], tmp_path: Path) -> None:
    base, _fakes, gates, project = served
    view = ask(
        base,
        "ask_team",
        {
            "task": "Fix add() in calc.py",
            "team": "web-trio",
            "wait_seconds": 0,
            "context_paths": [{"path": str(project)}],
        },
    )
    assert view.web_url == f"{base}/jobs/{view.job_id}"  # the result says where to watch
    with chromium() as driver:
        sign_in(driver, base, view.job_id)
        assert driver.current_url == view.web_url  # the code left the address bar
        driver.execute_script("window.__loaded_once = true")

        # ann's first answer shows, with ann's vote for it; bob and cy are held at their gates
        until(
            driver,
            lambda d: MARK in column(d, "ann") and "votes for" in column(d, "ann"),
            what="ann's answer",
        )
        driver.save_screenshot(str(tmp_path / "1-first-answer.png"))
        assert "no answer yet" in column(driver, "bob")

        # bob's answer (markup) lands: ann's vote is cleared, and the markup is text
        gates.bob.set()
        until(driver, lambda d: "The bug: add() returns" in column(d, "bob"), what="bob's answer")
        until(driver, lambda d: "no vote" in column(d, "ann"), what="ann's vote cleared")
        assert "<script>window.__pwned = 1" in column(driver, "bob")
        assert "cleared" in text_of(driver, "#timeline") and "vote for" in text_of(driver, "#timeline")
        nothing_ran(driver)
        driver.save_screenshot(str(tmp_path / "2-votes-invalidated.png"))

        # cy answers, then the last vote (ann's) lands: the winner, the diff, the usage
        gates.cy.set()
        until(driver, lambda d: "Answer from cy" in column(d, "cy"), what="cy's answer")
        gates.ann_again.set()
        until(
            driver,
            lambda d: d.execute_script("return document.body.dataset.state") == "completed",
            what="the job's end",
        )
        assert driver.execute_script("return window.__loaded_once") is True  # no reload happened
        winner = text_of(driver, "[data-winner]")
        assert winner and winner[0] == column(driver, "ann").strip()[0]  # ann's label won
        assert "consensus" in text_of(driver, "#winner") and "3 of 3 votes" in text_of(driver, "#winner")
        cy_label = driver.execute_script(  # cy's answer has ann's final answer: the tally groups them
            "for (const c of document.querySelectorAll('.agent')) if (c.textContent.includes('fake-cy'))"
            " return c.querySelector('[data-label]').dataset.label"
        )
        groups = driver.execute_script(
            "return [...document.querySelectorAll('#tally [data-group]')].map(n => n.dataset.group)"
        )
        assert {winner, cy_label} in [set(group.split()) for group in groups], groups
        done = ask(base, "get_status", {"job_id": view.job_id})
        rows = driver.execute_script(  # the tally as the server grouped it, nothing added up in the page
            "return [...document.querySelectorAll('#tally [data-group]')]"
            ".map(n => [n.dataset.group, Number(n.dataset.votes)])"
        )
        assert rows == [[" ".join(group.labels), group.votes] for group in done.by_answer], rows
        assert text_of(driver, "#final") == done.answer == PRESENTED  # as text: its <script> ran nothing
        added = driver.execute_script(
            "return [...document.querySelectorAll('#diff .d-add')].map(n => n.textContent)"
        )
        assert any(NEW_LINE in line for line in added) and any(
            "-    return a - b" in text_of(driver, "#diff") for _ in [0]
        )
        usage = text_of(driver, "#usage")
        assert "fake-ann" in usage and "fake-bob" in usage and "fake-cy" in usage
        store = Store.of(Settings(home=tmp_path / "home"))
        stored = store.job(view.job_id)
        store.close()
        assert stored is not None and stored.progress is not None
        for (
            agent
        ) in stored.progress.agents:  # each agent's tokens as the job counted them (the fakes' replies)
            row = driver.execute_script(
                "for (const r of document.querySelectorAll('#usage tbody tr')) "
                "if (r.cells[0].textContent === arguments[0])"
                " return [...r.cells].map(c => c.textContent); return []",
                agent.letter,
            )
            assert row[1] == agent.model and agent.usage.input_tokens > 0
            assert [int(cell.replace(",", "")) for cell in row[2:6]] == [
                agent.usage.calls,
                agent.usage.input_tokens,
                agent.usage.cached_input_tokens,
                agent.usage.output_tokens,
            ]
            cost, estimated = agent.usage.cost_usd, agent.usage.estimated_input_tokens
            # a call cancelled before its provider said anything is charged an estimate, marked as such
            approx = "~" if estimated else ""
            assert row[6] == (f"{approx}${cost:.4f}" if cost is not None else "-")
            assert row[8] == (f"~{estimated:,}" if estimated else "-")
            assert (cost is not None) == agent.model.endswith("ann")
            # its part of the job's tokens, as get_status gives it (each member's spend is there too)
            shown = next(a for a in done.agents if a.letter == agent.letter)
            assert shown.usage == agent.usage and shown.token_share is not None
            assert row[7] == f"{round(shown.token_share * 100)}%"
            assert f"{agent.usage.cached_input_tokens:,} cached" in column(driver, agent.model.split("-")[-1])
        # the total: ann's cost, a lower bound (bob's and cy's tokens have none)
        total = sum((agent.usage for agent in stored.progress.agents), Usage())
        assert total.cost_partial and total.cost_usd is not None
        last = driver.execute_script(
            "return document.querySelector('#usage tbody tr.total').cells[6].textContent"
        )
        assert last == f"≥ {'~' if total.estimated else ''}${total.cost_usd:.4f} (partial)"
        assert sum(a.token_share or 0 for a in done.agents) == pytest.approx(1, abs=2e-3)
        ann = next(a for a in done.agents if a.model.endswith("ann"))
        assert ann.usage.cached_input_tokens >= 1024  # its later calls repeated its long prompt
        nothing_ran(driver)
        assert until(
            driver, lambda d: d.find_element("id", "live").text == "job over", what="the stream's end"
        )
        driver.save_screenshot(str(tmp_path / "3-completed.png"))
        png = full_page_png(driver)
        (tmp_path / "web-view.png").write_bytes(png)
        if target := os.environ.get("CONCLAVE_WEB_SCREENSHOT"):
            Path(target).write_bytes(png)


def test_the_page_cancels_a_job_and_shows_it(
    served: tuple[str, FakeProviders, Gates, Path], tmp_path: Path
) -> None:
    base, _fakes, _gates, project = served
    view = ask(
        base,
        "ask_team",
        {"task": "Say 42", "team": "web-trio", "wait_seconds": 0, "context_paths": [{"path": str(project)}]},
    )
    with chromium() as driver:
        sign_in(driver, base, view.job_id)
        until(
            driver, lambda d: MARK in column(d, "ann") or "votes for" in column(d, "ann"), what="ann's turn"
        )
        driver.find_element("id", "cancel").click()  # bob and cy are still held: the job is running
        until(
            driver,
            lambda d: d.execute_script("return document.body.dataset.state") == "cancelled",
            what="the cancelled state",
        )
        assert not driver.find_element("id", "cancel").is_displayed()
        driver.save_screenshot(str(tmp_path / "cancelled.png"))
    assert ask(base, "get_status", {"job_id": view.job_id}).state == "cancelled"


def test_a_page_without_a_session_shows_no_job_and_signing_out_ends_it(
    served: tuple[str, FakeProviders, Gates, Path],
) -> None:
    base, _fakes, _gates, project = served
    view = ask(
        base,
        "ask_team",
        {"task": "Say 42", "team": "web-trio", "wait_seconds": 0, "context_paths": [{"path": str(project)}]},
    )
    with chromium() as driver:
        driver.get(f"{base}/jobs/{view.job_id}")
        until(driver, lambda d: d.find_element("id", "token").is_displayed(), what="the sign-in form")
        assert "Say 42" not in driver.page_source and not driver.find_elements("css selector", ".agent")
        status = driver.execute_script(
            "return fetch(arguments[0]).then(r => r.status)", f"/api/jobs/{view.job_id}"
        )
        assert status == 401
        driver.get(f"{base}/login?code=not-a-code&next=/jobs/{view.job_id}")
        until(driver, lambda d: "used already" in text_of(d, "#problem"), what="the refused code")
        assert not driver.find_element("id", "confirm").is_displayed() and "Say 42" not in driver.page_source
        driver.find_element("id", "token").send_keys("wrong-token-0123456789")
        driver.find_element("css selector", "form button").click()
        until(driver, lambda d: "not this server's token" in text_of(d, "#problem"), what="the wrong token")
        driver.find_element("id", "token").clear()
        driver.find_element("id", "token").send_keys(TOKEN)  # the form signs in and goes on to the job
        driver.find_element("css selector", "form button").click()
        until(driver, lambda d: text_of(d, "#job-id") == view.job_id, what="the job after signing in")
        assert driver.get_cookies() == []  # the session is in this tab's sessionStorage, in no cookie
        key = driver.execute_script("return JSON.parse(sessionStorage.getItem('conclave-session')).key")
        assert "http" in text_of(driver, "#who")
        driver.find_element("id", "sign-out").click()
        until(
            driver, lambda d: d.find_element("id", "token").is_displayed(), what="the form after signing out"
        )
        assert driver.execute_script("return sessionStorage.getItem('conclave-session')") is None
    gone = httpx2.get(f"{base}/api/jobs", headers={"X-Conclave-Session": key}, timeout=10)
    assert gone.status_code == 401  # signing out ended the session on the server, not only in the tab
