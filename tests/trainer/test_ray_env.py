"""AGENTRL_ENV=ray on the trainer side: the setting, the addresses, and what the launcher gives every worker."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from agent_trainer.cli import worker_env_overrides
from agent_trainer.config import InteractionSettings, worker_env
from agent_trainer.interaction import env_urls

REPO = Path(__file__).resolve().parents[2]


def test_env_mode_comes_from_the_environment_and_is_checked(monkeypatch) -> None:
    monkeypatch.setenv("AGENTRL_ENV", "ray")
    assert InteractionSettings.from_config({}).env == "ray"
    monkeypatch.delenv("AGENTRL_ENV")
    assert InteractionSettings.from_config({}).env == "http"
    with pytest.raises(ValueError, match="must be one of http, ray"):
        InteractionSettings.from_config({"env": "grpc"})


def test_ray_mode_goes_to_this_nodes_proxy_first(monkeypatch) -> None:
    monkeypatch.setenv("AGENTRL_RAY_PORT", "36123")
    settings = InteractionSettings.from_config({"env": "ray", "env_url": "http://balancer:1"})
    assert env_urls(settings)[0] == "http://127.0.0.1:36123"  # not connected to Ray here: only its own node
    assert env_urls(InteractionSettings.from_config({"env_url": "http://balancer:1"})) == [
        "http://balancer:1"
    ]


def test_both_yaml_configs_read_webshop_env(monkeypatch) -> None:
    monkeypatch.setenv("AGENTRL_ENV", "ray")
    loop = OmegaConf.load(REPO / "configs" / "agent_loop.yaml")
    interaction = OmegaConf.load(REPO / "configs" / "interaction.yaml")
    assert loop[0].env == "ray"
    assert interaction.interaction[0].config.env == "ray"


def test_workers_get_the_runs_settings_and_log_paths_but_never_the_state_secret() -> None:
    from agent_trainer.cli import training_config_dir
    from agent_trainer.preflight import compose_training_config

    env = {"AGENTRL_ENV": "ray", "AGENTRL_TURN_TOKENS": "256", "AGENTRL_STATE_SECRET": "s" * 40, "HOME": "/root",
           "AGENTRL_URL": "http://a:1/it's", "VERL_FILE_LOGGER_PATH": "/out/metrics.jsonl", "PATH": "/bin"}  # fmt: skip
    assert sorted(worker_env(env)) == [
        "AGENTRL_ENV",
        "AGENTRL_TURN_TOKENS",
        "AGENTRL_URL",
        "VERL_FILE_LOGGER_PATH",
    ]
    _, config = compose_training_config("webshop_grpo_test", worker_env_overrides(env), training_config_dir())
    env_vars = OmegaConf.to_container(config.ray_kwargs.ray_init.runtime_env.env_vars)
    assert env_vars == worker_env(env)  # strings, exactly (a quote included): what Ray's runtime_env needs


def test_the_slurm_script_is_valid_bash() -> None:
    script = REPO / "deploy" / "slurm" / "agent-grpo.sbatch"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    assert "#SBATCH --nodes=" in script.read_text()
