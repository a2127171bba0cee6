"""The reward function verl calls once per trajectory (``reward.custom_reward_function``).

verl 0.7.1's reward loop calls ``compute_score(data_source, solution_str, ground_truth, extra_info)`` with the
agent loop's ``extra_fields`` merged into ``extra_info``; ToolAgentLoop puts the interaction's per-turn
rewards there as ``turn_scores``. The episode's environment reward is the purchase step's reward (0 when the
trajectory ended without a purchase), so the score is the sum of the turn rewards (equal to the env reward
unless an invalid-reply penalty is configured).

Configure with::

    reward:
      custom_reward_function:
        path: pkg://agent_trainer.reward
        name: compute_score

The returned dict's extra keys are logged by verl as metrics; every call returns the same keys.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# WebShop's success rule (the full reward): what episode_summary falls back on for turn scores that carry no success
# of their own (plain floats; a turn that played nothing, such as an expired episode's). The reward function was
# WebShop's before every environment had a spec; a turn played through a spec (episode.play_turn) carries its own.
from .envs.webshop import is_success

METRIC_KEYS = ("score", "env_reward", "success", "purchased", "steps", "invalid_actions", "invalid_rate")


def _as_float(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if math.isfinite(number) else 0.0


def episode_summary(turn_scores: Sequence[Any] | None) -> dict[str, float]:
    """Score and metrics of one trajectory from its ``turn_scores`` (``TurnScore`` or plain floats).

    The agent loop's TurnScores carry ``success`` (its environment's rule) and, on every turn, ``env_reward`` =
    the episode's reward if it ended there: the last turn then holds the episode's reward and success, whatever
    ended it (a purchase, the round budget, an error); so do the 0.7.1 interaction's, played by the same
    ``episode.play_turn``. Turn scores whose last leaves ``success`` unset (plain floats, an expired episode's
    last turn): WebShop's rules apply (the last ``done`` turn pays; success is the full reward). ``purchased``
    is the last turn's ``purchased``: the environment itself ended the episode (WebShop: a purchase; TextCraft:
    the goal crafted; BabyAI: the level ended; SciWorld: done). ``steps`` counts the rounds played.
    """
    scores = list(turn_scores) if turn_scores is not None else []
    steps = sum(1 for s in scores if getattr(s, "stepped", True))
    score = sum(_as_float(s) for s in scores)
    finals = [s for s in scores if getattr(s, "done", False)]
    last = scores[-1] if scores else None
    solved = getattr(last, "success", None)
    if (
        solved is not None
    ):  # the agent loop's TurnScores: the last turn holds the episode's reward and success
        env_reward = _as_float(getattr(last, "env_reward", 0.0))
        purchased = 1.0 if getattr(last, "purchased", False) else 0.0
    elif finals:  # TurnScores: the last turn says whether it was a purchase (not a truncation or an error)
        env_reward = _as_float(getattr(finals[-1], "env_reward", finals[-1]))
        purchased = 1.0 if getattr(finals[-1], "purchased", False) else 0.0
    else:  # plain floats: only the purchase step earns a non-zero env reward
        env_reward = max((_as_float(s) for s in scores), default=0.0)
        env_reward = max(env_reward, 0.0)
        purchased = 1.0 if env_reward > 0 else 0.0
    invalid = sum(1 for s in scores if getattr(s, "invalid", False))
    return {
        "score": score,
        "env_reward": env_reward,
        "success": 1.0 if (is_success(env_reward) if solved is None else solved) else 0.0,
        "purchased": purchased,
        "steps": float(steps),
        "invalid_actions": float(invalid),
        "invalid_rate": invalid / steps if steps else 0.0,
    }


def compute_score(
    data_source: str | None = None,
    solution_str: str | None = None,
    ground_truth: Any = None,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """``{"score": episode reward, env_reward, success, purchased, steps, invalid_actions, invalid_rate}``."""
    turn_scores = (extra_info or {}).get("turn_scores")
    if turn_scores is not None and not isinstance(turn_scores, Sequence):
        turn_scores = list(turn_scores)  # numpy arrays after a round trip through a DataProto
    return episode_summary(turn_scores)
