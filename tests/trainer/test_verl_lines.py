"""The two verl lines' training configs keep the same hyper-parameters: every config of configs/ and of
configs/verl09/, as Hydra composes it (the environment's file over its line's base), sets the same values but where
verl 0.8+ needs otherwise. No verl needed: the project's files are composed without verl's ppo_trainer, so both
lines compose here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from agent_trainer import envs
from agent_trainer.config import load_training_config, training_config_names

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# What the 0.9 line does differently on purpose (see the header of configs/verl09/base/*.yaml).
LINE_SPECIFIC = {
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path",
    "actor_rollout_ref.rollout.agent.default_agent_loop",
    "reward.custom_reward_function.path",
    "reward.custom_reward_function.name",
}
NAMES = training_config_names(CONFIGS)


def flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def composed(name: str, line: str) -> dict[str, Any]:
    config = load_training_config(
        name, directory=CONFIGS / ("verl09" if line == "0.9" else ""), with_verl=False
    )
    return flat(OmegaConf.to_container(config, resolve=False))


def test_both_lines_have_the_same_configs() -> None:
    assert training_config_names(CONFIGS / "verl09") == NAMES
    assert {"webshop_grpo_test", "webshop_grpo_train", "mixed_grpo_test", "mixed_grpo_train"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_the_0_9_config_has_the_0_7_configs_hyper_parameters(name: str) -> None:
    v07, v09 = composed(name, "0.7"), composed(name, "0.9")
    differing = {k for k in v07.keys() | v09.keys() if v07.get(k) != v09.get(k)} - LINE_SPECIFIC
    assert (
        not differing
    ), (  # the same value goes into configs/<file> and configs/verl09/<file> (or both bases)
        f"{name}: the verl lines' configs differ",
        {k: (v07.get(k), v09.get(k)) for k in sorted(differing)},
    )
    env = name.split("_grpo_")[0]
    agent = envs.get("webshop" if env == "mixed" else env).agent_name
    assert v07["actor_rollout_ref.rollout.agent.default_agent_loop"] == "tool_agent"
    assert v09["actor_rollout_ref.rollout.agent.default_agent_loop"] == agent
    assert v07["actor_rollout_ref.rollout.multi_turn.interaction_config_path"].endswith("interaction.yaml}")
    assert v07["reward.custom_reward_function.path"] == "pkg://agent_trainer.reward"
    assert not {k for k in v09 if k.startswith(("reward.custom_reward_function", "actor_rollout_ref.rollout.multi_turn.inter"))}  # fmt: skip


def test_the_agent_loop_yaml_declares_the_loop_by_its_registered_name() -> None:
    from agent_trainer.config import AGENT_LOOP_NAME

    entries = OmegaConf.load(CONFIGS / "agent_loop.yaml")
    (entry,) = [e for e in entries if e.name == AGENT_LOOP_NAME]
    assert entry._target_ == "agent_trainer.agent_loop.WebShopAgentLoop"
