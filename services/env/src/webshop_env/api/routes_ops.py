"""Operations: liveness, readiness, metrics."""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, FastAPI, Request
from starlette.responses import Response

from .errors import error_response
from .routes_envs import fingerprint_of
from .routes_native import json_response

router = APIRouter(tags=["ops"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: 200 whenever the process answers."""
    return {"status": "ok"}


NOT_READY = "the catalog (or another enabled environment) is not open yet (or any more)"


def catalog_fingerprint(app: FastAPI) -> str | None:
    """The open catalog's fingerprint (with the other environments' data, where enabled), or None while the
    app is not ready (``/readyz`` and Serve's health check ask this one question)."""
    settings = app.state.settings
    wanted = settings.env_ids()
    envs = getattr(app.state, "envs", None)
    others = [env_id for env_id in wanted if env_id != "webshop"]
    if others and (envs is None or any(env_id not in envs for env_id in others)):
        return None
    runtime = getattr(app.state, "runtime", None)
    if "webshop" in wanted:
        if runtime is None:
            return None
        return (
            runtime.catalog.fingerprint
            if not others
            else f"{runtime.catalog.fingerprint}+{fingerprint_of(envs)}"
        )
    return fingerprint_of(envs)


@router.get("/readyz", responses={503: {"description": "catalog not open"}})
async def readyz(request: Request) -> Response:
    """Readiness: 200 once the catalog is open (and until shutdown begins), else 503."""
    fingerprint = catalog_fingerprint(request.app)
    if fingerprint is None:
        return error_response(503, "not_ready", NOT_READY)
    return json_response({"status": "ready", "fingerprint": fingerprint})


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus text format (all workers of this replica in multiprocess mode)."""
    runtimes = [
        getattr(request.app.state, "runtime", None),
        *(getattr(request.app.state, "envs", None) or {}).values(),
    ]
    for runtime in runtimes:
        if runtime is not None:
            with contextlib.suppress(Exception):  # a session store that is down must not hide the metrics
                await runtime.sessions.sweep()
    body, content_type = request.app.state.metrics.render()
    return Response(body, media_type=content_type)
