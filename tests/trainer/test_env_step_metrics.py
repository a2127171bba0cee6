"""Per-environment training-step metrics (``env/<env>/...``, ``agent_trainer.verl_main``): the function, and
verl 0.7.1's own ``RayPPOTrainer`` metric step (``ray_trainer.compute_data_metrics``) on a batch that mixes
environments. verl 0.9.1's v1 trainer step is exercised in tests/trainer/verl09/test_mixed_envs_tq.py."""

from __future__ import annotations

import numpy as np
import pytest

from agent_trainer.verl_main import env_step_metrics


def test_each_environment_gets_its_own_means() -> None:
    metrics = env_step_metrics(
        ["textcraft", "webshop", "textcraft", "webshop"],
        {"env_reward": [1.0, 0.5, 0.0, 0.25], "success": [1.0, 0.0, 0.0, 0.0], "steps": [2, 4, 30, 3],
         "invalid_rate": [0.0, 0.25, 0.5, 0.0], "score": [1.0, 0.4, -0.1, 0.25]},
    )  # fmt: skip
    assert metrics["env/textcraft/reward_mean"] == pytest.approx(0.5)
    assert metrics["env/textcraft/success_rate"] == pytest.approx(0.5)
    assert metrics["env/textcraft/steps_mean"] == pytest.approx(16.0)
    assert metrics["env/textcraft/invalid_rate"] == pytest.approx(0.25)
    assert metrics["env/webshop/reward_mean"] == pytest.approx(0.375)
    assert metrics["env/webshop/success_rate"] == 0.0
    assert metrics["env/webshop/score_mean"] == pytest.approx(0.325)
    assert metrics["env/webshop/trajectories"] == 2.0


def test_missing_values_are_left_out_and_a_short_column_is_refused() -> None:
    metrics = env_step_metrics(["babyai", "babyai"], {"success": [None, 1.0], "steps": [float("nan"), 3]})
    assert metrics == {"env/babyai/trajectories": 2.0, "env/babyai/success_rate": 1.0,
                       "env/babyai/steps_mean": 3.0}  # fmt: skip
    with pytest.raises(ValueError, match="success"):
        env_step_metrics(["babyai", "babyai"], {"success": [1.0]})


def test_verl_07_training_steps_log_every_environments_metrics() -> None:
    """verl 0.7.1's trainer loop calls ``ray_trainer.compute_data_metrics`` once per training step with the batch
    whose ``non_tensor_batch`` holds the rows' ``data_source`` and the reward function's keys."""
    pytest.importorskip("verl.trainer.ppo.ray_trainer")
    import torch
    from verl import DataProto
    from verl.trainer.ppo import ray_trainer

    from agent_trainer.verl_main import install_step_metrics

    n, prompt, response = 4, 3, 5
    scores = torch.zeros(n, response)
    scores[:, -1] = torch.tensor([1.0, 0.0, 0.5, 0.0])
    tensors = {"token_level_scores": scores, "token_level_rewards": scores.clone(),
               "advantages": torch.zeros(n, response), "returns": torch.zeros(n, response),
               "responses": torch.ones(n, response, dtype=torch.long),
               "attention_mask": torch.ones(n, prompt + response, dtype=torch.long),
               "response_mask": torch.ones(n, response, dtype=torch.long)}  # fmt: skip
    non_tensors = {"data_source": np.array(["textcraft", "textcraft", "webshop", "webshop"], dtype=object),
                   "env_reward": np.array([1.0, 0.0, 0.5, 0.0]), "success": np.array([1.0, 0.0, 0.0, 0.0]),
                   "steps": np.array([2.0, 4.0, 3.0, 5.0]), "invalid_rate": np.array([0.0, 0.5, 0.0, 0.2]),
                   "__num_turns__": np.array([5, 9, 7, 11])}  # fmt: skip
    original = ray_trainer.compute_data_metrics
    try:
        install_step_metrics()
        metrics = ray_trainer.compute_data_metrics(
            batch=DataProto.from_dict(tensors=tensors, non_tensors=non_tensors), use_critic=False
        )
    finally:
        ray_trainer.compute_data_metrics = original
    assert metrics["env/textcraft/reward_mean"] == pytest.approx(0.5)
    assert metrics["env/textcraft/success_rate"] == pytest.approx(0.5)
    assert metrics["env/textcraft/invalid_rate"] == pytest.approx(0.25)
    assert metrics["env/webshop/steps_mean"] == pytest.approx(4.0)
    assert metrics["env/webshop/reward_mean"] == pytest.approx(0.25)
    assert metrics["critic/score/mean"] == pytest.approx(0.375)  # verl's own metrics are still there
