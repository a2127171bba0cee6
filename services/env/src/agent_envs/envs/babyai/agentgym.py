"""AgentGym's BabyAI server (``agentenv-babyai``) as pure handlers over stored sessions.

A stored session is JSON (it goes to Redis): ``{"state": <core state> | null, "goal": str, "last": str,
"reward": number, "score": number, "done": bool}``; ``state`` is null between ``/create`` and the first
``/reset``, ``last`` is the last observation without its goal line (what ``/observation`` repeats). Answers
are the original's, field for field, errors included (HTTP 200 ``{"error": "..."}``); the differences are in
docs/deviations.md ("BabyAI").
"""

from __future__ import annotations

from typing import Any

from ..agentgym import close_session
from ..contract import CompatAnswer, CompatCall, CompatField, CompatRoute, EnvError, Transition
from .levels import LEVELS

ROOT_MESSAGE = "This is environment BabyAI."
NOT_INITIALIZED = "Environment not initialized"
MAX_DATA_IDX = 2**63 - 1  # a session is JSON that 64-bit readers (orjson) must read back


def _invalid(call: CompatCall) -> CompatAnswer:
    return CompatAnswer({"error": f"The id {call.env_idx} is not valid."})


def _finished(call: CompatCall) -> CompatAnswer:
    return CompatAnswer({"error": f"The task with environment {call.env_idx} has finished."})


def _session(transition: Transition, goal: str, last: str) -> dict[str, Any]:
    return {
        "state": transition.state,
        "goal": goal,
        "last": last,
        "reward": transition.reward,
        "score": transition.info["score"],
        "done": transition.done,
    }


def root(call: CompatCall) -> CompatAnswer:
    return CompatAnswer(ROOT_MESSAGE)


def create(call: CompatCall) -> CompatAnswer:
    """A new id; no level is built until ``/reset``."""
    return CompatAnswer({"id": call.env_idx}, {"state": None})


def reset(call: CompatCall) -> CompatAnswer:
    """Level ``data_idx % 40 + 1`` with seed ``data_idx // 40``; allowed again after the episode finished.
    A negative ``data_idx`` makes a negative seed, which gymnasium refuses (the session is left as it was)."""
    if call.session is None:
        return _invalid(call)
    data_idx = call.args["data_idx"]
    if data_idx < 0:
        seed = data_idx // len(LEVELS)
        return CompatAnswer({"error": f"Seed must be greater or equal to zero, actual value: {seed}"})
    if data_idx > MAX_DATA_IDX:
        return CompatAnswer({"error": f"data_idx must be at most {MAX_DATA_IDX}"})
    start = getattr(call.env, "start", call.env.reset)
    try:
        transition = start(data_idx)
    except EnvError as error:
        return CompatAnswer({"error": str(error)})
    observation = transition.observation
    goal_line, last = observation.split("\n", 1)
    goal = goal_line.removeprefix("Your goal: ")
    body = {"observation": observation, "reward": 0, "score": 0, "deleted": False, "done": False}
    return CompatAnswer(body, _session(transition, goal, last))


def step(call: CompatCall) -> CompatAnswer:
    """After a step answered ``done: true`` every further step is refused; before any reset the original
    fails on a missing key and answers the key (the id) as its error."""
    session = call.session
    if session is None:
        return _invalid(call)
    if session["state"] is None:
        return CompatAnswer({"error": str(call.env_idx)})
    if session["done"]:
        return _finished(call)
    try:
        transition = call.env.step(session["state"], call.args["action"])
    except EnvError as error:
        return CompatAnswer({"error": str(error)})
    body = {
        "observation": transition.observation,
        "reward": transition.reward,
        "score": transition.info["score"],
        "done": transition.done,
    }
    return CompatAnswer(body, _session(transition, session["goal"], transition.observation))


def observation(call: CompatCall) -> CompatAnswer:
    """The goal line and the last observation, with reward, score, done and ``deleted``."""
    session = call.session
    if session is None:
        return _invalid(call)
    if session["state"] is None:
        return CompatAnswer(
            {"observation": NOT_INITIALIZED, "reward": 0, "score": 0, "done": False, "deleted": False}
        )
    if session["done"]:
        return _finished(call)
    return CompatAnswer(
        {
            "observation": f"Your goal: {session['goal']}\n{session['last']}",
            "reward": session["reward"],
            "score": session["score"],
            "done": session["done"],
            "deleted": False,
        }
    )


AGENTGYM_ROUTES: tuple[CompatRoute, ...] = (
    CompatRoute("GET", "/", root, needs_id=False, summary="a JSON string naming the environment"),
    CompatRoute("POST", "/create", create, creates=True, needs_id=False, summary="a new id (no body)"),
    CompatRoute(
        "POST",
        "/reset",
        reset,
        {"data_idx": CompatField("int", required=True)},
        summary="level data_idx % 40 + 1, seed data_idx // 40",
    ),
    CompatRoute("POST", "/step", step, {"action": CompatField("str", required=True)}, summary="one action"),
    CompatRoute("GET", "/observation", observation, summary="goal and last observation, reward, score, done"),
    CompatRoute("POST", "/close", close_session, summary="true; false when the id is unknown or closed"),
)
