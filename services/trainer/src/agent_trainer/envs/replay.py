"""An episode's score recomputed from the environment itself, in process: what a checker compares with the reward
the trainer used (the rehearsal's ``reward_matches_env``).

``replay_score(env_id, task, replies)`` resets the environment's core (``agent_envs.envs.registry``) on ``task``
and plays each reply as the agent loop does: the spec parses it, a reply the client answers itself sends nothing,
the spec judges the step, each turn adds the change in the episode's reward less ``penalty`` for a reply without a
usable action, and the episode stops where the spec says it ends. A step the environment refuses ends it with the
reward paid so far taken back (the loop's ``on_env_error: terminate``).

Any environment's core will do, WebShop's included (``WebShopTextEnv``: its tasks are the goals of the core's
default goal set; ``registry.make("webshop")`` opens the catalog the service's settings name, ``WEBSHOP_CATALOG``;
pass ``core`` for another catalog or goal set).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import get
from .spec import Outcome


def replay_score(env_id: str, task: int, replies: Sequence[str], penalty: float = 0.0, core: Any = None
                 ) -> dict[str, float]:  # fmt: skip
    """``{"score", "env_reward", "success", "steps"}`` of playing ``replies`` on ``task`` in ``core`` (default:
    the registry's core of ``env_id``)."""
    from agent_envs.envs.contract import EnvError

    spec = get(env_id)
    if core is None:
        from agent_envs.envs import registry

        core = registry.make(env_id)
    state = core.reset(task).state
    score = paid = 0.0
    steps = 0
    success = False
    for reply in replies:
        parsed = spec.parse(reply)
        if parsed.action is None:
            outcome = Outcome.not_sent()
        else:
            try:
                step = core.step(state, parsed.action)
            except EnvError:
                score -= paid
                paid, success = 0.0, False
                break
            state = step.state
            result = {"observation": step.observation, "reward": step.reward, "done": step.done,
                      "info": dict(step.info)}  # fmt: skip
            outcome = spec.outcome(result, parsed)
        steps += 1
        score += outcome.env_reward - paid - (0.0 if parsed.well_formed else penalty)
        paid, success = outcome.env_reward, outcome.success
        if outcome.done:
            break
    return {"score": score, "env_reward": paid, "success": 1.0 if success else 0.0, "steps": float(steps)}
