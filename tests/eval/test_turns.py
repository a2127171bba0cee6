"""Training, preflight and eval count the same thing: env steps = verl's max_assistant_turns - 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_trainer.config import load_training_config
from agent_trainer.eval_cli import max_env_steps
from agent_trainer.turns import TRAINING_ENV_STEPS, TRAINING_MAX_ASSISTANT_TURNS, env_steps_for_turns

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("line", ["", "verl09"])
@pytest.mark.parametrize("name", ["webshop_grpo_test", "webshop_grpo_train"])
def test_eval_default_is_what_each_training_config_allows(name: str, line: str) -> None:
    config = load_training_config(
        name, directory=CONFIGS / line, with_verl=False
    )  # as composed (file + base)
    multi_turn = config.actor_rollout_ref.rollout.multi_turn
    assert multi_turn["max_assistant_turns"] == TRAINING_MAX_ASSISTANT_TURNS
    assert (
        env_steps_for_turns(multi_turn["max_assistant_turns"])
        == max_env_steps(None, None)
        == TRAINING_ENV_STEPS
    )


def test_max_turns_counts_like_verl_and_max_steps_counts_actions() -> None:
    assert max_env_steps(None, 25) == 24 and max_env_steps(None, 2) == 1
    assert max_env_steps(7, None) == 7
    with pytest.raises(ValueError, match="allows no environment step"):
        max_env_steps(None, 1)
