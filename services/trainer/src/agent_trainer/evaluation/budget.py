"""What training allowed an episode of each environment, so that eval's episodes get the same by default.

A model is judged on what it was trained to do: the rounds (env steps) per episode, the new tokens per reply, and
the budget of all later turns together (verl's ``data.max_response_length``: the model's replies and the env's
pages after the first turn; verl stops the episode when it is spent). They come from the environment's own test
config of the installed verl line (``<env>_grpo_test``; WebShop's ``webshop_grpo_test``), composed and resolved as
the trainer resolves it (``AGENTRL_TURN_TOKENS`` and the other knobs from the environment), and the rounds through
``turns.episode_rounds`` (the spec's, or the config's ``environments.<env>.max_rounds``) as both verl paths read
them, so eval and training read one value. ``agent-train eval --max-steps / --max-tokens / --max-response-tokens`` override them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ..config import load_training_config, training_config_dir, turn_tokens
from ..turns import environment_settings, episode_rounds


@dataclass(frozen=True)
class TrainingBudget:
    """One environment's episode budget in training."""

    rounds: int  # env steps per episode
    turn_tokens: int  # new tokens per reply
    response_tokens: int  # every turn after the first together (replies and pages), in tokens


def training_budget(env_id: str, config_dir: Path | None = None) -> TrainingBudget:
    """The budget of ``env_id``'s test config in ``config_dir`` (default: the installed line's configs)."""
    directory = (config_dir or training_config_dir()).resolve()
    return _budget(env_id, str(directory), turn_tokens())


@cache
def _budget(env_id: str, directory: str, default_turn_tokens: int) -> TrainingBudget:
    from omegaconf import OmegaConf

    from .. import envs

    spec = envs.get(env_id)
    name = f"{env_id}_grpo_test"
    path = Path(directory) / f"{name}.yaml"
    if not path.is_file():  # an environment without a config of its own (a plugin): its spec's rounds
        return TrainingBudget(spec.max_rounds, default_turn_tokens, 4096)
    # composed (the environment's file over its base), without verl's defaults: every key read here is the project's
    config = load_training_config(name, directory=Path(directory), with_verl=False)
    response = int(OmegaConf.select(config, "data.max_response_length"))
    tokens = int(environment_settings(config, env_id).get("turn_tokens", default_turn_tokens))
    return TrainingBudget(episode_rounds(spec, config), tokens, response)
