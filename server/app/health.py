"""The HTTP front's probes: `/healthz` (the process serves) and `/readyz` (it can take jobs: its store
and, if configured, its Docker engine answer; jobs/health.py). They need no token, say nothing about
jobs or callers, and answer JSON: 200 when live or ready, 503 with the reasons when not ready.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from conclave.jobs.service import JobService


def health_routes(service: JobService) -> list[Route]:
    """`/healthz` and `/readyz` for the HTTP app (app/server.py)."""

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> JSONResponse:
        ready = await service.readiness()
        return JSONResponse(ready.model_dump(), status_code=200 if ready.ready else 503)

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]
