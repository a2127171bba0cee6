"""AgentGym's TextCraft server (``agentenv-textcraft``) as pure handlers over stored sessions.

A stored session is JSON: ``{"state": <core state>, "observation": str, "reward": 0|1, "done": bool}`` (the
last answer, which ``/observation`` and ``/detail`` return). Answers are the original's, field for field; its
errors are HTTP 200 ``{"error": "..."}`` as there. Differences (docs/deviations.md, "TextCraft"):
``GET /commands`` and ``GET /goal`` crash the original (HTTP 500); here they answer 404 with a message.
"""

from __future__ import annotations

from typing import Any

from ..agentgym import close_session
from ..contract import CompatAnswer, CompatCall, CompatField, CompatRoute, EnvError, Transition

ROOT_MESSAGE = "This is environment TextCraft."  # not recorded: BabyAI's server's wording, for TextCraft


def _invalid(call: CompatCall) -> CompatAnswer:
    return CompatAnswer({"error": f"The id {call.env_idx} is not valid."})


def _session(transition: Transition) -> dict[str, Any]:
    return {
        "state": transition.state,
        "observation": transition.observation,
        "reward": int(transition.reward),
        "done": transition.done,
    }


def _reset(call: CompatCall, data_idx: int) -> CompatAnswer:
    """Goal ``data_idx % 544`` (Python's modulo: -1 is the last goal), as the original indexes its goal list."""
    try:
        transition = call.env.reset(data_idx % call.env.task_count())
    except EnvError as error:
        return CompatAnswer({"error": str(error)})
    body = {"id": call.env_idx, "observation": transition.observation, "done": False, "reward": 0}
    return CompatAnswer(body, _session(transition))


def root(call: CompatCall) -> CompatAnswer:
    return CompatAnswer(ROOT_MESSAGE)


def create(call: CompatCall) -> CompatAnswer:
    """A new session reset to goal ``id % 544``: the original ignores ``commands`` and ``goal`` and resets the new
    env with ``data_idx = id`` (its ids count from 0; ours may be random, which only changes this first goal)."""
    return _reset(call, call.env_idx)


def reset(call: CompatCall) -> CompatAnswer:
    data_idx = call.args.get("data_idx", 0)
    if data_idx is None:  # the original's model is ``data_idx: int = 0``: null is a validation error there
        return CompatAnswer(
            {"error": "validation_error", "detail": "data_idx: an integer, not null"}, status=422
        )
    if call.session is None:
        return _invalid(call)
    return _reset(call, data_idx)


def step(call: CompatCall) -> CompatAnswer:
    """No done lock, as in the original: stepping on after success works, and crafting the goal again pays again."""
    if call.session is None:
        return _invalid(call)
    try:
        transition = call.env.step(call.session["state"], call.args["action"])
    except EnvError as error:
        return CompatAnswer({"error": str(error)})
    body = {"observation": transition.observation, "reward": int(transition.reward), "done": transition.done}
    return CompatAnswer(body, _session(transition))


def observation(call: CompatCall) -> CompatAnswer:
    if call.session is None:
        return _invalid(call)
    return CompatAnswer(call.session["observation"])


def detail(call: CompatCall) -> CompatAnswer:
    if call.session is None:
        return _invalid(call)
    session = call.session
    return CompatAnswer(
        {
            "observation": session["observation"],
            "done": session["done"],
            "reward": session["reward"],
            "deleted": False,
        }
    )


def _missing(name: str) -> Any:
    def handler(call: CompatCall) -> CompatAnswer:
        return CompatAnswer(
            {
                "error": "not_implemented",
                "detail": f"AgentGym's TextCraft server has no working GET /{name} (it answers HTTP 500: its "
                f"wrapper lacks get_{name}); the crafting commands and the goal are in the reset observation "
                "(GET /observation right after /reset, or GET /detail)",
            },
            status=404,
        )

    handler.__name__ = name
    return handler


AGENTGYM_ROUTES: tuple[CompatRoute, ...] = (
    CompatRoute("GET", "/", root, needs_id=False, summary="a JSON string naming the environment"),
    # The client sends {"minecraft_dir", "commands", "goal"}: the original validates commands/goal as optional
    # strings, then ignores all three.
    CompatRoute(
        "POST",
        "/create",
        create,
        {"commands": CompatField("str_or_null"), "goal": CompatField("str_or_null")},
        creates=True,
        needs_id=False,
        summary="a new session at goal id % 544",
    ),
    CompatRoute("POST", "/reset", reset, {"data_idx": CompatField("int", 0)}, summary="goal data_idx % 544"),
    CompatRoute("POST", "/step", step, {"action": CompatField("str", required=True)}, summary="one command"),
    CompatRoute("GET", "/observation", observation, summary="the last observation (a bare JSON string)"),
    CompatRoute("GET", "/detail", detail, summary="observation, done, reward, deleted"),
    CompatRoute("GET", "/commands", _missing("commands"), summary="404 (the original: HTTP 500)"),
    CompatRoute("GET", "/goal", _missing("goal"), summary="404 (the original: HTTP 500)"),
    CompatRoute("POST", "/close", close_session, summary="true; false when the id is unknown or closed"),
)
