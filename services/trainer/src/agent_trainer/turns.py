"""An episode's length: what verl's turn limit means in environment steps, and the rounds each environment's episode
gets, one definition for training (both verl paths), preflight and eval.

verl 0.7.1's ToolAgentLoop counts assistant replies: after the N-th reply it stops (``assistant_turns >=
max_assistant_turns``) before that reply reaches the interaction. So ``max_assistant_turns = N`` allows
N - 1 environment steps (actions), and a goal whose shortest plan has N actions can never be solved: a 0.7.1
config's ``max_assistant_turns`` must be at least its longest episode's rounds + 1. It is verl's bound, never an
episode length of its own.

The episode length is one value with one override (:func:`episode_rounds`): the environment's spec's ``max_rounds``,
unless the training config's ``environments.<env>.max_rounds`` says otherwise.
"""

from __future__ import annotations

from typing import Any, Protocol

from .config import ENVIRONMENT_SETTINGS, ENVIRONMENTS_KEY


def env_steps_for_turns(max_assistant_turns: int) -> int:
    """Environment steps (actions) a trajectory can take under ``multi_turn.max_assistant_turns``."""
    if max_assistant_turns < 2:
        raise ValueError(
            f"max_assistant_turns = {max_assistant_turns} allows no environment step (it must be at least 2)"
        )
    return max_assistant_turns - 1


# configs/webshop_grpo_{test,train}.yaml: multi_turn.max_assistant_turns = 25 (the guides' value) -> 24 steps,
# WebShop's rounds (its spec's max_rounds, envs.webshop.MAX_ROUNDS, is this number).
TRAINING_MAX_ASSISTANT_TURNS = 25
TRAINING_ENV_STEPS = env_steps_for_turns(TRAINING_MAX_ASSISTANT_TURNS)


class RoundsOf(Protocol):
    """What :func:`episode_rounds` reads of an environment's spec (``agent_trainer.envs.EnvSpec``)."""

    @property
    def env_id(self) -> str: ...

    @property
    def max_rounds(self) -> int: ...


def environment_settings(trainer_config: Any, env_id: str) -> dict[str, Any]:
    """The training config's ``environments.<env_id>`` block, its set keys only (empty without one)."""
    section = trainer_config.get(ENVIRONMENTS_KEY) if hasattr(trainer_config, "get") else None
    block = (section or {}).get(env_id) or {}
    return {key: block.get(key) for key in ENVIRONMENT_SETTINGS if block.get(key) is not None}


def episode_rounds(spec: RoundsOf, trainer_config: Any) -> int:
    """The model turns (each one env step) an episode of ``spec``'s environment gets in a run of ``trainer_config``:
    the config's ``environments.<env_id>.max_rounds`` where it sets one (the run's own file has the last word), else
    the spec's ``max_rounds``. The agent loop (both verl lines), the 0.7.1 interaction (through
    ``tool_agent_loop``) and eval's training budget all read it here, so one config means one episode length."""
    rounds = environment_settings(trainer_config, spec.env_id).get("max_rounds", spec.max_rounds)
    if isinstance(rounds, bool) or int(rounds) < 1:
        raise ValueError(
            f"{spec.env_id}: max_rounds = {rounds!r} (environments.{spec.env_id}.max_rounds, else the spec's) must "
            "be a positive integer"
        )
    return int(rounds)
