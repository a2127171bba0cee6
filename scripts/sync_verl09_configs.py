"""Write configs/verl09/webshop_grpo_{test,train}.yaml from the verl 0.7.1 configs (same hyper-parameters).

    python scripts/sync_verl09_configs.py

The 0.9 line differs only in what verl 0.8+ needs: no interaction (``multi_turn.interaction_config_path``),
the WebShop agent loop as the default agent loop (declared in configs/webshop_agent_loop.yaml), and no custom
reward function (the agent loop returns the env's reward as ``reward_score``). Run it after changing
configs/webshop_grpo_*.yaml; tests/trainer/test_verl_lines.py fails until the two lines agree again.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
NAMES = {"test": "webshop_grpo_test", "full": "webshop_grpo_train"}

HEADER = """\
# WebShop GRPO on verl 0.9.1 ({title}): the same hyper-parameters as ../{name}.yaml (verl 0.7.1),
# with the WebShop agent loop instead of the 0.7.1 interaction (verl 0.8.0 removed interactions and
# `multi_turn.interaction_config_path`). Written by scripts/sync_verl09_configs.py from ../{name}.yaml:
# edit that file and run the script (tests/trainer/test_verl_lines.py checks that both lines agree).
#
#   agent-train train --config {config} [hydra overrides...]   # in .venv-verl09 or the 0.9 trainer image
#   # = python -m verl.trainer.main_ppo --config-path "$PWD/configs/verl09" --config-name {name}
#
# Differences from the 0.7.1 file:
#   rollout.agent.default_agent_loop: webshop_agent, declared in ../webshop_agent_loop.yaml
#     (rollout.agent.agent_loop_config_path; WEBSHOP_AGENT_LOOP_CONFIG overrides). Rows built with
#     `agent-train data --agent-loop` name it themselves (agent_name: webshop_agent).
#   multi_turn.max_assistant_turns means the same episode length as on 0.7.1: the agent loop plays
#     max_assistant_turns - 1 env steps (what the interaction path gets), every reply played.
#   the reward is the env's, returned by the agent loop as reward_score: verl skips its reward function, so
#     there is no reward.custom_reward_function here.
#   trainer.use_v1 keeps verl 0.9's default (true: the TransferQueue trainer; the 0.9 image installs it).
# Environment variables are the 0.7.1 file's (minus WEBSHOP_INTERACTION_CONFIG, plus WEBSHOP_AGENT_LOOP_CONFIG).
"""
AGENT = """\
    agent:
      # Without this (or agent_name: webshop_agent in every row) verl silently runs single-turn.
      default_agent_loop: webshop_agent
      agent_loop_config_path: ${oc.env:WEBSHOP_AGENT_LOOP_CONFIG,configs/webshop_agent_loop.yaml}
"""


def convert(text: str, config: str, name: str) -> str:
    """The 0.9 config for the 0.7.1 config ``text`` (raises if the 0.7.1 file's shape changed)."""
    lines = text.splitlines()
    body = "\n".join(lines[lines.index("hydra:") :]) + "\n"
    body, interaction = re.subn(r"\n      interaction_config_path: .*", "", body)
    body, agent = re.subn(
        r"    agent:\n(      #.*\n)*      default_agent_loop: tool_agent\n(      #.*\n)*      agent_loop_config_path: .*\n",
        lambda _: AGENT,
        body,
    )
    body, reward = re.subn(
        r"  custom_reward_function:\n    path: pkg://agent_trainer.reward\n    name: compute_score\n",
        "",
        body,
    )
    if (interaction, agent, reward) != (1, 1, 1):
        raise SystemExit(
            f"{name}.yaml: expected one interaction_config_path, one `agent: default_agent_loop: tool_agent` block "
            f"and one custom_reward_function block (found {interaction}, {agent}, {reward}); edit the script"
        )
    title = "test run" if config == "test" else "full run"
    return HEADER.format(title=title, name=name, config=config) + body


def main() -> int:
    for config, name in NAMES.items():
        target = CONFIGS / "verl09" / f"{name}.yaml"
        target.write_text(convert((CONFIGS / f"{name}.yaml").read_text(), config, name))
        print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
