"""The FastAPI application: ``create_app(settings=None)``.

uvicorn imports it as a factory (``webshop_env.api.app:create_app`` with ``factory=True``), so each worker
process builds its own app from the ``WEBSHOP_*`` environment and opens the prepared catalog once, at
startup (lifespan). The catalog is memory-mapped, so the workers and replicas on one host share its pages.
A catalog that cannot be opened stops the worker with the reason in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Iterator

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from ..catalog.store import open_catalog
from . import routes_compat, routes_envs, routes_native, routes_ops
from .errors import BodyLimitMiddleware, install_error_handlers
from .logs import configure_logging
from .metrics import Metrics, ObservabilityMiddleware, RequestRecorder
from .service import Runtime, package_version
from .settings import Settings

log = logging.getLogger("webshop_env.api")

DESCRIPTION = """\
WebShop text environment. The **native** protocol (`/v1/...`) is stateless: `reset` returns an opaque, signed
`state` token that the next `step` sends back, so any replica or worker can serve any step and retries are
safe. The **AgentGym** endpoints (`/create`, `/reset`, `/step`, ...) are a drop-in for `WebshopEnvClient`;
their sessions live in a shared store (Redis), so any replica serves them. Errors are JSON `{"error": kind, "detail": message}`.
"""


class WebShopApp(FastAPI):
    """FastAPI, with the fast paths (``routes_native.StepFastPath``, ``routes_envs.CompatFastPath``) in front of
    its middleware stack."""

    step_fast_path: routes_native.StepFastPath | None = None
    compat_fast_path: routes_envs.CompatFastPath | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        for fast_path in (self.step_fast_path, self.compat_fast_path):
            if fast_path is not None and fast_path.handles(scope):
                await fast_path.serve(self, scope, receive, send, super().__call__)
                return
        await super().__call__(scope, receive, send)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; raises ``SettingsError`` at once when the configuration cannot work (e.g. no secret)."""
    settings = settings or Settings()
    configure_logging(settings.log_level, settings.log_format)
    secret = settings.secret_bytes()
    metrics = Metrics()

    serves_webshop = "webshop" in settings.env_ids()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.envs = routes_envs.build_runtimes(
            settings, secret, metrics
        )  # TextCraft, BabyAI, SciWorld...
        if not serves_webshop:
            log.info("environments ready", extra={"fields": {"envs": settings.env_ids()}})
            sweeper = asyncio.create_task(_sweep_forever(app, sweep_interval_s(settings)))
            try:
                yield
            finally:
                await _shut_down(app, sweeper, metrics)
            return
        catalog = open_catalog(settings.catalog)
        catalog.index.warm_up()  # compiled search before the first request (and before /readyz says ready)
        app.state.runtime = Runtime(settings, catalog, secret, metrics)
        for name, goal_set in (("DEFAULT_GOAL_SET", settings.default_goal_set),
                               ("COMPAT_GOAL_SET", settings.compat_goal_set)):  # fmt: skip
            if goal_set not in catalog.goal_sets:
                log.warning(
                    f"WEBSHOP_{name}={goal_set!r} but this catalog has only {catalog.goal_sets}: requests that "
                    "rely on the default will get 404 unknown_goal; set the variable to one of those"
                )
        log.info(
            "catalog open",
            extra={"fields": {"catalog": str(settings.catalog), "fingerprint": catalog.fingerprint,
                              "products": catalog.product_count, "goal_sets": catalog.goal_sets}},
        )  # fmt: skip
        sweeper = asyncio.create_task(_sweep_forever(app, sweep_interval_s(settings)))
        try:
            with startup_objects_frozen():
                yield
        finally:
            await _shut_down(app, sweeper, metrics)

    app = WebShopApp(
        title="WebShop environment",
        version=package_version(),
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.runtime = None
    app.state.envs = None
    install_error_handlers(app)
    app.include_router(routes_ops.router)
    if serves_webshop:
        app.include_router(routes_native.router)
        app.include_router(routes_compat.router)
        # the same routes under /webshop, so every environment has a prefix of its own (an AgentGym client's
        # base URL is <balancer>/<env>); the root paths stay as they always were
        app.include_router(routes_native.router, prefix="/webshop")
        app.include_router(routes_compat.router, prefix="/webshop")
    routes_envs.include_env_routes(app, settings)
    recorder = RequestRecorder(
        metrics,
        log_requests=settings.access_log,
        log_every=settings.access_log_every,
        log_slow_s=settings.access_log_slow_ms / 1000.0,
    )
    app.add_middleware(
        BodyLimitMiddleware,  # type: ignore[arg-type]
        max_bytes=settings.max_body_bytes,
        on_reject=lambda kind: metrics.errors.labels(kind).inc(),
    )
    app.add_middleware(ObservabilityMiddleware, recorder=recorder)  # type: ignore[arg-type]
    app.step_fast_path = routes_native.StepFastPath(recorder, settings.max_body_bytes)
    app.compat_fast_path = routes_envs.CompatFastPath(
        recorder, settings.max_body_bytes, settings.env_ids(), metrics
    )
    _hot_routes_first(app, ("/v1/step", "/v1/step_batch", "/step"))
    return app


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


def _hot_routes_first(app: FastAPI, paths: tuple[str, ...]) -> None:
    """Move the step routes to the front of the routing table.

    Why: the router tries routes in order, one regex match each, until one matches; the step is nearly every
    request, and the docs and ops routes that come first cost a few µs per request. Paths do not overlap, so
    the order changes no routing decision (only the order of paths in the OpenAPI document).
    """
    routes = app.router.routes
    hot = [route for route in routes if getattr(route, "path", None) in paths]
    routes[:] = hot + [route for route in routes if route not in hot]


async def _shut_down(app: FastAPI, sweeper: asyncio.Task[None], metrics: Metrics) -> None:
    runtimes = _runtimes(app)
    app.state.runtime = None  # readyz answers 503 while the server drains
    app.state.envs = None
    sweeper.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sweeper
    for runtime in runtimes:
        await runtime.sessions.aclose()
        closer = getattr(getattr(runtime, "env", None), "shutdown", None)  # e.g. SciWorld's JVM pool
        if callable(closer):
            closer()
    metrics.process_exit()


def _runtimes(app: FastAPI) -> list:
    """WebShop's runtime and the other environments', whichever are up."""
    runtime = getattr(app.state, "runtime", None)
    return [r for r in (runtime, *(getattr(app.state, "envs", None) or {}).values()) if r is not None]


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
