"""An episode's length: one value per environment, one override, and what verl's turn limit means in env steps.

The value is the environment's rounds (``EnvSpec.max_rounds``: model turns per episode, each one env step;
WebShop 24, TextCraft 30, BabyAI 20, SciWorld 20); its one override is a training config's
``environments.<env>.max_rounds`` (:func:`rounds`). The agent loops, the 0.7.1 interaction route, the preflight,
the rehearsal and eval (which reads the environment's test config) all take it from there.

verl 0.7.1's ToolAgentLoop counts assistant replies: after the N-th reply it stops (``assistant_turns >=
max_assistant_turns``) before that reply reaches the interaction. So ``max_assistant_turns = N`` allows
N - 1 environment steps (actions): a config's ``max_assistant_turns`` must be at least its longest episode's
rounds plus one (the preflight checks it), or verl would cut episodes short.
"""

from __future__ import annotations

from typing import Any

from .config import environment_settings


def env_steps_for_turns(max_assistant_turns: int) -> int:
    """Environment steps (actions) a trajectory can take under ``multi_turn.max_assistant_turns``."""
    if max_assistant_turns < 2:
        raise ValueError(
            f"max_assistant_turns = {max_assistant_turns} allows no environment step (it must be at least 2)"
        )
    return max_assistant_turns - 1


def rounds(env_id: str, default: int, trainer_config: Any = None) -> int:
    """Model turns per episode of ``env_id``: the training config's ``environments.<env_id>.max_rounds`` where it
    has one, else ``default`` (the spec's rounds)."""
    given = environment_settings(trainer_config, env_id).get("max_rounds") if trainer_config is not None else None
    value = int(given) if given is not None else int(default)
    if value < 1:
        raise ValueError(f"{env_id}: max_rounds ({value}) must be at least 1")
    return value


# configs/webshop_grpo_{test,train}.yaml: multi_turn.max_assistant_turns = 25 (the guides' value) -> 24 steps
TRAINING_MAX_ASSISTANT_TURNS = 25
TRAINING_ENV_STEPS = env_steps_for_turns(TRAINING_MAX_ASSISTANT_TURNS)
