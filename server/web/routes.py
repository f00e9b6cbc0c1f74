"""The web view's routes: the pages, the login, one job's snapshot, its event stream, and cancel.

    GET  /                        the list of jobs
    GET  /jobs/<id>               one job's page
    GET  /login[?token=&next=]    sign in (sets the cookie)
    POST /login                   the same, from the form
    GET  /api/session             the CSRF value
    GET  /api/jobs                the list, as JSON
    GET  /api/jobs/<id>           its JobPage, as JSON
    GET  /api/jobs/<id>/events    its JobPage on every change (SSE)
    POST /api/jobs/<id>/cancel    cancel it (CSRF-checked)
    GET  /static/<file>           app.js, style.css

Every read goes through the lookup (jobs/lookup.py), with the caller's name: the job id checked, and a
caller's own jobs only. Live updates: the event stream compares the job's (rev, events, state) every
POLL_S seconds and sends the whole JobPage when it changed; the store is shared by every
Conclave process, so a job run by any server shows. The stream ends with `end` once the job is over
(completed, failed, cancelled or interrupted), after sending that final state.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import parse_qs

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from conclave.errors import InputError, JobNotFound
from conclave.jobs.lookup import JobLookup
from conclave.jobs.views import FINAL_STATES
from conclave.web.auth import Caller, Refused, WebAuth
from conclave.web.snapshot import MAX_DIFF_CHARS, JobPage, job_page

POLL_S = 0.25  # how often an open page's stream looks at the store
KEEP_ALIVE_S = 15.0
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
STATIC = {"app.js": "text/javascript", "style.css": "text/css"}
PAGES = ("index.html", "job.html", "login.html")


def _asset(name: str) -> bytes:
    return (importlib.resources.files("conclave.web") / "static" / name).read_bytes()


@contextmanager
def refused_job(job_id: str) -> Iterator[None]:
    """A 404 in the same words for a bad id, another caller's job and a job that is gone, so none tells
    whether the job exists."""
    try:
        yield
    except (InputError, JobNotFound):
        raise Refused(
            404,
            f"no job {job_id!r} here: job ids look like cj-1a2b3c4d5e6f, and finished jobs are pruned after "
            "a while (conclave gc)",
        ) from None


@dataclass
class WebView:
    """What the routes need: the jobs' lookup, the auth check, and the assets read once."""

    lookup: JobLookup
    auth: WebAuth

    def __post_init__(self) -> None:
        self._files = {name: _asset(name) for name in (*PAGES, *STATIC)}

    # Responses ---------------------------------------------------------------------------------------------
    def html(self, name: str, status: int = 200) -> Response:
        return Response(self._files[name], status, headers=HEADERS, media_type="text/html; charset=utf-8")

    def refused(self, request: Request, refused: Refused) -> Response:
        if request.url.path.startswith("/api/") or refused.status != 401:
            return JSONResponse({"error": refused.reason}, refused.status, headers=HEADERS)
        return self.html("login.html", 401)  # a page without the token: the sign-in form, and no job data

    def guarded(
        self, handler: Callable[[Request, Caller], Awaitable[Response]], *, write: bool = False
    ) -> Callable[[Request], Awaitable[Response]]:
        """The route behind the one auth check (auth.py)."""

        async def route(request: Request) -> Response:
            try:
                caller = self.auth.check(request, write=write)
                return await handler(request, caller)
            except Refused as refused:
                return self.refused(request, refused)

        return route

    async def job_page(self, request: Request, caller: Caller) -> JobPage:
        """The job's page, if this caller may see it (else a 404: `refused_job`)."""
        job_id = request.path_params["job_id"]
        with refused_job(job_id):
            parts = await self.lookup.page(job_id, caller.name, MAX_DIFF_CHARS)
        return job_page(parts, str(request.url_for("job", job_id=parts.view.job_id)))

    # Routes ------------------------------------------------------------------------------------------------
    async def index(self, request: Request, caller: Caller) -> Response:
        return self.html("index.html")

    async def job(self, request: Request, caller: Caller) -> Response:
        job_id = request.path_params["job_id"]
        with refused_job(job_id):
            await self.lookup.row(job_id, caller.name)
        return self.html("job.html")

    async def session(self, request: Request, caller: Caller) -> Response:
        return JSONResponse({"csrf": caller.csrf, "caller": caller.name or "local"}, headers=HEADERS)

    async def jobs(self, request: Request, caller: Caller) -> Response:
        lines = await self.lookup.lines(caller.name)
        return JSONResponse([line.model_dump(mode="json") for line in lines], headers=HEADERS)

    async def snapshot(self, request: Request, caller: Caller) -> Response:
        page = await self.job_page(request, caller)
        return Response(page.model_dump_json(), headers=HEADERS, media_type="application/json")

    async def events(self, request: Request, caller: Caller) -> Response:
        page = await self.job_page(request, caller)
        return StreamingResponse(
            self._stream(request, caller, page.view.job_id),
            headers={**HEADERS, "X-Accel-Buffering": "no"},
            media_type="text/event-stream",
        )

    async def _stream(self, request: Request, caller: Caller, job_id: str) -> AsyncIterator[str]:
        yield "retry: 2000\n\n"
        last: tuple[int, int, str] | None = None
        quiet = 0.0
        while True:
            now = await self.lookup.changes(job_id)
            if now is None:
                yield "event: gone\ndata: {}\n\n"
                return
            if now != last:
                try:
                    page = await self.job_page(request, caller)
                except Refused:
                    continue  # gone between the two reads: the next look says so
                yield f"event: job\ndata: {page.model_dump_json()}\n\n"
                last, quiet = now, 0.0
                if page.view.state in FINAL_STATES:
                    yield "event: end\ndata: {}\n\n"
                    return
            elif quiet >= KEEP_ALIVE_S:
                yield ": keep-alive\n\n"
                quiet = 0.0
            await anyio.sleep(POLL_S)
            quiet += POLL_S

    async def cancel(self, request: Request, caller: Caller) -> Response:
        job_id = request.path_params["job_id"]
        with refused_job(job_id):
            state = await self.lookup.request_cancel(job_id, caller.name)
        if state in FINAL_STATES:
            return JSONResponse({"state": state, "cancel": "the job is already over"}, headers=HEADERS)
        return JSONResponse({"state": state, "cancel": "requested"}, 202, headers=HEADERS)

    async def login(self, request: Request) -> Response:
        """Sign in with the token (a link's ?token= or the form): set the session cookie, go to `next`."""
        try:
            self.auth.check_origin(request, write=request.method == "POST")
        except Refused as refused:
            return self.refused(request, refused)
        if request.method == "POST":
            form = parse_qs((await request.body()).decode("utf-8", errors="replace"))
            token, target = form.get("token", [""])[0], form.get("next", ["/"])[0]
        else:
            token, target = request.query_params.get("token", ""), request.query_params.get("next", "/")
        if not token:
            return self.html("login.html")
        caller = self.auth.caller_of(token, None)
        if caller is None:
            return self.html("login.html", 401)
        if not target.startswith("/") or target.startswith("//") or "\\" in target:
            target = "/"  # only a path on this server: never a redirect elsewhere
        response = RedirectResponse(target, 303, headers=HEADERS)
        response.set_cookie(self.auth.cookie, caller.session, httponly=True, samesite="strict", path="/")
        return response

    async def asset(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return JSONResponse({"error": f"no static file {name!r}"}, 404, headers=HEADERS)
        return Response(
            self._files[name],
            headers={**HEADERS, "Cache-Control": "no-cache"},
            media_type=f"{STATIC[name]}; charset=utf-8",
        )

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/", self.guarded(self.index), methods=["GET"], name="jobs_page"),
            Route("/jobs/{job_id}", self.guarded(self.job), methods=["GET"], name="job"),
            Route("/login", self.login, methods=["GET", "POST"], name="login"),
            Route("/static/{name}", self.asset, methods=["GET"], name="static"),
            Route("/api/session", self.guarded(self.session), methods=["GET"]),
            Route("/api/jobs", self.guarded(self.jobs), methods=["GET"]),
            Route("/api/jobs/{job_id}", self.guarded(self.snapshot), methods=["GET"]),
            Route("/api/jobs/{job_id}/events", self.guarded(self.events), methods=["GET"]),
            Route("/api/jobs/{job_id}/cancel", self.guarded(self.cancel, write=True), methods=["POST"]),
        ]
