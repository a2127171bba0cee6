"""AgentGym's SciWorld server (``agentenv-sciworld``) as pure handlers over stored sessions.

A stored session is JSON: ``{"state": <core state> | None, "info": <the original's info dict>}``. ``info`` is
what ``/detail`` returns (``deleted``, ``done``, then after a reset ``task_name``, ``var_num``,
``task_description``, ``observation``, ``reward``, ``score``); ``state`` is the core's replay log, so any replica
can serve the session (the one holding its JVM answers fastest). ``/create`` starts no JVM: the core's pool keeps
spares warm. Answers are the original's, field for field, and its errors are HTTP 200 ``{"error": "..."}`` as
there, including its texts before the first reset. Differences (docs/deviations.md, "SciWorld"): ``/goals`` and
``/state`` before a reset answer the simulator's "not initialized" text, not a Java stack trace; ``/close`` of a
closed or unknown id answers ``false`` (as TextCraft's and BabyAI's servers do), not HTTP 500; a failed reset
leaves the session as it was.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ..contract import CompatAnswer, CompatCall, CompatField, CompatRoute, EnvError
from .games import python_index

ROOT_MESSAGE = "This is environment SciWorld."  # not recorded: the wording of AgentGym's BabyAI server
NOT_INITIALIZED = "ERROR: Interface is not initialized -- call reset() before beginning."
STEP_BEFORE_RESET = "'ScienceWorldEnv' object has no attribute 'variationIdx'"
OBSERVATION_BEFORE_RESET = "'observation'"


def documented_difference(difference: str) -> bool:
    """Whether a difference ``replay_trace`` reports is one docs/deviations.md lists: ``/goals`` and ``/state``
    before a reset, where the original leaks a Java stack trace and these answer the simulator's own "not
    initialized" text; ``/close`` of a closed or unknown id, where the original crashes (HTTP 500) and this
    answers ``false``, as the other environments' servers do."""
    label = difference.split(" {", 1)[0]
    if difference.startswith("after close /close: status 200 False,"):
        return True
    return (
        label in ("extra /goals", "extra /state")
        and f"got 200 {{'error': {NOT_INITIALIZED!r}}}" in difference
    )


def _fresh_session() -> dict[str, Any]:
    return {"state": None, "info": {"deleted": False, "done": False}}


def _refusal(call: CompatCall, *, finished_ok: bool = False) -> CompatAnswer | None:
    """The original's ``_check_id``: unknown id, closed ("deleted"), then finished (every route but reset)."""
    if call.session is None:
        return CompatAnswer({"error": f"The id {call.env_idx} is not valid."})
    info = call.session["info"]
    if info.get("deleted"):
        return CompatAnswer({"error": f"The task with environment {call.env_idx} has been deleted."})
    if info.get("done") and not finished_ok:
        return CompatAnswer({"error": f"The task with environment {call.env_idx} has finished."})
    return None


def _error(error: EnvError) -> CompatAnswer:
    return CompatAnswer({"error": str(error)})


def root(call: CompatCall) -> CompatAnswer:
    return CompatAnswer(ROOT_MESSAGE)


def create(call: CompatCall) -> CompatAnswer:
    """A new session, not reset. No JVM starts here (the original starts one per /create): the pool's spares
    are warming, and ``prewarm`` only makes sure they are."""
    prewarm = getattr(call.env, "prewarm", None)
    if callable(prewarm):
        prewarm()
    return CompatAnswer({"id": call.env_idx}, _fresh_session())


def reset(call: CompatCall) -> CompatAnswer:
    """``games[data_idx]`` as the original indexes its list: negative counts from the end, past the end is
    ``list index out of range``. A reset frees the JVM of the session's previous episode at once."""
    refused = _refusal(call, finished_ok=True)
    if refused:
        return refused
    index = python_index(call.args["data_idx"])
    if index is None:
        return CompatAnswer({"error": "list index out of range"})
    try:
        first = call.env.reset(index)
    except EnvError as error:
        return _error(error)
    previous = call.session.get("state")
    if previous is not None:
        with contextlib.suppress(EnvError):
            call.env.close(previous)  # type: ignore[attr-defined]
    info = {
        "deleted": False, "done": first.done, "task_name": first.info["task_name"],
        "var_num": first.info["var_num"], "task_description": first.info["task_description"],
        "observation": first.observation, "reward": int(first.reward), "score": first.info["score"],
    }  # fmt: skip
    body = {
        "task_name": info["task_name"], "var_num": info["var_num"], "task_description": info["task_description"],
        "observation": first.observation, "reward": info["reward"], "score": info["score"], "deleted": False,
        "done": first.done,
    }  # fmt: skip
    return CompatAnswer(body, {"state": first.state, "info": info})


def step(call: CompatCall) -> CompatAnswer:
    refused = _refusal(call)
    if refused:
        return refused
    state = call.session["state"]
    if state is None:
        return CompatAnswer({"error": STEP_BEFORE_RESET})
    try:
        result = call.env.step(state, call.args["action"])
    except EnvError as error:
        return _error(error)
    info = {
        **call.session["info"], "done": result.done, "observation": result.observation,
        "reward": int(result.reward), "score": result.info["score"],
    }  # fmt: skip
    body = {
        "observation": result.observation,
        "reward": info["reward"],
        "score": info["score"],
        "done": result.done,
    }
    return CompatAnswer(body, {"state": result.state, "info": info})


def observation(call: CompatCall) -> CompatAnswer:
    refused = _refusal(call)
    if refused:
        return refused
    if call.session["state"] is None:
        return CompatAnswer({"error": OBSERVATION_BEFORE_RESET})
    return CompatAnswer(call.session["info"]["observation"])


def detail(call: CompatCall) -> CompatAnswer:
    return _refusal(call) or CompatAnswer(call.session["info"])


def task_description(call: CompatCall) -> CompatAnswer:
    refused = _refusal(call)
    if refused:
        return refused
    if call.session["state"] is None:
        return CompatAnswer({"task_description": NOT_INITIALIZED})
    return CompatAnswer({"task_description": call.session["info"]["task_description"]})


def _probe(call: CompatCall, before_reset: Any, read: Any) -> CompatAnswer:
    """A route that reads the live simulator (the session's JVM, or a replay of its episode)."""
    refused = _refusal(call)
    if refused:
        return refused
    state = call.session["state"]
    if state is None:
        return CompatAnswer(before_reset)
    try:
        return CompatAnswer(read(state))
    except EnvError as error:
        return _error(error)


def goals(call: CompatCall) -> CompatAnswer:
    return _probe(call, {"error": NOT_INITIALIZED}, lambda s: {"goals": call.env.goal_progress(s)})  # type: ignore[attr-defined]


def action_hint(call: CompatCall) -> CompatAnswer:
    def read(state: Any) -> dict[str, Any]:
        actions, objects = call.env.action_hint(state)  # type: ignore[attr-defined]
        return {"possible_actions": actions, "possible_objects": objects}

    before = {"possible_actions": [NOT_INITIALIZED], "possible_objects": [NOT_INITIALIZED]}
    return _probe(call, before, read)


def object_tree(call: CompatCall) -> CompatAnswer:
    return _probe(call, {"error": NOT_INITIALIZED}, lambda s: {"object_tree": call.env.object_tree(s)})  # type: ignore[attr-defined]


def state(call: CompatCall) -> CompatAnswer:
    def read(state: Any) -> dict[str, Any]:
        return {**call.env.snapshot(state), "environment_info": call.session["info"]}  # type: ignore[attr-defined]

    return _probe(call, {"error": NOT_INITIALIZED}, read)


def close(call: CompatCall) -> CompatAnswer:
    """``true``, and the session is kept marked deleted (later calls answer "has been deleted"); the episode's
    JVM is freed at once. Closing an unknown or closed id crashes the original (HTTP 500): ``false`` here, as the
    other environments' servers answer it."""
    if call.session is None or call.session["info"].get("deleted"):
        return CompatAnswer(False)
    if call.session["state"] is not None:
        call.env.close(call.session["state"])  # type: ignore[attr-defined]
    return CompatAnswer(True, {"state": None, "info": {**call.session["info"], "deleted": True}})


_ACTION = {"action": CompatField("str", required=True)}
AGENTGYM_ROUTES: tuple[CompatRoute, ...] = (
    CompatRoute("GET", "/", root, needs_id=False, summary="a JSON string naming the environment"),
    CompatRoute(
        "POST", "/create", create, creates=True, needs_id=False, summary="a new session (no JVM started)"
    ),
    CompatRoute(
        "POST",
        "/reset",
        reset,
        {"data_idx": CompatField("int", required=True)},
        summary="games[data_idx] (4,639 task variations; negative counts from the end)",
    ),  # fmt: skip
    CompatRoute("POST", "/step", step, _ACTION, summary="one action: observation, reward, score, done"),
    CompatRoute("GET", "/observation", observation, summary="the last observation (a bare JSON string)"),
    CompatRoute(
        "GET", "/detail", detail, summary="the info dict: task, last observation, reward, score, done"
    ),
    CompatRoute("GET", "/goals", goals, summary="the simulator's goal progress text"),
    CompatRoute("GET", "/task_description", task_description, summary="the task description"),
    CompatRoute("GET", "/action_hint", action_hint, summary="action templates and object names"),
    CompatRoute("GET", "/object_tree", object_tree, summary="the simulator's object tree"),
    CompatRoute(
        "GET", "/state", state, summary="look, inventory, task, goals, 10 actions and objects, moves"
    ),
    CompatRoute(
        "POST", "/close", close, summary="true, and frees the episode's JVM; false when unknown or closed"
    ),
)
