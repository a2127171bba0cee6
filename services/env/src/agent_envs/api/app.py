"""The FastAPI application: ``create_app(settings=None)``.

uvicorn imports it as a factory (``agent_envs.api.app:create_app`` with ``factory=True``), so each worker
process builds its own app from the ``AGENTRL_*`` environment. The app serves the environments of
``AGENTRL_ENVS``, each through its HTTP side (``routes_envs.HttpSide``: the contract's routes, or a protocol of
the environment's own, as its registration says), mounted at its prefixes; it builds their runtimes once, at
startup (lifespan): cores, data (WebShop's prepared catalog, memory-mapped, so the workers and replicas on one host
share its pages) and session stores. An environment that cannot be opened stops the worker with the reason in the
log. Nothing here knows any environment by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Iterator

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from ..envs import registry
from . import routes_envs, routes_openenv, routes_ops
from .errors import BodyLimitMiddleware, install_error_handlers
from .http import package_version
from .logs import configure_logging
from .metrics import Metrics, ObservabilityMiddleware, RequestRecorder
from .settings import Settings

log = logging.getLogger("agent_envs.api")

DESCRIPTION = """\
Text environments for agents (WebShop, TextCraft, BabyAI, SciWorld and any registered one), each under `/<env>`
(WebShop's routes also at the root). The **native** protocol (`/<env>/v1/...`) is stateless: `reset` returns an
opaque, signed `state` token that the next `step` sends back, so any replica or worker can serve any step and
retries are safe. The **AgentGym** endpoints (`/<env>/create`, `/<env>/reset`, `/<env>/step`, ...) are a drop-in for
AgentGym's clients; their sessions live in a shared store (Redis), so any replica serves them. Errors are JSON
`{"error": kind, "detail": message}`.
"""


class EnvServiceApp(FastAPI):
    """FastAPI, with the environments' fast paths (``routes_envs.FastPath``: POST routes answered in front of the
    middleware stack) looked up by path before anything else."""

    fast_paths: dict[str, routes_envs.FastPath] = {}  # noqa: RUF012  (set once per app by create_app)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            fast_path = self.fast_paths.get(scope["path"])
            if fast_path is not None:
                await fast_path.serve(self, scope, receive, send, super().__call__)
                return
        await super().__call__(scope, receive, send)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; raises ``SettingsError`` at once when the configuration cannot work (e.g. no secret)."""
    settings = settings or Settings()
    configure_logging(settings.log_level, settings.log_format)
    secret = settings.secret_bytes()
    metrics = Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        open_runtimes(app, secret)
        log.info("environments ready", extra={"fields": {"envs": settings.env_ids()}})
        sweeper = asyncio.create_task(_sweep_forever(app, sweep_interval_s(settings)))
        try:
            with startup_objects_frozen():
                yield
        finally:
            await _shut_down(app, sweeper, metrics)

    app = EnvServiceApp(
        title="Text environments (WebShop, TextCraft, BabyAI, SciWorld, ...)",
        version=package_version(),
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.envs = None
    install_error_handlers(app)
    app.include_router(routes_ops.router)
    recorder = RequestRecorder(
        metrics,
        log_requests=settings.access_log,
        log_every=settings.access_log_every,
        log_slow_s=settings.access_log_slow_ms / 1000.0,
    )
    app.fast_paths = routes_envs.include_env_routes(app, settings, recorder, metrics)
    routes_openenv.include_openenv_routes(app, settings)  # OpenEnv's protocol of each: /<env>/openenv
    app.add_middleware(
        BodyLimitMiddleware,  # type: ignore[arg-type]
        max_bytes=settings.max_body_bytes,
        on_reject=lambda kind: metrics.errors.labels(kind).inc(),
    )
    app.add_middleware(ObservabilityMiddleware, recorder=recorder)  # type: ignore[arg-type]
    return app


def open_runtimes(app: FastAPI, secret: bytes | None = None) -> None:
    """Build every served environment's runtime (cores, catalogs, session stores): what the app's lifespan does
    at startup, for a caller that serves the app without running its lifespan (an in-process ASGI transport)."""
    settings: Settings = app.state.settings
    app.state.envs = routes_envs.build_runtimes(
        settings, secret if secret is not None else settings.secret_bytes(), app.state.metrics
    )


GC_YOUNG_THRESHOLD = 10_000  # allocations (less deallocations) between young collections; CPython's is 700


@contextlib.contextmanager
def startup_objects_frozen() -> Iterator[None]:
    """Keep the cyclic garbage collector off what startup built, and run its young collections less often.

    Why: a step makes hundreds of short-lived containers and adds a few to the worker's caches; with CPython's
    defaults a young collection ran every few steps and every so often a full one walked the ~150k objects of
    the app, the libraries and the caches: about a tenth of a new search's cost in a replica. The modules,
    the app and the opened catalog live as long as the worker, so they move to the permanent generation
    (``gc.freeze``); a step creates no reference cycles of its own, so rarer young collections hold back
    little memory. Reference counting still frees everything else at once. On exit (shutdown) the collector
    is as before, so an app built again in the same process (tests) starts from the same state.
    """
    gc.collect()
    gc.freeze()
    before = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


async def _shut_down(app: FastAPI, sweeper: asyncio.Task[None], metrics: Metrics) -> None:
    runtimes = _runtimes(app)
    app.state.envs = None  # readyz answers 503 while the server drains
    sweeper.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sweeper
    for runtime in runtimes:
        await runtime.sessions.aclose()
        await routes_openenv.aclose(runtime)
        registry.shut_down(
            runtime.env
        )  # e.g. SciWorld's JVM pool; a later app in this process makes a new one
    metrics.process_exit()


def _runtimes(app: FastAPI) -> list[routes_envs.EnvRuntime]:
    """The served environments' runtimes, once they are up."""
    return list((getattr(app.state, "envs", None) or {}).values())


def sweep_interval_s(settings: Settings) -> float:
    """How often idle sessions are swept: half their TTL, at most 30 s (no TTL: every 30 s, finding nothing)."""
    ttl = settings.compat_idle_ttl_s
    return min(ttl / 2, 30.0) if ttl > 0 else 30.0


async def _sweep_forever(app: FastAPI, interval: float) -> None:
    """Expire idle AgentGym sessions even when no request comes (keeps the gauge and memory honest)."""
    while True:
        await asyncio.sleep(interval)
        for runtime in _runtimes(app):
            with contextlib.suppress(Exception):  # a store that is down is reported by the requests
                await runtime.sessions.sweep()
