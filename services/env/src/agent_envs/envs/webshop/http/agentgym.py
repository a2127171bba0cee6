"""AgentGym-compatible endpoints: a drop-in for ``agentenv``'s ``WebshopEnvClient`` (protocol: docs/api.md).

Shapes match ``agentenv-webshop`` exactly: ``/create`` returns a bare int, ``/reset`` a ``[observation,
null]`` pair, ``/step`` ``{state, reward, done, info: null}``. ``env_idx`` goes in the JSON body of a POST and
the query string of a GET. Differences from the original, all on error paths or additions:

- unknown ids answer 404 ``{"error": "unknown_env", ...}`` instead of a 500; out-of-range ``session_id`` 404
  ``unknown_goal`` (the original: 500, or a negative index silently counted from the end);
- ``POST /close`` exists (``{"closed": bool}``, as in AgentGym PR #74);
- ``session_id: null`` picks a uniformly random goal (the original weighs goals by attribute rarity);
- ``/instruction_text`` is ``"Instruction: " + instruction`` on every page (the original varies the spacing
  and fails after a purchase);
- a step after the purchase, or past the step limit, answers 409 ``episode_finished``;
- ``/step`` takes an optional ``Idempotency-Key`` header: a step retried with the key of the step that made
  the session's current state gets that step's answer again, not applied again (a client that retries a 503
  or a timeout cannot take an action twice).

Exactly once through the balancer: ``/create``, ``/reset``, ``/step`` and ``/close`` record their answer with
the change they make, under the request's key (``compat_sessions.request_key``: the ``Idempotency-Key``, else
the balancer's ``X-Request-Id``, which stays the same when nginx re-sends the request to another replica after
the first one died); a re-sent request gets the recorded answer and changes nothing.

Sessions live in the shared store (``compat_sessions``: Redis, set by ``AGENTRL_REDIS_URL``), so any worker of
any replica serves them, through the balancer like the native protocol, and a replica's death loses none.
Without Redis they live in this one process (a single replica with a single worker only).

Types are strict, in the schema and in the code: ``env_idx`` and ``session_id`` are JSON integers (``3`` or
``3.0``; not booleans, strings or ``3.5``); ``env_idx`` is required (in the body of a POST, in the query of a
GET).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from pydantic import BaseModel, BeforeValidator, Field, field_validator
from starlette.responses import Response

from ....api.compat_sessions import (
    MAX_ID,
    MAX_REQUEST_KEY,
    Answer,
    IdTaken,
    SessionConflict,
    UnknownSession,
    request_key,
)
from ....api.errors import ApiError, json_bytes
from ....api.http import ERRORS, MAX_ACTION_CHARS, client_address, header_key, json_response, utf8_text
from ...agentgym import json_integer
from ...contract import EnvError
from .native import AvailableActions
from .runtime import runtime_of

router = APIRouter(tags=["agentgym"])
MAX_IDEMPOTENCY_KEY = MAX_REQUEST_KEY  # characters of an Idempotency-Key header (a UUID is 36)
CREATE_ATTEMPTS = 8  # ids are drawn at random: a live one comes up again with odds of one in millions

# constraints before the validator, so the schema carries them as minimum/maximum
EnvIdx = Annotated[
    int, Field(ge=0, le=MAX_ID, description="the id from /create"), BeforeValidator(json_integer)
]
GoalIndex = Annotated[int, BeforeValidator(json_integer)]  # out of range: 404 unknown_goal, as native
EnvIdxQuery = Annotated[int, Query(ge=0, le=MAX_ID, description="the id from /create")]


class CompatReset(BaseModel):
    env_idx: EnvIdx
    session_id: GoalIndex | None = Field(default=None, description="goal index; null: a random goal")


class CompatStep(BaseModel):
    env_idx: EnvIdx
    action: str = Field(max_length=MAX_ACTION_CHARS)

    _check_action = field_validator("action")(utf8_text)


class CompatClose(BaseModel):
    env_idx: EnvIdx


class CompatStepResponse(BaseModel):
    state: str = Field(description="the observation (AgentGym calls it state)")
    reward: float
    done: bool
    info: None = None


class CloseResponse(BaseModel):
    closed: bool


def _answer(value: Any) -> Answer:
    return Answer(200, json_bytes(value))


def _sent(answer: Answer) -> Response:
    return Response(answer.body, status_code=answer.status, media_type="application/json")


@router.get("/", response_model=str)
async def root() -> str:
    """Health check of the original (`"ok"`)."""
    return "ok"


@router.get("/list_envs", response_model=list[int], responses=ERRORS)
async def list_envs(request: Request) -> Response:
    """Ids of the live sessions."""
    return json_response(await runtime_of(request).sessions.ids())


@router.post("/create", response_model=int, responses=ERRORS)
async def create(request: Request) -> Response:
    """A new session (on a random goal until `/reset`); returns its id as a bare int."""
    runtime = runtime_of(request)
    goal_set = runtime.settings.compat_goal_set
    step = runtime.env.sim.reset(runtime.env.random_goal(goal_set), goal_set=goal_set)
    key = request_key(header_key(request), request.url.path, {})
    for _ in range(CREATE_ATTEMPTS):
        env_idx = runtime.sessions.new_id()
        answer = _answer(env_idx)
        try:
            await runtime.sessions.create(env_idx, step.state, client_address(request), key, answer)
        except IdTaken:
            continue
        return _sent(answer)
    raise ApiError(503, "not_ready", "could not draw a free session id; retry")


@router.post("/reset", response_model=tuple[str, None], responses=ERRORS)
async def reset(request: Request, body: CompatReset) -> Response:
    """Start the session's episode on goal `session_id` (null: random); returns `[observation, null]`."""
    runtime = runtime_of(request)
    key = request_key(header_key(request), request.url.path, body.model_dump())
    _, version = await runtime.sessions.get(body.env_idx, key, touch=False)
    goal_set = runtime.settings.compat_goal_set
    goal = runtime.env.random_goal(goal_set) if body.session_id is None else body.session_id
    step = runtime.env.sim.reset(goal, goal_set=goal_set)
    answer = _answer([step.observation, None])
    await runtime.sessions.put(body.env_idx, step.state, version, key, answer)
    return _sent(answer)


@router.post("/step", response_model=CompatStepResponse, responses=ERRORS)
async def step(
    request: Request,
    body: CompatStep,
    idempotency_key: Annotated[
        str | None,
        # visible ASCII: what an HTTP header value can carry (the schema says so, so clients and fuzzers know)
        Header(
            max_length=MAX_IDEMPOTENCY_KEY,
            pattern=r"^[!-~]*$",
            description="the same for every retry of one step",
        ),
    ] = None,
) -> Response:
    """Apply one action to the session's episode, once per request (and per `Idempotency-Key`, when the client
    sends one: a retry with it gets the first answer again)."""
    runtime = runtime_of(request)
    key = request_key(header_key(request), request.url.path, body.model_dump())
    cached = True  # from this process's copy of the session, checked by the write (compat_sessions)
    while True:
        state, version = await runtime.sessions.get(body.env_idx, key, touch=False, cached=cached)
        try:
            result, truncated = runtime.step_limited(state, body.action, "compat")
            answer = _answer(
                {"state": result.observation, "reward": result.reward, "done": result.done or truncated,
                 "info": None}
            )  # fmt: skip
            await runtime.sessions.put(body.env_idx, result.state, version, key, answer)
            return _sent(answer)
        except (SessionConflict, UnknownSession, EnvError):
            if not version.cached:
                raise
            cached = False  # the copy was stale: the store's state, again


@router.get("/observation", response_model=str, responses=ERRORS)
async def observation(request: Request, env_idx: EnvIdxQuery) -> Response:
    """The current page as text."""
    runtime = runtime_of(request)
    state, _ = await runtime.sessions.get(env_idx)
    return json_response(runtime.env.sim.observe(state).observation)


@router.get("/available_actions", response_model=AvailableActions, responses=ERRORS)
async def available_actions(request: Request, env_idx: EnvIdxQuery) -> Response:
    """`{"has_search_bar", "clickables"}` of the current page."""
    runtime = runtime_of(request)
    state, _ = await runtime.sessions.get(env_idx)
    return json_response(runtime.env.sim.observe(state).available_actions)


@router.get("/instruction_text", response_model=str, responses=ERRORS)
async def instruction_text(request: Request, env_idx: EnvIdxQuery) -> Response:
    """`"Instruction: " + the goal's instruction`."""
    runtime = runtime_of(request)
    state, _ = await runtime.sessions.get(env_idx)
    return json_response("Instruction: " + runtime.env.sim.goal(state.goal_set, state.goal).instruction_text)


@router.post("/close", response_model=CloseResponse, responses=ERRORS)
async def close(request: Request, body: CompatClose) -> Response:
    """Free the session (`closed: false` if it was not live)."""
    key = request_key(header_key(request), request.url.path, body.model_dump())
    closed = await runtime_of(request).sessions.close(body.env_idx, key, _answer({"closed": True}))
    return _sent(_answer({"closed": closed}))
