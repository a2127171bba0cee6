"""The verl 0.9 line's configs for the other environments (configs/verl09/{textcraft,babyai,mixed}_grpo_test.yaml):
they compose against verl's own config and validate, carry AgentGym-RL's settings, and the ``environments`` block
the agent loops read is checked (a misspelled environment or key is an error, not a silent default)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from agent_trainer.config import training_config_dir

#: (batch, rollouts, rounds, response tokens, tokens per turn), AgentGym-RL's examples/train/AgentGym-RL/*_train.sh
AGENTGYM_RL = {"textcraft": (32, 8, 30, 10240, 512), "babyai": (16, 8, 20, 4096, 200),
               "sciworld": (8, 8, 20, 4096, 200)}  # fmt: skip


def resolved(name: str, overrides: list[str] | None = None):
    from agent_trainer.preflight import compose_training_config

    _, config = compose_training_config(name, overrides or [], training_config_dir())
    OmegaConf.resolve(config)
    return config


@pytest.mark.parametrize("name", [f"{env}_grpo_{kind}" for env in ("textcraft", "babyai", "sciworld", "mixed")
                                  for kind in ("test", "train")])  # fmt: skip
def test_each_environment_config_composes_and_validates(name: str) -> None:
    from agent_trainer.preflight import check_training_config

    report = check_training_config(name, directory=training_config_dir())
    assert report["valid"], report["errors"]


@pytest.mark.parametrize("env_id", sorted(AGENTGYM_RL))
def test_the_single_environment_configs_have_agentgym_rls_settings(env_id: str, monkeypatch) -> None:
    for variable in (
        "AGENTRL_TRAIN_BATCH_SIZE",
        "AGENTRL_ROLLOUT_N",
        "AGENTRL_TURN_TOKENS",
        "AGENTRL_TRAIN_FILE",
    ):
        monkeypatch.delenv(variable, raising=False)
    config = resolved(f"{env_id}_grpo_test")
    batch, n, rounds, response, turn_tokens = AGENTGYM_RL[env_id]
    rollout = config.actor_rollout_ref.rollout
    assert (config.data.train_batch_size, rollout.n, config.data.max_response_length) == (batch, n, response)
    assert dict(config.environments[env_id]) == {"max_rounds": rounds, "turn_tokens": turn_tokens}
    assert (
        config.actor_rollout_ref.actor.optim.lr == 1e-6
        and config.actor_rollout_ref.actor.kl_loss_coef == 0.001
    )
    assert rollout.agent.default_agent_loop == f"{env_id}_agent"
    assert (
        config.data.train_files == f"data/verl/{env_id}/train.parquet"
    )  # `agent-train data --env` writes it


@pytest.mark.parametrize("env_id", sorted(AGENTGYM_RL))
def test_the_full_runs_keep_agentgym_rls_settings_on_the_projects_gpus(env_id: str, monkeypatch) -> None:
    for variable in (
        "AGENTRL_TRAIN_BATCH_SIZE",
        "AGENTRL_ROLLOUT_N",
        "AGENTRL_TURN_TOKENS",
        "AGENTRL_N_GPUS",
    ):
        monkeypatch.delenv(variable, raising=False)
    config = resolved(f"{env_id}_grpo_train")
    batch, n, rounds, response, turn_tokens = AGENTGYM_RL[env_id]
    rollout = config.actor_rollout_ref.rollout
    assert (config.data.train_batch_size, rollout.n, config.data.max_response_length) == (batch, n, response)
    assert dict(config.environments[env_id]) == {"max_rounds": rounds, "turn_tokens": turn_tokens}
    assert rollout.agent.default_agent_loop == f"{env_id}_agent" and config.trainer.n_gpus_per_node == 4


@pytest.mark.parametrize("kind", ["test", "train"])
def test_the_mixed_config_keeps_each_environments_episode_shape(kind: str) -> None:
    config = resolved(f"mixed_grpo_{kind}")
    shapes = {env: (block.max_rounds, block.turn_tokens) for env, block in config.environments.items()}
    assert shapes == {"textcraft": (30, 512), "babyai": (20, 200), "webshop": (24, 512)}
    assert config.data.max_response_length == max(r for *_, r, _ in AGENTGYM_RL.values())


def test_a_misspelled_environment_or_setting_is_an_error() -> None:
    from agent_trainer.preflight import check_training_config

    report = check_training_config("textcraft_grpo_test", ["+environments.textcraf.max_rounds=3",
                                                           "+environments.textcraft.turn_tokenz=3",
                                                           "environments.textcraft.max_rounds=0"],
                                   training_config_dir())  # fmt: skip
    assert not report["valid"]
    from agent_trainer import envs

    known = ", ".join(envs.ids())  # the trainer's table and every spec a registration names (Sokoban's)
    assert f"environments.textcraf: unknown environment (known: {known})" in report["errors"]
    assert "sokoban" in known
    assert any("environments.textcraft.turn_tokenz: unknown setting" in e for e in report["errors"])
    assert "environments.textcraft.max_rounds = 0: must be a positive integer" in report["errors"]


def test_the_launcher_runs_an_environment_config_by_name(tmp_path, capsys) -> None:
    from agent_trainer.cli import main

    assert main(["train", "--config", "textcraft_grpo_test", "--dry-run", "--output-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().err
    assert "--config-name textcraft_grpo_test" in printed
    assert "data/verl/textcraft/train.parquet" in printed  # train.log names the run's own data, not WebShop's
    assert main(["train", "--config", "alfworld_grpo_test", "--dry-run", "--output-dir", str(tmp_path)]) == 2
    assert "textcraft_grpo_test" in capsys.readouterr().err  # the message lists what there is
