"""WebShopAgentLoop on the installed verl (0.7.1 in .venv, 0.9.1 in .venv-verl09: `make test` runs this file in both).

The loop is built the way verl's AgentLoopWorker builds it (hydra.utils.instantiate of the entry in
configs/agent_loop.yaml with verl's keyword arguments), from the real composed training config, and
plays against the env service in-process (ASGI) with a scripted policy on the tiny local tokenizer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl", reason="the trainer package needs verl: make setup")

from verl.utils import hf_tokenizer

from agent_trainer import envs
from agent_trainer.config import AGENT_LOOP_CONFIG, AGENT_LOOP_NAME, config_dir
from agent_trainer.envs.webshop import prompts

pytestmark = pytest.mark.slow
MAX_TURNS = 9  # rollout.multi_turn.max_assistant_turns of the composed config


class PlanServer:
    """Replies ``Action: <plan[k]>`` at the k-th call of a request id (then ``click[buy now]``)."""

    def __init__(self, tokenizer: Any, plan: Sequence[str]) -> None:
        self.tokenizer, self.plan = tokenizer, list(plan)
        self.turns: dict[str, int] = {}
        self.max_tokens: list[int] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: Mapping[str, Any],
                       **kwargs: Any) -> Any:  # fmt: skip
        from verl.workers.rollout.replica import TokenOutput

        turn = self.turns.get(request_id, 0)
        self.turns[request_id] = turn + 1
        self.max_tokens.append(int(sampling_params["max_tokens"]))
        action = self.plan[turn] if turn < len(self.plan) else "click[buy now]"
        text = action if action.startswith("I ") else f"Let me act.\nAction: {action}"
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
        ids = ids[: int(sampling_params["max_tokens"])]
        log_probs = [-0.5] * len(ids) if sampling_params.get("logprobs") else None
        return TokenOutput(token_ids=ids, log_probs=log_probs, stop_reason="completed")


@pytest.fixture(scope="module")
def tiny_model_dir(generated_catalog_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agent_trainer.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), generated_catalog_dir)


@pytest.fixture(scope="module")
def rollout_config(tiny_model_dir: Path) -> Any:
    from omegaconf import OmegaConf

    from agent_trainer.config import TRAINING_CONFIGS, training_config_dir
    from agent_trainer.preflight import agent_loop_overrides, compose_training_config

    overrides = agent_loop_overrides(tiny_model_dir, tiny_model_dir / "unused.parquet", 1, MAX_TURNS)
    _, config = compose_training_config(TRAINING_CONFIGS["test"], overrides, training_config_dir())
    OmegaConf.resolve(config)
    return config


def make_loop(config: Any, server: Any, tiny_model_dir: Path, response_length: int | None = None,
              rounds: int | None = None, **settings: Any) -> Any:  # fmt: skip
    """What AgentLoopWorker._run_agent_loop does: instantiate the YAML entry with verl's keyword arguments
    (``rounds``: the training config's ``environments.webshop.max_rounds``; a ``turn_tokens`` setting goes there
    too, as ``environments.webshop.turn_tokens``, which wins over the entry's, as in a run)."""
    import copy

    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils import hf_tokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = copy.deepcopy(config)
    if response_length is not None:
        config.actor_rollout_ref.rollout.response_length = response_length
    if rounds is not None:
        OmegaConf.update(config, "environments.webshop.max_rounds", rounds, force_add=True)
    if "turn_tokens" in settings:
        OmegaConf.update(config, "environments.webshop.turn_tokens", settings["turn_tokens"], force_add=True)
    entries = {e.name: e for e in OmegaConf.load(config_dir() / AGENT_LOOP_CONFIG)}
    entry = OmegaConf.merge(entries[AGENT_LOOP_NAME], settings)
    extra = {"hf_model_type": "qwen2", "tools": None}  # verl 0.9.1 passes these; 0.7.1's base swallows them
    return hydra.utils.instantiate(entry, trainer_config=DictConfigWrap(config), server_manager=server,
                                   tokenizer=hf_tokenizer(str(tiny_model_dir)), processor=None,
                                   dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data), **extra)  # fmt: skip


def row(goal: int) -> dict[str, Any]:
    return {"raw_prompt": [{"role": "system", "content": prompts.SYSTEM_PROMPT},
                           {"role": "user", "content": "replaced by the env's first page"}],
            "extra_info": {"goal": goal, "goal_set": "synthetic", "split": "train"}}  # fmt: skip


def play(make: Any, goal: int, logprobs: bool = False) -> Any:
    """Build the loop inside the event loop (verl does; the base class binds the running loop) and run it."""
    from agent_trainer.agent_loop import record_trajectories
    from agent_trainer.interaction import close_shared_clients

    async def main() -> Any:
        loop = make()
        try:
            with record_trajectories() as records:
                output = await loop.run({"temperature": 1.0, "logprobs": logprobs}, **row(goal))
            return output, records[0]
        finally:
            await close_shared_clients()

    return asyncio.run(main())


def test_the_oracle_plan_earns_reward_one_with_env_tokens_masked(
    in_process_env, rollout_config, tiny_model_dir, expert_plans_generated
) -> None:
    from agent_trainer.agent_tokens import turn_separator_ids
    from agent_trainer.interaction import EPISODES

    goal, plan = next(iter(expert_plans_generated.items()))
    tokenizer = hf_tokenizer(str(tiny_model_dir))
    server = PlanServer(tokenizer, plan)
    output, record = play(lambda: make_loop(rollout_config, server, tiny_model_dir), goal, logprobs=True)

    assert output.reward_score == 1.0
    info = output.extra_fields["reward_extra_info"]
    assert info["success"] == 1.0 and info["steps"] == len(plan) and info["invalid_actions"] == 0.0
    assert info["env_error"] == 0.0 and record["stop"] == "done"
    # the first user turn is the env's start page, not the row's placeholder
    assert record["messages"][1]["content"].startswith("Instruction: ")
    # len(plan) assistant turns, the first user turn and one env page after every step but the last
    assert output.num_turns == 2 * len(plan)
    # mask 1 exactly on the model's tokens, 0 on the env pages; logprobs aligned
    mask, response = output.response_mask, output.response_ids
    assert len(mask) == len(response) == len(output.response_logprobs)
    model = [t for t, m in zip(response, mask, strict=True) if m == 1]
    assert model == [t for turn in record["generated"] for t in turn]
    assert 0 in mask and mask[-1] == 1 and response[-1] == tokenizer.eos_token_id
    assert all(lp == -0.5 for lp, m in zip(output.response_logprobs, mask, strict=True) if m == 1)
    assert all(lp == 0.0 for lp, m in zip(output.response_logprobs, mask, strict=True) if m == 0)
    env_text = tokenizer.decode([t for t, m in zip(response, mask, strict=True) if m == 0])
    assert "Page: " in env_text and "<|im_start|>user" in env_text
    # the stream is the chat template's render of the conversation (minus the separator after the last turn)
    render = tokenizer.apply_chat_template(record["messages"], tokenize=True, add_generation_prompt=False)
    render = list(render["input_ids"] if isinstance(render, Mapping) else render)
    stream = output.prompt_ids + response
    assert render == stream + turn_separator_ids(tokenizer)
    assert len(EPISODES) == 0


def test_the_step_limit_allows_exactly_the_rounds_env_steps(
    in_process_env, rollout_config, tiny_model_dir
) -> None:
    from agent_trainer.interaction import EPISODES

    server = PlanServer(hf_tokenizer(str(tiny_model_dir)), ["search[tea]"] * 10)
    output, record = play(lambda: make_loop(rollout_config, server, tiny_model_dir, rounds=3), 1500)
    info = output.extra_fields["reward_extra_info"]
    assert record["stop"] == "step_limit" and info["steps"] == 3 and len(record["generated"]) == 3
    assert output.reward_score == 0.0 and info["success"] == 0.0
    assert output.num_turns == 1 + 3 + 2  # first page, 3 replies, 2 pages between them
    assert output.response_mask[-1] == 1  # ends on the model's turn, where verl puts the reward
    assert len(EPISODES) == 0


def test_the_episode_gets_the_configs_rounds_whatever_max_assistant_turns_allows(
    in_process_env, rollout_config, tiny_model_dir
) -> None:
    """The rounds are WebShop's (its spec's 24, restated by the configs) or ``environments.webshop.max_rounds``;
    verl's ``max_assistant_turns`` (MAX_TURNS here) is no episode length of the agent loop's."""
    from omegaconf import OmegaConf

    assert rollout_config.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == MAX_TURNS
    assert make_loop(rollout_config, None, tiny_model_dir).max_rounds == envs.get("webshop").max_rounds == 24
    bare = OmegaConf.masked_copy(rollout_config, [k for k in rollout_config if k != "environments"])
    assert make_loop(bare, None, tiny_model_dir).max_rounds == 24  # no environments block: the spec's
    server = PlanServer(hf_tokenizer(str(tiny_model_dir)), ["search[tea]"] * 20)
    output, record = play(
        lambda: make_loop(rollout_config, server, tiny_model_dir, rounds=MAX_TURNS + 2), 1500
    )
    assert record["stop"] == "step_limit"
    assert output.extra_fields["reward_extra_info"]["steps"] == len(record["generated"]) == MAX_TURNS + 2


def test_replies_without_an_action_are_counted_and_still_step(
    in_process_env, rollout_config, tiny_model_dir
) -> None:
    server = PlanServer(hf_tokenizer(str(tiny_model_dir)), ["I do not know."] * 10)
    output, record = play(
        lambda: make_loop(rollout_config, server, tiny_model_dir, rounds=2, invalid_action_penalty=0.25),
        1500,
    )
    info = output.extra_fields["reward_extra_info"]
    assert info["invalid_actions"] == 2.0 and info["steps"] == 2.0 and info["invalid_rate"] == 1.0
    assert output.reward_score == -0.5
    assert prompts.INVALID_REPLY_MESSAGE in record["messages"][3]["content"]


def test_the_response_budget_ends_the_episode_cleanly(in_process_env, rollout_config, tiny_model_dir) -> None:
    from agent_trainer.interaction import EPISODES

    server = PlanServer(hf_tokenizer(str(tiny_model_dir)), ["search[tea]"] * 50)
    output, record = play(
        lambda: make_loop(
            rollout_config, server, tiny_model_dir, response_length=300, rounds=50, turn_tokens=16
        ),
        1500,
    )
    assert record["stop"] == "budget" and len(record["generated"]) < 50
    assert len(output.response_ids) <= 300 and len(output.response_mask) == len(output.response_ids)
    assert output.response_mask[-1] == 1  # the page that did not fit was not appended
    assert max(server.max_tokens) == 16 and min(server.max_tokens) >= 1  # the per-turn cap
    assert len(EPISODES) == 0


def test_a_refused_step_ends_with_reward_zero_and_env_error(
    in_process_env, rollout_config, tiny_model_dir, monkeypatch
) -> None:
    from agent_envs.client import ServiceRequestError, native
    from agent_trainer import interaction

    async def refuse(self: Any, state: str, action: str) -> Any:
        raise ServiceRequestError(400, "bad_state", "forged")

    monkeypatch.setattr(native.WebShopClient, "step", refuse)
    server = PlanServer(hf_tokenizer(str(tiny_model_dir)), ["search[tea]"])
    output, record = play(lambda: make_loop(rollout_config, server, tiny_model_dir), 1500)
    assert record["stop"] == "env_error" and output.reward_score == 0.0
    assert output.extra_fields["reward_extra_info"]["env_error"] == 1.0
    assert len(interaction.EPISODES) == 0


def test_a_misspelled_setting_is_an_error(rollout_config, tiny_model_dir) -> None:
    with pytest.raises(Exception, match="timeuot"):
        make_loop(rollout_config, None, tiny_model_dir, timeuot=3)


def test_the_shim_picks_the_installed_verls_helpers(rollout_config, tiny_model_dir) -> None:
    from importlib.metadata import version

    from agent_trainer.agent_tokens import CT_091, LEGACY, detect_mode

    loop = make_loop(rollout_config, None, tiny_model_dir)
    expected = {"0.7.1": LEGACY, "0.9.1": CT_091}[version("verl")]
    assert detect_mode(loop) == expected


def test_a_row_without_the_system_prompt_is_refused_and_leaves_nothing(
    in_process_env, rollout_config, tiny_model_dir
) -> None:
    from agent_trainer.interaction import EPISODES, close_shared_clients

    server = PlanServer(hf_tokenizer(str(tiny_model_dir)), ["search[tea]"])

    async def main() -> None:
        loop = make_loop(rollout_config, server, tiny_model_dir)
        try:
            await loop.run({}, raw_prompt=[{"role": "user", "content": "hi"}], extra_info={"goal": 1500})
        finally:
            await close_shared_clients()

    with pytest.raises(ValueError, match="no system message"):
        asyncio.run(main())
    assert len(EPISODES) == 0 and not server.turns


class VersionedPlanServer(PlanServer):
    """A PlanServer whose weights move from version 3 to 4 after the first turn, reported as verl 0.9.1's
    ``LLMServerClient`` reports them (``extra_fields``: global_steps, min/max_global_steps)."""

    async def generate(self, request_id: str, **kwargs: Any) -> Any:
        output = await super().generate(request_id, **kwargs)
        version = 3 if self.turns[request_id] == 1 else 4
        output.extra_fields = {
            "global_steps": version,
            "min_global_steps": version,
            "max_global_steps": version,
        }
        return output


def test_the_generation_fields_travel_with_the_trajectory(
    in_process_env, rollout_config, tiny_model_dir, expert_plans_generated
) -> None:
    """verl 0.9.1's TransferQueue worker tags each trajectory with min/max_global_steps from ``extra_fields``
    and its trainer turns them into integers every step: the loop keeps them as ToolAgentLoop does."""
    goal, plan = next((g, p) for g, p in expert_plans_generated.items() if len(p) >= 2)
    server = VersionedPlanServer(hf_tokenizer(str(tiny_model_dir)), plan)
    output, _ = play(lambda: make_loop(rollout_config, server, tiny_model_dir), goal)

    assert output.reward_score == 1.0
    fields = output.extra_fields
    assert (fields["global_steps"], fields["min_global_steps"], fields["max_global_steps"]) == (3, 3, 4)
    assert fields["reward_extra_info"]["success"] == 1.0


def test_generation_fields_merge_like_tool_agent_loop() -> None:
    from agent_trainer.agent_loop import generation_fields

    first = generation_fields({}, {"global_steps": 1, "min_global_steps": 1, "max_global_steps": 1})
    assert first == {"global_steps": 1, "min_global_steps": 1, "max_global_steps": 1}
    later = generation_fields(first, {"global_steps": 2, "min_global_steps": 2, "max_global_steps": 2})
    assert later == {"global_steps": 1, "min_global_steps": 1, "max_global_steps": 2}
    assert generation_fields(later, {}) == later and generation_fields({}, None) == {}


def test_importing_the_loop_never_replaces_its_declared_settings() -> None:
    """verl's worker puts configs/agent_loop.yaml's entries (with their settings) into its registry; the
    first instantiation then imports this module. A verl @register decorator there would replace the entry with
    a bare one, and every later trajectory of the worker would run with default settings."""
    import importlib

    from omegaconf import OmegaConf
    from verl.experimental.agent_loop import agent_loop as verl_agent_loop

    import agent_trainer.agent_loop as ours

    entry = {e.name: e for e in OmegaConf.load(config_dir() / AGENT_LOOP_CONFIG)}[AGENT_LOOP_NAME]
    registry = verl_agent_loop._agent_loop_registry
    previous = registry.get(AGENT_LOOP_NAME)
    registry[AGENT_LOOP_NAME] = entry
    try:
        importlib.reload(ours)  # what a worker process's first instantiation does
        assert registry[AGENT_LOOP_NAME] is entry
    finally:
        if previous is None:
            registry.pop(AGENT_LOOP_NAME, None)
        else:
            registry[AGENT_LOOP_NAME] = previous
