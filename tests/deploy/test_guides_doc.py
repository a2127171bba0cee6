"""docs/from-the-guides.md maps every script, knob, path and output of the two guides, and the configs' knobs."""

from __future__ import annotations

import re
from pathlib import Path

from omegaconf import OmegaConf

from agent_trainer.config import load_training_config

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "from-the-guides.md"

GUIDE_TERMS = [
    # scripts and commands
    "start_webshop_server.sh", "run_webshop_grpo_test.sh", "run_webshop_grpo_train.sh", "run_lightweight_eval.sh",
    "test_webshop_interaction.py", "webshop_multiturn_w_interaction.py", "--input_file", "--local_save_dir",
    "--num_samples", "verl.trainer.main_ppo", "MODEL_PATH", "MAX_SAMPLES", "tail -f logs/train_*.log", "ray stop",
    "ulimit -n 65535", "36003", "36001",
    # knobs
    "adv_estimator", "train_batch_size", "rollout.n", "total_epochs", "learning_rate", "micro_batch_size",
    "n_gpus", "max_turns", "multi_turn.enable", "interaction_config_path", "default_agent_loop", "num_workers",
    "param_offload", "optimizer_offload", "model_dtype", "enable_gradient_checkpointing",
    "enable_activation_offloading", "save_freq", "test_freq", "custom_reward_function", "max_prompt_length",
    "max_response_length", "top_p", "temperature 0.1", "800", "env_server_base", "timeout: 600", "max_retries: 3",
    "_target_",
    # data, paths, outputs, metrics
    "data_source", "reward_model.style", "extra_info.index", "session_id", "/Data/", "logs/train_<timestamp>.log",
    "checkpoints/epoch_5,10,15", "metrics/training_metrics.json", "Average Reward", "Success Rate", "Policy Loss",
    "KL", "No action found in messages", "click[size: large]", "calculate_score", "finalize",
]  # fmt: skip


def test_every_guide_item_is_mapped() -> None:
    text = DOC.read_text()
    missing = [term for term in GUIDE_TERMS if term not in text]
    assert not missing, f"docs/from-the-guides.md does not say what these are here: {missing}"
    assert "docs/from-the-guides.md" in (REPO / "README.md").read_text()


def test_every_config_knob_is_in_the_mapping() -> None:
    text = DOC.read_text()
    knobs = set()
    for name in (
        "webshop_grpo_test",
        "webshop_grpo_train",
    ):  # as composed: the environment's file and its base
        composed = load_training_config(name, directory=REPO / "configs", with_verl=False)
        knobs |= set(re.findall(r"oc\.env:AGENTRL_(\w+)", OmegaConf.to_yaml(composed)))
    knobs -= {
        "TRAIN_FILE",
        "VAL_FILE",
        "OUTPUT_DIR",
        "INTERACTION_CONFIG",
        "AGENT_LOOP_CONFIG",
        "EXPERIMENT",
        "TRAIN_MAX_SAMPLES",
    }
    missing = sorted(k for k in knobs if f"W_{k}" not in text and f"AGENTRL_{k}" not in text)
    assert not missing, missing
