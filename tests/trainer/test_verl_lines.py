"""The two verl lines' training configs keep the same hyper-parameters (no verl needed: plain YAML)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# What the 0.9 line does differently on purpose (see the header of configs/verl09/*.yaml).
LINE_SPECIFIC = {
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path",
    "actor_rollout_ref.rollout.agent.default_agent_loop",
    "actor_rollout_ref.rollout.agent.agent_loop_config_path",
    "reward.custom_reward_function.path",
    "reward.custom_reward_function.name",
}


def flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


@pytest.mark.parametrize("name", ["webshop_grpo_test", "webshop_grpo_train"])
def test_the_0_9_config_has_the_0_7_configs_hyper_parameters(name: str) -> None:
    v07 = flat(OmegaConf.to_container(OmegaConf.load(CONFIGS / f"{name}.yaml"), resolve=False))
    v09 = flat(OmegaConf.to_container(OmegaConf.load(CONFIGS / "verl09" / f"{name}.yaml"), resolve=False))
    differing = {k for k in v07.keys() | v09.keys() if v07.get(k) != v09.get(k)} - LINE_SPECIFIC
    assert not differing, (  # run `python scripts/sync_verl09_configs.py` after changing a 0.7.1 config
        "the verl lines' configs differ; run python scripts/sync_verl09_configs.py",
        {k: (v07.get(k), v09.get(k)) for k in sorted(differing)},
    )
    assert v07["actor_rollout_ref.rollout.agent.default_agent_loop"] == "tool_agent"
    assert v09["actor_rollout_ref.rollout.agent.default_agent_loop"] == "webshop_agent"
    assert "actor_rollout_ref.rollout.multi_turn.interaction_config_path" not in v09


def test_the_agent_loop_yaml_declares_the_loop_by_its_registered_name() -> None:
    from agent_trainer.config import AGENT_LOOP_NAME

    entries = OmegaConf.load(CONFIGS / "webshop_agent_loop.yaml")
    (entry,) = [e for e in entries if e.name == AGENT_LOOP_NAME]
    assert entry._target_ == "agent_trainer.agent_loop.WebShopAgentLoop"


def test_the_0_9_configs_are_what_the_sync_script_writes() -> None:
    import importlib.util

    path = CONFIGS.parent / "scripts" / "sync_verl09_configs.py"
    spec = importlib.util.spec_from_file_location("sync_verl09_configs", path)
    assert spec and spec.loader
    sync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sync)
    for config, name in sync.NAMES.items():
        expected = sync.convert((CONFIGS / f"{name}.yaml").read_text(), config, name)
        assert (CONFIGS / "verl09" / f"{name}.yaml").read_text() == expected, (
            f"configs/verl09/{name}.yaml is stale: run python scripts/sync_verl09_configs.py"
        )
