"""The web view's routes: the pages, signing in and out, one job's snapshot, its event stream, and cancel.

    GET  /                        the list of jobs (static: the script fetches the data)
    GET  /jobs/<id>               one job's page (static)
    GET  /login[?code=&next=]     sign in: the form, or the confirmation of a one-time link (static)
    POST /api/sign-in             {"token"} or {"code", "confirm"}, and `next`: a session key and the
                                  page of this origin to go to (this origin only)
    POST /api/sign-in/link        a one-time sign-in code for the caller asking (`conclave web --link`)
    POST /api/sign-out            end this session
    GET  /api/session             who this session is
    GET  /api/jobs                the list, as JSON
    GET  /api/jobs/<id>           its JobPage, as JSON
    GET  /api/jobs/<id>/events    its JobPage on every change (SSE, read by the script with fetch)
    POST /api/jobs/<id>/cancel    cancel it
    GET  /static/<file>           app.js, style.css

Every /api/ route but sign-in passes `WebAuth.check` (auth.py: a bearer token or a session header);
request bodies are capped before this module sees them (body_limit.py).

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
from typing import Annotated

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from conclave.errors import InputError, JobNotFound
from conclave.jobs.lookup import JobLookup
from conclave.jobs.read.views import FINAL_STATES
from conclave.web.auth import SESSION_HEADER, Refused, WebAuth, landing
from conclave.web.sessions import CODE_TTL_S, SESSION_TTL_S, Caller
from conclave.web.snapshot import MAX_DIFF_CHARS, JobPage, job_page

EXPIRED_CODE = (
    "this sign-in link was used already or is over a minute old: get a new one with `conclave web --link`, "
    "or sign in with the token"
)
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


class SignIn(BaseModel):
    """POST /api/sign-in: the token typed into the form, or a one-time code (`confirm` false: swap the
    link's code for one only this page knows, and say whose it is, for the confirmation step; true: use
    it up for a session)."""

    model_config = ConfigDict(extra="forbid")

    token: Annotated[str | None, Field(max_length=1024)] = None
    code: Annotated[str | None, Field(max_length=256)] = None
    confirm: bool = False
    # the page asked for (/login?next=): answered as a URL of this origin only (auth.py `landing`)
    next: Annotated[str, Field(max_length=2048)] = "/"


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

    @staticmethod
    def refused(refused: Refused) -> Response:
        return JSONResponse({"error": refused.reason}, refused.status, headers=HEADERS)

    def guarded(
        self, handler: Callable[[Request, Caller], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """The route behind the one auth check (auth.py)."""

        async def route(request: Request) -> Response:
            try:
                caller = await self.auth.check(request)
                return await handler(request, caller)
            except Refused as refused:
                return self.refused(refused)

        return route

    def page(self, name: str) -> Callable[[Request], Awaitable[Response]]:
        """A static page: no job data in it, so only the Host (and Origin) check."""

        async def route(request: Request) -> Response:
            try:
                self.auth.check_origin(request)
            except Refused as refused:
                return self.refused(refused)
            return self.html(name)

        return route

    async def job_page(self, request: Request, caller: Caller) -> JobPage:
        """The job's page, if this caller may see it (else a 404: `refused_job`)."""
        job_id = request.path_params["job_id"]
        with refused_job(job_id):
            parts = await self.lookup.page(job_id, caller.name, MAX_DIFF_CHARS)
        return job_page(parts, str(request.url_for("job", job_id=parts.view.job_id)))

    # Routes ------------------------------------------------------------------------------------------------
    async def session(self, request: Request, caller: Caller) -> Response:
        return JSONResponse({"caller": caller.shown}, headers=HEADERS)

    async def sign_in(self, request: Request) -> Response:
        """A session for the token typed into the form or for a one-time code, to this origin's script only
        (a cross-site page could submit a form here, but never read the key it would get)."""
        try:
            self.auth.check_origin(request, required=True)
            origin = f"{request.url.scheme}://{request.headers.get('host', '')}"  # the Origin it checked
            try:
                asked = SignIn.model_validate_json(await request.body())
            except ValidationError:
                raise Refused(
                    400, 'send {"token": "..."} or {"code": "...", "confirm": true} as JSON'
                ) from None
            if asked.token is not None:
                caller = await self.auth.caller_of_token(asked.token)
                if caller is None:
                    raise Refused(401, "that is not this server's token")
                return self.signed_in(self.auth.sessions.open(caller), caller, landing(asked.next, origin))
            await self.auth.current()  # a code of a token the server no longer has is void
            if asked.code is None:
                raise Refused(400, 'send {"token": "..."} or {"code": "..."}')
            if not asked.confirm:  # the link's code for the page's own, and whose it is, to confirm
                claimed = self.auth.sessions.claim(asked.code)
                if claimed is None:
                    raise Refused(401, EXPIRED_CODE)
                return JSONResponse({"caller": claimed[1].shown, "code": claimed[0]}, headers=HEADERS)
            redeemed = self.auth.sessions.redeem(asked.code)
            if redeemed is None:
                raise Refused(401, EXPIRED_CODE)
            return self.signed_in(*redeemed, landing(asked.next, origin))
        except Refused as refused:
            return self.refused(refused)

    @staticmethod
    def signed_in(key: str, caller: Caller, then: str) -> Response:
        return JSONResponse(
            {"session": key, "caller": caller.shown, "expires_in": SESSION_TTL_S, "next": then},
            headers=HEADERS,
        )

    async def sign_in_link(self, request: Request, caller: Caller) -> Response:
        code = self.auth.sessions.code_for(caller)
        return JSONResponse({"code": code, "caller": caller.shown, "expires_in": CODE_TTL_S}, headers=HEADERS)

    async def sign_out(self, request: Request, caller: Caller) -> Response:
        key = request.headers.get(SESSION_HEADER)
        if key:
            self.auth.sessions.end(key)
        return JSONResponse({"signed_out": bool(key)}, headers=HEADERS)

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
            try:
                await self.auth.check(request)
            except Refused:
                yield "event: refused\ndata: {}\n\n"  # signed out, expired, or the token was removed
                return
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
            Route("/", self.page("index.html"), methods=["GET"], name="jobs_page"),
            Route("/jobs/{job_id}", self.page("job.html"), methods=["GET"], name="job"),
            Route("/login", self.page("login.html"), methods=["GET"], name="login"),
            Route("/static/{name}", self.asset, methods=["GET"], name="static"),
            Route("/api/sign-in", self.sign_in, methods=["POST"]),
            Route("/api/sign-in/link", self.guarded(self.sign_in_link), methods=["POST"]),
            Route("/api/sign-out", self.guarded(self.sign_out), methods=["POST"]),
            Route("/api/session", self.guarded(self.session), methods=["GET"]),
            Route("/api/jobs", self.guarded(self.jobs), methods=["GET"]),
            Route("/api/jobs/{job_id}", self.guarded(self.snapshot), methods=["GET"]),
            Route("/api/jobs/{job_id}/events", self.guarded(self.events), methods=["GET"]),
            Route("/api/jobs/{job_id}/cancel", self.guarded(self.cancel), methods=["POST"]),
        ]
