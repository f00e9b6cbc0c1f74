"""get_status off the event loop: a view is read in a reader thread, beside a write that waits for the
database lock, and a job's page link follows web.json as `conclave web` starts, restarts and stops."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import anyio
import pytest
from fastmcp import Client

from conclave.app.server import create_app
from conclave.jobs.read import web_link
from conclave.jobs.read.web_link import WebLinks, WebServed, announce, withdraw
from conclave.jobs.service import JobService
from conclave.jobs.store.sql import Store
from conclave.settings import Settings
from tests.fakes.environment import environment_of
from tests.fakes.new_jobs import new_job

pytestmark = pytest.mark.anyio
JOB = "cj-0123456789ab"
GONE_PID = 2**22 + 12345  # above Linux's pid_max default: no such process


def served(url: str, pid: int | None = None) -> WebServed:
    return WebServed(url=url, pid=os.getpid() if pid is None else pid, token="t" * 32)


def age(path: Path) -> None:
    """Make the file look written a minute ago (older than the racy window of jobs/read/web_link.py)."""
    old = path.stat().st_mtime - 60
    os.utime(path, (old, old))


def test_a_page_link_follows_web_json(tmp_path: Path) -> None:
    links = WebLinks(tmp_path)
    assert links.page_url(JOB) is None  # no web view
    announce(tmp_path, served("http://127.0.0.1:8001"))
    assert links.page_url(JOB) == f"http://127.0.0.1:8001/jobs/{JOB}"
    announce(tmp_path, served("http://127.0.0.1:8002"))  # restarted at once on another port, the same size
    assert links.page_url(JOB) == f"http://127.0.0.1:8002/jobs/{JOB}"
    age(tmp_path / "web.json")
    assert links.page_url(JOB) == f"http://127.0.0.1:8002/jobs/{JOB}"
    announce(tmp_path, served("http://127.0.0.1:8003"))
    age(tmp_path / "web.json")  # an old-looking rewrite: its other timestamps moved
    assert links.page_url(JOB) == f"http://127.0.0.1:8003/jobs/{JOB}"
    withdraw(tmp_path, os.getpid())
    assert links.page_url(JOB) is None
    announce(tmp_path, served("http://127.0.0.1:8004", pid=GONE_PID))  # left by a process that is gone
    assert links.page_url(JOB) is None
    links.base = "http://127.0.0.1:9000"  # this server serves the pages itself (serve --http)
    assert links.page_url(JOB) == f"http://127.0.0.1:9000/jobs/{JOB}"


def test_an_unchanged_web_json_is_parsed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    announce(tmp_path, served("http://127.0.0.1:8001"))
    age(tmp_path / "web.json")
    parsed: list[Path] = []
    real = web_link._parsed

    def counted(home: Path) -> WebServed | None:
        parsed.append(home)
        return real(home)

    monkeypatch.setattr(web_link, "_parsed", counted)
    links = WebLinks(tmp_path)
    urls = {links.page_url(f"cj-00000000000{n}") for n in range(5)}
    assert len(urls) == 5 and len(parsed) == 1


async def test_get_status_answers_while_a_write_waits_for_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(home=tmp_path / "state")
    store = Store.of(settings)
    store.create_job(new_job(JOB, "task"), os.getpid(), "another-server")  # a live owner: left alone
    store.close()
    announce(settings.home, served("http://127.0.0.1:8001"))
    loop_thread = threading.get_ident()
    page_threads: list[int] = []
    real = WebLinks.page_url

    def page_url(self: WebLinks, job_id: str) -> str | None:
        page_threads.append(threading.get_ident())
        return real(self, job_id)

    monkeypatch.setattr(WebLinks, "page_url", page_url)
    other = Store.of(settings)  # another process's store, on the same database
    held = other.transaction()
    holding = False
    wrote = anyio.Event()
    try:
        async with (
            JobService.serve(environment_of(settings, {})) as service,
            Client(create_app(service, settings)) as client,
        ):
            held.__enter__()  # another process in the middle of a write
            holding = True

            async def write() -> None:
                await service.store.request_cancel(JOB)  # waits in the writer's thread for the lock
                wrote.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(write)
                # under the writer's busy timeout (10 s, jobs/store/connections.py): a view that waited for
                # the pending write would fail here
                with anyio.fail_after(9):
                    view = await service.lookup.view(JOB)
                    status = await client.call_tool("get_status", {"job_id": JOB})
                assert not wrote.is_set()  # the write is still waiting: nothing above waited for it
                assert view.state == "queued" and view.web_url == f"http://127.0.0.1:8001/jobs/{JOB}"
                assert status.structured_content is not None and status.structured_content["job_id"] == JOB
                held.__exit__(None, None, None)
                holding = False
            assert page_threads and loop_thread not in page_threads  # web.json is looked at off the loop
    finally:
        if holding:
            held.__exit__(None, None, None)
        other.close()
