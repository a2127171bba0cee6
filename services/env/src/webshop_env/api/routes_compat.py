"""AgentGym-compatible endpoints: a drop-in for ``agentenv``'s ``WebshopEnvClient`` (protocol: docs/api.md).

Shapes match ``agentenv-webshop`` exactly: ``/create`` returns a bare int, ``/reset`` a ``[observation,
null]`` pair, ``/step`` ``{state, reward, done, info: null}``. ``env_idx`` is accepted in the JSON body or in
the query string. Differences from the original, all on error paths or additions:

- unknown ids answer 404 ``{"error": "unknown_env", ...}`` instead of a 500; out-of-range ``session_id`` 404
  ``unknown_goal`` (the original: 500, or a negative index silently counted from the end);
- ``POST /close`` exists (``{"closed": bool}``, as in AgentGym PR #74);
- ``session_id: null`` picks a uniformly random goal (the original weighs goals by attribute rarity);
- ``/instruction_text`` is ``"Instruction: " + instruction`` on every page (the original varies the spacing
  and fails after a purchase);
- a step after the purchase, or past the step limit, answers 409 ``episode_finished``.

Sessions live in this worker process (``compat_sessions``): AgentGym clients must reach the same process on
every call, i.e. a replica started with ``--workers 1``, directly or through the balancer's sticky compat
route (``configs/nginx/webshop.conf.template``, sticky per client address, so per replica, not per worker).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field, field_validator
from starlette.responses import Response

from .compat_sessions import UnknownSession
from .errors import ApiError
from .routes_native import ERRORS, MAX_ACTION_CHARS, AvailableActions, json_response, runtime_of, utf8_text

router = APIRouter(tags=["agentgym"])

EnvIdxQuery = Annotated[int | None, Query(description="the id from /create (or put it in the JSON body)")]


class CompatReset(BaseModel):
    env_idx: int | None = None
    session_id: int | None = Field(default=None, description="goal index; null: a random goal")


class CompatStep(BaseModel):
    env_idx: int | None = None
    action: str = Field(max_length=MAX_ACTION_CHARS)

    _check_action = field_validator("action")(utf8_text)


class CompatClose(BaseModel):
    env_idx: int | None = None


class CompatStepResponse(BaseModel):
    state: str = Field(description="the observation (AgentGym calls it state)")
    reward: float
    done: bool
    info: None = None


class CloseResponse(BaseModel):
    closed: bool


def _env_idx(body_value: int | None, query_value: int | None) -> int:
    env_idx = body_value if body_value is not None else query_value
    if env_idx is None:
        raise ApiError(422, "validation_error", "env_idx is required (in the JSON body or the query string)")
    return env_idx


def _state(request: Request, env_idx: int):
    runtime = runtime_of(request)
    try:
        return runtime, runtime.sessions.get(env_idx)
    except UnknownSession as error:
        raise ApiError(404, "unknown_env", str(error)) from None


@router.get("/", response_model=str)
async def root() -> str:
    """Health check of the original (`"ok"`)."""
    return "ok"


@router.get("/list_envs", response_model=list[int], responses=ERRORS)
async def list_envs(request: Request) -> Response:
    """Ids of the live sessions of this process."""
    return json_response(runtime_of(request).sessions.ids())


@router.post("/create", response_model=int, responses=ERRORS)
async def create(request: Request) -> Response:
    """A new session (on a random goal until `/reset`); returns its id as a bare int."""
    runtime = runtime_of(request)
    goal_set = runtime.settings.compat_goal_set
    step = runtime.env.reset(runtime.random_goal(goal_set), goal_set=goal_set)
    return json_response(runtime.sessions.create(step.state))


@router.post("/reset", response_model=tuple[str, None], responses=ERRORS)
async def reset(request: Request, body: CompatReset | None = None, env_idx: EnvIdxQuery = None) -> Response:
    """Start the session's episode on goal `session_id` (null: random); returns `[observation, null]`."""
    env_idx = _env_idx(body.env_idx if body else None, env_idx)
    runtime, _ = _state(request, env_idx)
    goal_set = runtime.settings.compat_goal_set
    session_id = body.session_id if body else None
    goal = runtime.random_goal(goal_set) if session_id is None else session_id
    step = runtime.env.reset(goal, goal_set=goal_set)
    runtime.sessions.put(env_idx, step.state)
    return json_response([step.observation, None])


@router.post("/step", response_model=CompatStepResponse, responses=ERRORS)
async def step(request: Request, body: CompatStep, env_idx: EnvIdxQuery = None) -> Response:
    """Apply one action to the session's episode."""
    env_idx = _env_idx(body.env_idx, env_idx)
    runtime, state = _state(request, env_idx)
    result, truncated = runtime.step(state, body.action, "compat")
    runtime.sessions.put(env_idx, result.state)
    return json_response(
        {"state": result.observation, "reward": result.reward, "done": result.done or truncated, "info": None}
    )


@router.get("/observation", response_model=str, responses=ERRORS)
async def observation(request: Request, env_idx: EnvIdxQuery = None) -> Response:
    """The current page as text."""
    runtime, state = _state(request, _env_idx(None, env_idx))
    return json_response(runtime.env.observe(state).observation)


@router.get("/available_actions", response_model=AvailableActions, responses=ERRORS)
async def available_actions(request: Request, env_idx: EnvIdxQuery = None) -> Response:
    """`{"has_search_bar", "clickables"}` of the current page."""
    runtime, state = _state(request, _env_idx(None, env_idx))
    return json_response(runtime.env.observe(state).available_actions)


@router.get("/instruction_text", response_model=str, responses=ERRORS)
async def instruction_text(request: Request, env_idx: EnvIdxQuery = None) -> Response:
    """`"Instruction: " + the goal's instruction`."""
    runtime, state = _state(request, _env_idx(None, env_idx))
    return json_response("Instruction: " + runtime.env.goal(state.goal_set, state.goal).instruction_text)


@router.post("/close", response_model=CloseResponse, responses=ERRORS)
async def close(
    request: Request, body: CompatClose | None = None, env_idx: EnvIdxQuery = None
) -> dict[str, Any]:
    """Free the session (`closed: false` if it was not live)."""
    index = _env_idx(body.env_idx if body else None, env_idx)
    return {"closed": runtime_of(request).sessions.close(index)}
