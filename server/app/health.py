"""The HTTP front's probes: `/healthz` (the process serves) and `/readyz` (it can take jobs: its store
and, if configured, its Docker engine answer; jobs/upkeep/readiness.py). They need no token, say nothing about
jobs or callers, and answer JSON: 200 when live or ready, 503 with a coarse reason per part when not
ready: where a part is (the engine's address, a URL) and its error go to the server's log only.
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from conclave.jobs.service import JobService

logger = logging.getLogger(__name__)


def health_routes(service: JobService) -> list[Route]:
    """`/healthz` and `/readyz` for the HTTP app (app/server.py)."""

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    logged: list[str] = []  # the last errors logged: a probe every few seconds logs each change once

    async def readyz(request: Request) -> JSONResponse:
        ready = await service.readiness()
        if ready.errors != logged:
            logged[:] = ready.errors
            for error in ready.errors:
                logger.warning("not ready: %s", error)
        return JSONResponse(ready.public().model_dump(), status_code=200 if ready.ready else 503)

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]
