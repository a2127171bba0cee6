"""The native, stateless protocol: every request carries the signed episode state, so any replica and any
worker can serve it, and retrying a step is harmless (``step`` is a pure function of state and action).

Handlers are ``async`` and call the simulator inline: a step costs microseconds to a few milliseconds of
CPU, less than a thread-pool hop, and a worker process is single-threaded under the GIL anyway.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, Field, field_validator
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ....api.errors import ApiError, classify, json_bytes, replay
from ....api.http import (
    ERRORS,
    MAX_ACTION_CHARS,
    ErrorResponse,
    content_length,
    json_object,
    json_response,
    package_version,
    read_body,
    send_json,
    utf8_text,
)
from ....api.metrics import RequestRecorder
from ....api.tokens import TokenError
from ...agentgym import JsonInt
from ...contract import EnvError
from .runtime import ENV_ID, runtime_of

router = APIRouter(prefix="/v1", tags=["native"])

Split = Literal["train", "eval", "test"]

__all__ = [
    "ERRORS",
    "MAX_ACTION_CHARS",
    "ErrorResponse",
    "StepFastPath",
    "json_response",
    "router",
    "utf8_text",
]


# ---- models (request validation and the OpenAPI schema) --------------------------------------------------
class ResetRequest(BaseModel):
    goal: JsonInt = Field(description="global goal index (the original's session id)")
    goal_set: str | None = Field(default=None, description="goal list; default: the server's default")
    split: Split | None = Field(default=None, description="if given, the goal must lie in this split")


class StepRequest(BaseModel):
    state: str = Field(description="the `state` token of the previous response, unchanged")
    action: str = Field(max_length=MAX_ACTION_CHARS, description="`search[keywords]` or `click[label]`")

    _check_action = field_validator("action")(utf8_text)


class StepBatchRequest(BaseModel):
    steps: list[StepRequest] = Field(description="independent steps (up to the server's max_batch)")


class AvailableActions(BaseModel):
    has_search_bar: bool
    clickables: list[str]


class ResetResponse(BaseModel):
    observation: str
    instruction: str
    available_actions: AvailableActions
    state: str
    info: dict[str, Any]


class StepResponse(BaseModel):
    observation: str
    reward: float
    done: bool
    available_actions: AvailableActions
    state: str
    info: dict[str, Any] = Field(description="valid, steps, truncated; reward_info on purchase")


class ErrorItem(BaseModel):
    error: str
    detail: str
    status: int


class StepBatchResponse(BaseModel):
    results: list[StepResponse | ErrorItem]


class ExpertResponse(BaseModel):
    goal: int
    goal_set: str
    actions: list[str]


# ---- endpoints -------------------------------------------------------------------------------------------
@router.post("/reset", response_model=ResetResponse, responses=ERRORS)
async def reset(body: ResetRequest, request: Request) -> Response:
    """Start an episode; the response's `state` goes into the next `/v1/step`."""
    runtime = runtime_of(request)
    step = runtime.env.reset_goal(body.goal, goal_set=body.goal_set, split=body.split)
    return json_response(runtime.reset_payload(step))


@router.post("/step", response_model=StepResponse, responses=ERRORS)
async def step(body: StepRequest, request: Request) -> Response:
    """Apply one action to the state (idempotent: the same request always gives the same answer)."""
    runtime = runtime_of(request)
    state = runtime.codec.decode(body.state)
    result, truncated = runtime.step_limited(state, body.action, "native")
    return json_response(runtime.step_payload(result, truncated))


@router.post("/step_batch", response_model=StepBatchResponse, responses=ERRORS)
async def step_batch(body: StepBatchRequest, request: Request) -> Response:
    """Many independent steps in one request; a failing item gets an error object in its place."""
    runtime = runtime_of(request)
    if len(body.steps) > runtime.settings.max_batch:
        raise ApiError(
            422, "batch_too_large",
            f"{len(body.steps)} steps in one batch; the limit is {runtime.settings.max_batch} (WEBSHOP_MAX_BATCH)",
        )  # fmt: skip
    results: list[dict[str, Any]] = []
    for item in body.steps:
        try:
            state = runtime.codec.decode(item.state)
            result, truncated = runtime.step_limited(state, item.action, "native")
            results.append(runtime.step_payload(result, truncated))
        except (EnvError, TokenError) as error:  # anything else is a bug and fails the whole request
            status, kind = classify(error)
            runtime.metrics.errors.labels(kind).inc()
            results.append({"error": kind, "detail": str(error), "status": status})
    return json_response({"results": results})


@router.get("/goals", responses=ERRORS)
async def goals(
    request: Request,
    goal_set: Annotated[str | None, Query(description="only this goal set")] = None,
    split: Annotated[Split, Query(description="only this split")] = None,  # type: ignore[assignment]
) -> dict[str, Any]:
    """Goal counts per goal set and the index range of each split."""
    return runtime_of(request).env.goals_summary(goal_set, split)


@router.get("/goals/{goal}/expert", response_model=ExpertResponse, responses=ERRORS)
async def expert(
    request: Request,
    goal: Annotated[int, Path(description="goal index")],
    goal_set: Annotated[str | None, Query(description="goal set; default: the server's default")] = None,
) -> Response:
    """The expert's actions for a goal (buys the goal's product with its options; empty if none found)."""
    runtime = runtime_of(request)
    name = goal_set or runtime.settings.default_goal_set
    return json_response(
        {"goal": goal, "goal_set": name, "actions": list(runtime.env.expert_for(name, goal))}
    )


@router.get("/info", responses=ERRORS)
async def info(request: Request) -> dict[str, Any]:
    """The catalog this replica serves (fingerprint, products, goal sets) and the service's limits."""
    runtime = runtime_of(request)
    catalog = runtime.env.catalog_info()
    limits = ("fingerprint", "products", "goal_sets", "default_goal_set", "compat_goal_set", "max_steps")
    return {"version": package_version(), **{key: catalog[key] for key in limits},
            "max_batch": runtime.settings.max_batch, "catalog": catalog["catalog"]}  # fmt: skip


# ---- the step's fast path ---------------------------------------------------------------------------------
class StepFastPath:
    """``POST /v1/step`` in front of the framework, for the requests its route would accept and answer 200.

    Why: a step is tens of µs of simulator and token work, and the framework around it (FastAPI's request
    handling: dependency solving, pydantic validation of the body, the response class; then Starlette's
    error middleware and this app's body-limit and metrics middlewares, each wrapping ``send``) cost as much
    again on every step. ``EnvServiceApp`` calls this before its middleware stack. It answers a request only when
    it is a well-formed step that succeeds: a ``Content-Length`` body within ``AGENTRL_MAX_BODY_BYTES``, a JSON
    object whose ``state`` and ``action`` are strings the route's own model accepts. Everything else, and any
    error the step raises, goes to the full stack with the body replayed, so every error answer (the 413 of
    the body limit included) and the OpenAPI schema stay the route's. What it answers is recorded as the
    middleware records a request (``RequestRecorder``: the same metrics under the route's template, the same
    sampled access log), and the answer is byte for byte the route's: the same payload, serialisation and
    headers.
    """

    def __init__(self, recorder: RequestRecorder, max_body_bytes: int, path: str = "/v1/step") -> None:
        self.recorder = recorder
        self.max_body_bytes = max_body_bytes
        self.path = path  # /v1/step, or /webshop/v1/step

    @property
    def paths(self) -> list[str]:
        return [self.path]

    async def serve(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, stack: ASGIApp) -> None:
        """Answer the step, or hand it to ``stack`` (the app's middleware stack) untouched."""
        started = time.perf_counter()
        length = content_length(scope)
        if length is None or length > self.max_body_bytes:
            await stack(scope, receive, send)
            return
        messages, body = await read_body(receive)
        answer = None
        if body is not None:  # else the client went away: the stack answers that
            scope["app"] = app  # as the framework sets it: the runtime lives on the app's state
            answer = self._answer(scope, body)
        if answer is None:
            await stack(scope, replay(messages, receive), send)
            return
        try:
            await send_json(send, 200, answer)
        finally:
            self.recorder.record("POST", self.path, 200, time.perf_counter() - started, self.path)

    @staticmethod
    def _answer(scope: Scope, body: bytes) -> bytes | None:
        """The response body of a step that succeeds, else None (the route then answers, errors included)."""
        runtime = (getattr(scope["app"].state, "envs", None) or {}).get(ENV_ID)
        request = None if runtime is None else json_object(scope, body)
        if request is None:
            return None
        state, action = request.get("state"), request.get("action")
        if type(state) is not str or type(action) is not str or len(action) > MAX_ACTION_CHARS:
            return None
        if not action.isascii():
            try:
                utf8_text(action)
            except ValueError:
                return None
        try:
            result, truncated = runtime.step_limited(runtime.codec.decode(state), action, "native")
            return json_bytes(runtime.step_payload(result, truncated))
        except Exception:  # the route runs the step again and answers the error as every route does
            return None
