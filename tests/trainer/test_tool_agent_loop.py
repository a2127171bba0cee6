"""The 0.7 line's `tool_agent` is ``EnvToolAgentLoop`` (configs/agent_loop.yaml overrides verl's
built-in entry): verl's own ``AgentLoopWorker`` runs ``ToolAgentLoop`` + ``WebshopInteraction`` with the
per-turn budget training and eval share, and the chat template's separator before every env page."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl.interactions", reason="the interaction path is verl 0.7.x only")

from agent_trainer.harness import ScriptedServer

pytestmark = pytest.mark.slow


class BudgetRecordingServer(ScriptedServer):
    """The scripted oracle, recording each request's ``max_tokens``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_tokens: list[int | None] = []

    async def generate(self, request_id: str, *, sampling_params: Any, **kwargs: Any) -> Any:
        self.max_tokens.append(sampling_params.get("max_tokens"))
        return await super().generate(request_id, sampling_params=sampling_params, **kwargs)


def test_tool_agent_turns_are_capped_and_separated_as_the_chat_template_does(
    in_process_env: Any, generated_catalog_dir: Path, expert_plans_generated: dict, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from omegaconf import OmegaConf
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.trainer.main_ppo import create_rl_dataset
    from verl.utils import hf_tokenizer

    from agent_trainer.config import AGENT_LOOP_CONFIG, INTERACTION_CONFIG, TURN_TOKENS, config_dir
    from agent_trainer.envs.webshop.data import build_dataset
    from agent_trainer.harness import LocalAgentLoopWorker, generation_batch
    from agent_trainer.preflight import compose_training_config
    from agent_trainer.tiny_model import build_tiny_model
    from agent_trainer.tool_agent_loop import EnvToolAgentLoop

    monkeypatch.setenv("AGENTRL_URL", "http://webshop.invalid")  # the in-process env answers whatever the URL
    monkeypatch.delenv("AGENTRL_TURN_TOKENS", raising=False)
    plans = dict(list(expert_plans_generated.items())[:2])
    model_dir = build_tiny_model(tmp_path / "tiny", generated_catalog_dir)
    train_file = tmp_path / "train.parquet"
    build_dataset(generated_catalog_dir, "train", train_file, goal_set="synthetic", goal_ids=list(plans),
                  progress=False)  # fmt: skip
    overrides = [f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={train_file}",
                 f"data.val_files={train_file}", "data.train_max_samples=-1", "actor_rollout_ref.rollout.n=1",
                 f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={config_dir() / INTERACTION_CONFIG}",
                 f"actor_rollout_ref.rollout.agent.agent_loop_config_path={config_dir() / AGENT_LOOP_CONFIG}"]  # fmt: skip
    _, config = compose_training_config("webshop_grpo_test", overrides, config_dir())
    OmegaConf.resolve(config)
    tokenizer = hf_tokenizer(str(model_dir))
    dataset = create_rl_dataset([str(train_file)], config.data, tokenizer, None, is_train=True)
    samples = [dataset[i] for i in range(len(dataset))]
    assert {s["agent_name"] for s in samples} == {"tool_agent"}
    server = BudgetRecordingServer(tokenizer, {s["extra_info"]["instruction"]: plans[int(s["extra_info"]["goal"])]
                                               for s in samples})  # fmt: skip
    from verl.experimental.agent_loop import agent_loop as verl_agent_loop

    built: list[type] = []
    original = verl_agent_loop.hydra.utils.instantiate
    monkeypatch.setattr(verl_agent_loop.hydra.utils, "instantiate",
                        lambda *a, **k: built.append(type(loop := original(*a, **k))) or loop)  # fmt: skip

    async def roll() -> Any:
        from agent_trainer.interaction import close_shared_clients

        worker = LocalAgentLoopWorker(config, server, RewardLoopWorker(config))  # binds the running loop
        try:
            return await worker.generate_sequences(generation_batch(samples, 1))
        finally:
            await close_shared_clients()

    output = asyncio.run(roll())

    from verl.experimental.agent_loop.agent_loop import AgentLoopBase

    assert {cls for cls in built if issubclass(cls, AgentLoopBase)} == {EnvToolAgentLoop}
    assert output.batch["rm_scores"].sum(-1).tolist() == [1.0, 1.0]  # the oracle still earns its reward
    # every model turn asked for the shared per-turn budget (or what was left of the response budget)
    assert server.max_tokens and max(server.max_tokens) == TURN_TOKENS
    for row in range(len(samples)):
        mask = output.batch["attention_mask"][row].bool()
        ids = output.batch["input_ids"][row][mask].tolist()
        text = tokenizer.decode(ids, skip_special_tokens=False)
        # env pages follow the model's end-of-turn with the template's separator, never glued to it
        assert "<|im_end|><|im_start|>" not in text
        assert text.count("<|im_end|>\n<|im_start|>user") >= 2
