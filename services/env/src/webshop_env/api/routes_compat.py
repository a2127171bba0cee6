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
  the session's current state is answered from that state, not applied again (a client that retries a 503
  or a timeout cannot take an action twice).

Sessions live in the shared store (``compat_sessions``: Redis, set by ``WEBSHOP_REDIS_URL``), so any worker of
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

from ..envs.agentgym import json_integer
from .compat_sessions import MAX_ID
from .routes_native import (
    ERRORS,
    MAX_ACTION_CHARS,
    AvailableActions,
    json_response,
    runtime_of,
    utf8_text,
)

router = APIRouter(tags=["agentgym"])
MAX_IDEMPOTENCY_KEY = 128  # characters of an Idempotency-Key header (a UUID is 36)

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


def client_address(request: Request) -> str:
    """The client as the balancer saw it (the last ``X-Forwarded-For`` entry, which nginx appends), else the
    peer address: the unit of the per-client session quota."""
    forwarded = request.headers.get("x-forwarded-for")
    if forwarded:
        last = forwarded.rsplit(",", 1)[-1].strip()
        if last:
            return last[:64]
    return request.client.host if request.client else "unknown"


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
    step = runtime.env.reset(runtime.random_goal(goal_set), goal_set=goal_set)
    return json_response(await runtime.sessions.create(step.state, client_address(request)))


@router.post("/reset", response_model=tuple[str, None], responses=ERRORS)
async def reset(request: Request, body: CompatReset) -> Response:
    """Start the session's episode on goal `session_id` (null: random); returns `[observation, null]`."""
    runtime = runtime_of(request)
    _, version = await runtime.sessions.get(body.env_idx)
    goal_set = runtime.settings.compat_goal_set
    goal = runtime.random_goal(goal_set) if body.session_id is None else body.session_id
    step = runtime.env.reset(goal, goal_set=goal_set)
    await runtime.sessions.put(body.env_idx, step.state, version)
    return json_response([step.observation, None])


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
    """Apply one action to the session's episode (once per `Idempotency-Key`, when the client sends one)."""
    runtime = runtime_of(request)
    idempotency_key = idempotency_key or None  # an empty key is no key
    state, version = await runtime.sessions.get(body.env_idx)
    if idempotency_key is not None and version.key == idempotency_key:
        # a retry of the step that made this state (its answer was lost): answer it again from the state
        page, limit = runtime.env.observe(state), runtime.settings.max_steps
        done = page.done or (bool(limit) and state.steps >= limit)
        return json_response(
            {"state": page.observation, "reward": state.reward or 0.0, "done": done, "info": None}
        )
    result, truncated = runtime.step(state, body.action, "compat")
    await runtime.sessions.put(body.env_idx, result.state, version, idempotency_key)
    return json_response(
        {"state": result.observation, "reward": result.reward, "done": result.done or truncated, "info": None}
    )


@router.get("/observation", response_model=str, responses=ERRORS)
async def observation(request: Request, env_idx: EnvIdxQuery) -> Response:
    """The current page as text."""
    runtime = runtime_of(request)
    state, _ = await runtime.sessions.get(env_idx)
    return json_response(runtime.env.observe(state).observation)


@router.get("/available_actions", response_model=AvailableActions, responses=ERRORS)
async def available_actions(request: Request, env_idx: EnvIdxQuery) -> Response:
    """`{"has_search_bar", "clickables"}` of the current page."""
    runtime = runtime_of(request)
    state, _ = await runtime.sessions.get(env_idx)
    return json_response(runtime.env.observe(state).available_actions)


@router.get("/instruction_text", response_model=str, responses=ERRORS)
async def instruction_text(request: Request, env_idx: EnvIdxQuery) -> Response:
    """`"Instruction: " + the goal's instruction`."""
    runtime = runtime_of(request)
    state, _ = await runtime.sessions.get(env_idx)
    return json_response("Instruction: " + runtime.env.goal(state.goal_set, state.goal).instruction_text)


@router.post("/close", response_model=CloseResponse, responses=ERRORS)
async def close(request: Request, body: CompatClose) -> dict[str, Any]:
    """Free the session (`closed: false` if it was not live)."""
    return {"closed": await runtime_of(request).sessions.close(body.env_idx)}
