"""verl 0.9.1's default rollout path with the WebShop agent loop, in-process: the agent loop's real output goes
through verl's own ``AgentLoopWorkerTQ`` (``_agent_loop_postprocess``) into a real TransferQueue on a local Ray,
then through the v1 trainer's replay buffer, GRPO advantage and per-step metric computation
(``PPOTrainer._compute_metrics``), which a 0.9.1 run executes at the end of every training step."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transfer_queue", reason="verl 0.9.1's v1 trainer needs TransferQueue: make setup")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_model_dir(generated_catalog_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agent_trainer.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), generated_catalog_dir)


def test_the_trainers_metric_step_accepts_the_agent_loops_trajectories(
    in_process_env: Any, generated_catalog_dir: Path, tiny_model_dir: Path, expert_plans_generated: dict,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils import hf_tokenizer

    from agent_trainer.config import AGENT_LOOP_NAME, TRAINING_CONFIGS, training_config_dir
    from agent_trainer.envs.webshop.data import build_dataset
    from agent_trainer.harness import ScriptedServer, local_transfer_queue, run_tq_rollouts
    from agent_trainer.preflight import agent_loop_overrides, compose_training_config

    monkeypatch.setenv("AGENTRL_URL", "http://webshop.invalid")  # the in-process env answers whatever the URL
    plans = dict(list(expert_plans_generated.items())[:2])
    train_file = tmp_path / "train.parquet"
    build_dataset(generated_catalog_dir, "train", train_file, goal_set="synthetic", goal_ids=list(plans),
                  progress=False, agent_name=AGENT_LOOP_NAME)  # fmt: skip
    overrides = agent_loop_overrides(tiny_model_dir, train_file, 2, 9)
    _, config = compose_training_config(TRAINING_CONFIGS["test"], overrides, training_config_dir())
    OmegaConf.resolve(config)
    tokenizer = hf_tokenizer(str(tiny_model_dir))
    dataset = create_rl_dataset([str(train_file)], config.data, tokenizer, None, is_train=True)
    samples = [dataset[i] for i in range(len(dataset))]
    server = ScriptedServer(tokenizer, {s["extra_info"]["instruction"]: plans[int(s["extra_info"]["goal"])]
                                        for s in samples})  # fmt: skip

    with local_transfer_queue(config):
        result = asyncio.run(run_tq_rollouts(config, samples, server, global_steps=1))

    assert result["agent_loop_worker"] == "AgentLoopWorkerTQ"
    assert result["step_metrics_error"] is None
    assert result["scores"] == [1.0] * 4  # 2 prompts x rollout.n 2, each put into TransferQueue by verl
    # the weights version of each trajectory (step 1 rolls out on version 0), as verl's worker tagged it from the
    # loop's extra_fields
    assert {(t["min_global_steps"], t["max_global_steps"]) for t in result["tags"]} == {(0, 0)}
    metrics = result["step_metrics"]
    assert metrics["training/off_policy/trajectory_staleness/max"] == 0.0
    assert metrics["critic/score/mean"] == 1.0 and metrics["training/global_step"] == 1.0
    assert metrics["response_length/mean"] > 0
