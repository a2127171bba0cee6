"""Operations: liveness, readiness, metrics."""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, FastAPI, Request
from starlette.responses import Response

from .errors import error_response
from .http import json_response
from .routes_envs import fingerprint_of

router = APIRouter(tags=["ops"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: 200 whenever the process answers."""
    return {"status": "ok"}


NOT_READY = "an environment this replica serves is not open yet (or any more)"


def catalog_fingerprint(app: FastAPI) -> str | None:
    """The data the app serves (``routes_envs.fingerprint_of``: WebShop alone, its catalog's fingerprint), or None
    while an environment it serves is not up (``/readyz`` and Serve's health check ask this one question)."""
    envs = getattr(app.state, "envs", None)
    if envs is None or any(env_id not in envs for env_id in app.state.settings.env_ids()):
        return None
    return fingerprint_of(envs)


@router.get("/readyz", responses={503: {"description": "an environment is not open"}})
async def readyz(request: Request) -> Response:
    """Readiness: 200 once every environment it serves is open (and until shutdown begins), else 503."""
    fingerprint = catalog_fingerprint(request.app)
    if fingerprint is None:
        return error_response(503, "not_ready", NOT_READY)
    return json_response({"status": "ready", "fingerprint": fingerprint})


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus text format (all workers of this replica in multiprocess mode)."""
    for runtime in (getattr(request.app.state, "envs", None) or {}).values():
        with contextlib.suppress(Exception):  # a session store that is down must not hide the metrics
            await runtime.sessions.sweep()
    body, content_type = request.app.state.metrics.render()
    return Response(body, media_type=content_type)
