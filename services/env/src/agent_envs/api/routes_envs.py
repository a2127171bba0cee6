"""Every served environment's HTTP side, mounted by one piece of code; and the contract's own routes.

Each environment of ``AGENTRL_ENVS`` is served by an HTTP side (``HttpSide``: its runtime in a worker, its routes
at each of its prefixes, its fast paths): the one its registration names (``Registration.http``: WebShop's own
protocol), else ``GENERIC``, which serves two protocols over the environment's pure core
(``envs.contract.TextEnv``):

- **native** (stateless): ``POST /<env>/v1/reset {"task"}`` and ``POST /<env>/v1/step {"state", "action"}``
  answer ``{observation, reward, done, state, info}``; ``state`` is the episode's JSON state signed into a token
  (``TokenCodec`` bound to the environment's id and data fingerprint), so any replica serves any step.
  ``GET /<env>/v1/info``, ``GET /<env>/v1/tasks/{task}/expert``; ``POST /<env>/v1/close`` where the environment
  holds simulators (SciWorld) and can free one at once.
- **AgentGym** (a drop-in for AgentGym's client of that environment): the routes the environment package lists
  (``AGENTGYM_ROUTES``), mounted as they are under the prefix: the base URL an AgentGym client is given is
  ``<balancer>/<env>``. Sessions (JSON, signed like native states) live in the shared session store under a
  key prefix of their own, so any replica serves them and a store restart keeps them.

Request fields are validated by pydantic models built from each route's declared fields (as AgentGym's own
server does with its models), so missing or mistyped fields get 422 with our JSON error shape; strings are held
to the same 2,048-character cap as every other route's, and integers to a signed 64 bits (``out_of_range``).
``/create``, ``/reset``, ``/step`` and ``/close`` are exactly once: the answer is recorded with the session's new
state under the request's key, so a request the balancer re-sends after its replica died is answered once
(``compat_sessions``). The cores are synchronous: a core that waits on another process (SciWorld's JVMs,
``blocking = True``) runs in the thread pool, the others inline (``EnvRuntime.call``).
"""

# no `from __future__ import annotations`: FastAPI reads the handlers' annotations, built per route at run time

import contextlib
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Annotated, Any, Protocol, TypeVar

from fastapi import APIRouter, Body, FastAPI, Path, Query, Request
from pydantic import BaseModel, Field, ValidationError, field_validator
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..envs import registry
from ..envs.agentgym import JsonInt, out_of_range, request_model
from ..envs.contract import DELETE, KEEP, CompatCall, CompatRoute, TextEnv, Transition
from .compat_sessions import (
    MAX_ID,
    AlreadyAnswered,
    Answer,
    IdTaken,
    SessionConflict,
    UnknownSession,
    request_key,
    session_store,
)
from .errors import ApiError, json_bytes, known_error_response, replay
from .http import (
    ERRORS,
    MAX_ACTION_CHARS,
    client_address,
    content_length,
    forwarded_client,
    header_key,
    json_object,
    json_response,
    key_header,
    read_body,
    send_json,
    utf8_text,
)
from .metrics import Metrics
from .settings import Settings
from .tokens import TokenCodec

log = logging.getLogger("agent_envs.api")
T = TypeVar("T")
CREATE_ATTEMPTS = 8  # ids are drawn at random: a live one comes up again with odds of one in millions


class EnvRuntime:
    """One environment's service state in one worker: its core, its token codec, its AgentGym sessions.

    The token is bound to the core's ``token_binding()`` where it has one, else to ``<env_id>:<fingerprint()>``;
    its state travels as the core's ``state_to_json(state)`` (``state_from_json`` back), else as it is (JSON).
    ``session_prefix`` and ``on_sessions_change`` are the store's key prefix and a gauge of the live sessions,
    for an environment whose HTTP side keeps its own (WebShop's, as they always were).
    """

    def __init__(
        self,
        env_id: str,
        env: TextEnv,
        settings: Settings,
        secret: bytes,
        metrics: Metrics,
        *,
        session_prefix: str | None = None,
        on_sessions_change: Callable[[int], None] | None = None,
    ) -> None:
        self.env_id = env_id
        self.env = env
        self.settings = settings
        binding = getattr(env, "token_binding", None)
        self.fingerprint = binding() if callable(binding) else f"{env_id}:{env.fingerprint()}"
        self.codec = TokenCodec(
            secret, self.fingerprint, getattr(env, "state_to_json", _as_it_is),
            getattr(env, "state_from_json", _as_it_is), data_name=getattr(env, "data_name", f"{env_id} data set"),
        )  # fmt: skip
        self.metrics = metrics
        self.sessions = session_store(
            settings, self.codec.encode, self.codec.decode, on_sessions_change,
            lambda reason, count: metrics.compat_evictions.labels(reason).inc(count),
            name=env_id, prefix=session_prefix or f"agentgym:{env_id}:",
        )  # fmt: skip
        # A core whose calls wait on something outside this process (SciWorld's JVMs) runs in the thread pool,
        # so the event loop serves other requests meanwhile; the others run inline: their calls are Python work
        # under the GIL, where a thread-pool hop adds its own cost (two thread switches) and frees nothing.
        self.blocking = bool(getattr(env, "blocking", False))

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)``: inline, or in the thread pool for a blocking core."""
        if self.blocking:
            return await run_in_threadpool(function, *args)
        return function(*args)

    async def reset(self, task: int) -> Transition:
        return await self.call(self.env.reset, task)

    async def step(self, state: Any, action: str, api: str) -> Transition:
        result = await self.call(self.env.step, state, action)
        self.metrics.env_steps.labels(self.env_id, api).inc()
        return result

    def payload(self, result: Transition) -> dict[str, Any]:
        return {
            "observation": result.observation,
            "reward": result.reward,
            "done": result.done,
            "state": self.codec.encode(result.state),
            "info": dict(result.info),
        }


def _as_it_is(value: Any) -> Any:
    """A JSON state travels as it is."""
    return value


def build_runtimes(settings: Settings, secret: bytes, metrics: Metrics) -> dict[str, EnvRuntime]:
    """Every served environment's runtime (each core built once per worker, by its HTTP side)."""
    return {
        env_id: http_side(env_id).runtime(env_id, settings, secret, metrics) for env_id in settings.env_ids()
    }


def fingerprint_of(runtimes: dict[str, EnvRuntime]) -> str:
    """The data this worker serves: one environment's token binding, or a hash of several environments'."""
    if len(runtimes) == 1:
        return next(iter(runtimes.values())).fingerprint
    return hashlib.sha256("\n".join(sorted(r.fingerprint for r in runtimes.values())).encode()).hexdigest()


def runtime_for(request: Request, env_id: str) -> EnvRuntime:
    runtimes = getattr(request.app.state, "envs", None)
    if not runtimes or env_id not in runtimes:
        raise ApiError(
            503, "not_ready", f"the {env_id} environment is not ready yet (or any more); retry shortly"
        )
    return runtimes[env_id]


# ---- native protocol -------------------------------------------------------------------------------------
class EnvResetRequest(BaseModel):
    task: JsonInt = Field(ge=0, description="the task index (GET /<env>/v1/info says how many)")


class EnvStepRequest(BaseModel):
    state: str = Field(max_length=64 * 1024, description="the `state` of the previous response, unchanged")
    action: str = Field(max_length=MAX_ACTION_CHARS)

    _check_action = field_validator("action")(utf8_text)


class EnvCloseRequest(BaseModel):
    state: str = Field(max_length=64 * 1024)


class EnvStepResponse(BaseModel):
    observation: str
    reward: float
    done: bool
    state: str = Field(description="opaque signed token: send it with the next step")
    info: dict[str, Any]


def native_router(env_id: str, prefix: str) -> APIRouter:
    """The native protocol's routes of ``env_id`` under ``<prefix>/v1``."""
    router = APIRouter(prefix=f"{prefix}/v1", tags=[env_id])
    env = registry.package(env_id)

    @router.post(
        "/reset", response_model=EnvStepResponse, responses=ERRORS, summary=f"start a {env_id} episode"
    )
    async def reset(request: Request, body: EnvResetRequest) -> Response:
        runtime = runtime_for(request, env_id)
        return json_response(runtime.payload(await runtime.reset(body.task)))

    @router.post("/step", response_model=EnvStepResponse, responses=ERRORS, summary=f"one {env_id} action")
    async def step(request: Request, body: EnvStepRequest) -> Response:
        runtime = runtime_for(request, env_id)
        state = runtime.codec.decode(body.state)
        return json_response(runtime.payload(await runtime.step(state, body.action, "native")))

    @router.get("/info", responses=ERRORS, summary=f"what this replica serves for {env_id}")
    async def info(request: Request) -> Response:
        runtime = runtime_for(request, env_id)
        info = {"env": env_id, "tasks": runtime.env.task_count(), "fingerprint": runtime.fingerprint,
                "state_travel": runtime.env.state_travel, "doc": (env.__doc__ or "").strip().split("\n")[0]}  # fmt: skip
        stats = getattr(runtime.env, "stats", None)
        if callable(stats):  # this process's simulators (SciWorld's JVM pool: live episodes, replays)
            info["simulators"] = stats()
        return json_response(info)

    @router.get("/tasks/{task}/expert", responses=ERRORS, summary=f"an expert's actions for a {env_id} task")
    async def expert(request: Request, task: Annotated[int, Path(ge=0, le=MAX_ID)]) -> Response:
        runtime = runtime_for(request, env_id)
        actions = await run_in_threadpool(runtime.env.expert, task)
        if actions is None:
            raise ApiError(404, "no_expert", f"{env_id} has no expert for task {task}")
        return json_response({"task": task, "actions": list(actions)})

    @router.post(
        "/close",
        responses=ERRORS,
        summary="free the simulator this episode holds (environments that hold one)",
    )
    async def close(request: Request, body: EnvCloseRequest) -> Response:
        runtime = runtime_for(request, env_id)
        state = runtime.codec.decode(body.state)
        closer = getattr(runtime.env, "close", None)
        freed = bool(await run_in_threadpool(closer, state)) if callable(closer) else False
        return json_response({"closed": freed})

    return router


# ---- AgentGym-compatible routes --------------------------------------------------------------------------
def compat_router(env_id: str, prefix: str) -> APIRouter:
    """The routes of AgentGym's server for ``env_id`` (the package's ``AGENTGYM_ROUTES``) under ``prefix``."""
    router = APIRouter(prefix=prefix, tags=[f"{env_id} (AgentGym)"])
    for route in registry.agentgym_routes(env_id):
        _add_compat_route(router, env_id, prefix, route)
    return router


async def compat_answer(
    runtime: EnvRuntime, route: CompatRoute, path: str, args: dict[str, Any], header: str | None, client: str
) -> Answer:
    """The answer to one AgentGym request whose fields (``args``, ``id`` among them) passed the route's model:
    the route's and the fast path's (``CompatFastPath``). ``header``: the request's key header (``key_header``),
    ``client``: the client's address. A state-changing request (a POST) is exactly once: a retry of one that was
    applied already gets the recorded answer (``compat_sessions``)."""
    env_idx = args.pop("id", 0)
    refused = out_of_range(args)
    if refused is not None:
        return Answer(refused.status, json_bytes(refused.body))
    changes = route.method == "POST"  # /create, /reset, /step, /close
    key = request_key(header, path, {"id": env_idx, **args}) if changes else None
    try:
        if route.creates:
            return await _create(runtime, route, args, key, client)
        # A change may start from this process's copy of the session (one store call instead of two); a core with
        # a simulator of its own does not, since a stale copy would make it work for nothing (SciWorld's JVM).
        cached = changes and not runtime.blocking
        while True:
            sent, fresh = await _apply(runtime, route, env_idx, args, key, cached)
            if fresh:
                break
            cached = False  # the copy was stale (another process changed the session): read the store, again
    except AlreadyAnswered as retried:
        return retried.answer
    if route.path == "/step":
        runtime.metrics.env_steps.labels(runtime.env_id, "compat").inc()
    return sent


async def _apply(
    runtime: EnvRuntime, route: CompatRoute, env_idx: int, args: dict[str, Any], key: str | None, cached: bool
) -> tuple[Answer, bool]:
    """Read the session, answer, store the change: (the answer, whether it holds). It does not hold when it was
    computed from a cached copy of the session that turned out stale (the change did not apply, or nothing
    checked the copy: an answer that changes nothing, a close that found no session)."""
    session, version = None, None
    if route.needs_id and 0 <= env_idx <= MAX_ID:
        # unknown: the original's own "not valid" answer comes from the handler
        with contextlib.suppress(UnknownSession):
            session, version = await runtime.sessions.get(
                env_idx, key, touch=route.method == "GET", cached=cached
            )
    from_copy = version is not None and version.cached
    answer = await runtime.call(route.handler, CompatCall(runtime.env, env_idx, session, args))
    sent = Answer(answer.status, json_bytes(answer.body))
    try:
        if answer.session is DELETE:
            closed = await runtime.sessions.close(env_idx, key, sent)
            return sent, closed or not from_copy
        if answer.session is not KEEP and version is not None:
            await runtime.sessions.put(env_idx, answer.session, version, key, sent)
            return sent, True
    except (SessionConflict, UnknownSession):
        if not from_copy:
            raise
        return sent, False
    return sent, not from_copy


async def _create(
    runtime: EnvRuntime, route: CompatRoute, args: dict[str, Any], key: str | None, client: str
) -> Answer:
    """A new session: the handler answers for a freshly drawn id, and the store creates the session with that
    answer in one step (a retried create gets the first one's answer, and makes no second session)."""
    for _ in range(CREATE_ATTEMPTS):
        env_idx = runtime.sessions.new_id()
        answer = await runtime.call(route.handler, CompatCall(runtime.env, env_idx, None, args))
        sent = Answer(answer.status, json_bytes(answer.body))
        if answer.session is not DELETE:
            session = None if answer.session is KEEP else answer.session
            try:
                await runtime.sessions.create(env_idx, session, client, key, sent)
            except IdTaken:
                continue
        return sent
    raise ApiError(503, "not_ready", "could not draw a free session id; retry")


def _add_compat_route(router: APIRouter, env_id: str, prefix: str, route: CompatRoute) -> None:
    model = request_model(env_id, route, max_chars=MAX_ACTION_CHARS)
    path = f"{prefix}{route.path}"

    async def serve(request: Request, fields: BaseModel) -> Response:
        runtime = runtime_for(request, env_id)
        answer = await compat_answer(
            runtime, route, path, fields.model_dump(), header_key(request), client_address(request)
        )
        return Response(answer.body, status_code=answer.status, media_type="application/json")

    summary = route.summary or f"AgentGym {route.method} {route.path}"
    if route.method == "GET":

        async def get_handler(request: Request, fields: Annotated[model, Query()]) -> Response:  # type: ignore[valid-type]
            return await serve(request, fields)

        router.add_api_route(
            route.path,
            get_handler,
            methods=["GET"],
            summary=summary,
            name=f"{env_id}{route.path}",
            responses=ERRORS,
        )
    else:
        if model.model_fields:  # a JSON body, as AgentGym's server declares it (TextCraft's /create too)

            async def post_handler(request: Request, fields: Annotated[model, Body()]) -> Response:  # type: ignore[valid-type]
                return await serve(request, fields)

        else:  # no request model at all (BabyAI's and SciWorld's /create): a body, if any, is ignored

            async def post_handler(request: Request) -> Response:
                return await serve(request, model())

        router.add_api_route(
            route.path,
            post_handler,
            methods=["POST"],
            summary=summary,
            name=f"{env_id}{route.path}",
            responses=ERRORS,
        )


class CompatFastPath:
    """The AgentGym routes' POSTs (``/<env>/create``, ``/reset``, ``/step``, ``/close``) in front of the framework.

    Why: AgentGym's agent loop is these requests, and FastAPI's request handling around them (routing through
    every included router, dependency solving, the error, body-limit and metrics middlewares, each wrapping
    ``send``) cost a third of a replica's CPU per step: the deployed path must not be slower than AgentGym's own
    one-process server. ``EnvServiceApp`` calls this before its middleware stack. It takes a request only when it is
    one the route would take: a ``Content-Length`` body within ``AGENTRL_MAX_BODY_BYTES``, JSON (content type and
    body) that the route's own pydantic model accepts (routes without fields, BabyAI's and SciWorld's ``/create``:
    any body); everything else goes to the full stack with the body replayed, before anything was done, so the
    route answers it (every 4xx of validation, the body limit's 413, the schema). What it takes it answers as the
    route does (``compat_answer``, the same code), an error the answer raises as the app's exception handlers do
    (``known_error_response``), and records as the middleware records a request (``RequestRecorder``).
    ``tests/integration/test_compat_fast_path.py`` sends requests both ways and compares the answers.
    """

    def __init__(
        self, recorder: Any, max_body_bytes: int, env_id: str, prefix: str, metrics: Metrics
    ) -> None:
        self.recorder = recorder
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.routes: dict[str, tuple[str, CompatRoute, type[BaseModel]]] = {
            f"{prefix}{route.path}": (env_id, route, request_model(env_id, route, max_chars=MAX_ACTION_CHARS))
            for route in registry.agentgym_routes(env_id)
            if route.method == "POST"
        }

    @property
    def paths(self) -> list[str]:
        """The POST paths it answers."""
        return list(self.routes)

    async def serve(self, app: Any, scope: Scope, receive: Receive, send: Send, stack: Any) -> None:
        """Answer the request, or hand it to ``stack`` (the app's middleware stack) untouched."""
        started = time.perf_counter()
        path = scope["path"]
        env_id, route, model = self.routes[path]
        runtimes = getattr(app.state, "envs", None)
        length = content_length(scope)
        if not runtimes or env_id not in runtimes or length is None or length > self.max_body_bytes:
            await stack(scope, receive, send)
            return
        messages, request_body = await read_body(receive)
        fields = (
            None if request_body is None else self._fields(scope, model, request_body)
        )  # None: the stack's
        if fields is None:
            await stack(scope, replay(messages, receive), send)
            return
        headers = {name: value.decode("latin-1") for name, value in scope["headers"] if name in _HEADERS}
        peer = scope.get("client")
        client = forwarded_client(headers.get(b"x-forwarded-for"), peer[0] if peer else None)
        header = key_header(headers.get(b"idempotency-key"), headers.get(b"x-request-id"))
        try:
            answer = await compat_answer(runtimes[env_id], route, path, fields, header, client)
            status, body, extra = answer.status, answer.body, []
        except Exception as error:  # as the app's exception handlers answer it
            response = known_error_response(
                error, "POST", path, lambda kind: self.metrics.errors.labels(kind).inc()
            )
            status, body = response.status_code, bytes(response.body)
            extra = [(name, value) for name, value in response.raw_headers if name == b"retry-after"]
        try:
            await send_json(send, status, body, extra)
        finally:
            self.recorder.record("POST", path, status, time.perf_counter() - started, path)

    @staticmethod
    def _fields(scope: Scope, model: type[BaseModel], body: bytes) -> dict[str, Any] | None:
        """The request's fields as the route's model gives them, or None (the route then answers)."""
        if not model.model_fields:
            return {}  # the route ignores any body
        data = json_object(scope, body)
        if data is None:
            return None
        try:
            return model.model_validate(data).model_dump()
        except ValidationError:
            return None


_HEADERS = (b"x-forwarded-for", b"idempotency-key", b"x-request-id")


# ---- an environment's HTTP side ------------------------------------------------------------------------------
class FastPath(Protocol):
    """A POST route answered in front of the framework (``EnvServiceApp``): ``paths``, and ``serve``, which answers or
    hands the request to ``stack`` (the app's middleware stack) untouched."""

    @property
    def paths(self) -> list[str]: ...

    async def serve(self, app: Any, scope: Scope, receive: Receive, send: Send, stack: Any) -> None: ...


class HttpSide(Protocol):
    """What the serving layer asks of an environment's HTTP side: its runtime in a worker, its routes at each of
    its prefixes (``Registration.prefixes``: ``/<id>``, and the root for a root alias), the POST routes it answers
    in front of the framework, and the paths of its hot routes (moved to the front of the routing table).

    ``GENERIC`` serves an environment through the contract (native ``/v1`` routes, ``AGENTGYM_ROUTES``); an
    environment with a protocol of its own names its HTTP side in its registration (``Registration.http``).
    """

    hot_paths: tuple[str, ...]  # relative to a prefix

    def runtime(self, env_id: str, settings: Settings, secret: bytes, metrics: Metrics) -> EnvRuntime: ...

    def routers(self, env_id: str, prefix: str) -> list[APIRouter]: ...

    def fast_paths(
        self, env_id: str, prefix: str, recorder: Any, settings: Settings, metrics: Metrics
    ) -> list[FastPath]: ...


class GenericHttp:
    """The contract over HTTP: ``/<env>/v1/...`` and the package's AgentGym routes (module docstring)."""

    hot_paths = ("/v1/step", "/step")

    def runtime(self, env_id: str, settings: Settings, secret: bytes, metrics: Metrics) -> EnvRuntime:
        return EnvRuntime(env_id, registry.make(env_id, settings), settings, secret, metrics)

    def routers(self, env_id: str, prefix: str) -> list[APIRouter]:
        return [native_router(env_id, prefix), compat_router(env_id, prefix)]

    def fast_paths(
        self, env_id: str, prefix: str, recorder: Any, settings: Settings, metrics: Metrics
    ) -> list[FastPath]:
        return [CompatFastPath(recorder, settings.max_body_bytes, env_id, prefix, metrics)]


GENERIC = GenericHttp()


def http_side(env_id: str) -> HttpSide:
    """The HTTP side the registration of ``env_id`` names, else the generic one."""
    reference = registry.registration(env_id).http
    return GENERIC if reference is None else registry.resolve(reference)


def include_env_routes(
    app: FastAPI, settings: Settings, recorder: Any, metrics: Metrics
) -> dict[str, FastPath]:
    """Mount every served environment's routes at each of its prefixes; returns their fast paths by path."""
    fast: dict[str, FastPath] = {}
    hot: list[str] = []
    for env_id in settings.env_ids():
        side = http_side(env_id)
        for prefix in registry.registration(env_id).prefixes:
            for router in side.routers(env_id, prefix):
                app.include_router(router)
            for path in side.fast_paths(env_id, prefix, recorder, settings, metrics):
                fast.update(dict.fromkeys(path.paths, path))
            hot.extend(prefix + path for path in side.hot_paths)
    _hot_routes_first(app, hot)
    return fast


def _hot_routes_first(app: FastAPI, paths: list[str]) -> None:
    """Move the step routes to the front of the routing table.

    Why: the router tries routes in order, one regex match each, until one matches; the step is nearly every
    request, and the docs and ops routes that come first cost a few µs per request. Paths do not overlap, so
    the order changes no routing decision (only the order of paths in the OpenAPI document).
    """
    routes = app.router.routes
    hot = [route for route in routes if getattr(route, "path", None) in paths]
    routes[:] = hot + [route for route in routes if route not in hot]
