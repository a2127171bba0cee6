"""The training configs compose as main_ppo would, pass verl's checks, and misspellings are caught."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip(
    "verl", reason="the trainer package needs verl: pip install -c constraints.txt -e services/trainer"
)

from agent_trainer.cli import main, train_command, train_environment
from agent_trainer.preflight import check_training_config, compose_training_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"


@pytest.fixture(autouse=True)
def interaction_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRL_INTERACTION_CONFIG", str(CONFIGS / "interaction.yaml"))


@pytest.mark.parametrize("name", ["webshop_grpo_test", "webshop_grpo_train"])
def test_repository_configs_are_valid(name: str) -> None:
    report = check_training_config(name, directory=CONFIGS)
    assert report["valid"], report["errors"]


def test_test_and_full_runs_have_the_seed_guide_sizes() -> None:
    _, test = compose_training_config("webshop_grpo_test", directory=CONFIGS)
    _, full = compose_training_config("webshop_grpo_train", directory=CONFIGS)
    assert (test.data.train_batch_size, test.actor_rollout_ref.rollout.n, test.trainer.total_epochs) == (
        8,
        2,
        1,
    )
    assert (
        test.trainer.n_gpus_per_node == 1 and test.actor_rollout_ref.rollout.tensor_model_parallel_size == 1
    )
    assert (full.data.train_batch_size, full.actor_rollout_ref.rollout.n, full.trainer.total_epochs) == (
        128,
        4,
        15,
    )
    assert full.actor_rollout_ref.actor.optim.lr == 5e-7
    assert full.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 25
    assert (
        full.actor_rollout_ref.actor.fsdp_config.param_offload
        and full.actor_rollout_ref.actor.fsdp_config.optimizer_offload
    )
    assert (
        full.actor_rollout_ref.model.enable_gradient_checkpointing
        and full.actor_rollout_ref.model.enable_activation_offload
    )
    for config in (test, full):
        assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "tool_agent"
        assert config.algorithm.adv_estimator == "grpo"
        assert config.reward.custom_reward_function.path == "pkg://agent_trainer.reward"
        assert "file" in config.trainer.logger and "tensorboard" in config.trainer.logger


def test_environment_variables_size_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRL_N_GPUS", "4")
    monkeypatch.setenv("AGENTRL_TRAIN_BATCH_SIZE", "16")
    monkeypatch.setenv("AGENTRL_MODEL_PATH", "/models/m")
    monkeypatch.setenv("AGENTRL_OUTPUT_DIR", "/out")
    _, config = compose_training_config("webshop_grpo_test", directory=CONFIGS)
    assert config.trainer.n_gpus_per_node == 4 and config.data.train_batch_size == 16
    assert config.actor_rollout_ref.model.path == "/models/m"
    assert config.trainer.default_local_dir == "/out/webshop_grpo_test/checkpoints"


def _copy(tmp_path: Path) -> Path:
    """A copy of configs/ (every environment's file and the bases they start from)."""
    shutil.copytree(CONFIGS, tmp_path / "configs")
    return tmp_path / "configs"


def test_misspelled_keys_are_rejected(tmp_path: Path) -> None:
    """In the base or in an environment's file: the composed config is checked."""
    configs = _copy(tmp_path)
    base = configs / "base" / "grpo_test.yaml"
    base.write_text(base.read_text().replace("    enable_gradient_checkpointing: true\n",
                    "    enable_gradient_checkpointing: true\n    enable_activation_offloading: true\n"))  # fmt: skip
    overlay = configs / "webshop_grpo_test.yaml"
    overlay.write_text(overlay.read_text().replace("  project_name: webshop-grpo\n", "  project_name: webshop-grpo\n  learning_rate: 1.0e-06\n"))  # fmt: skip
    report = check_training_config("webshop_grpo_test", directory=configs)
    assert not report["valid"]
    unknown = [e for e in report["errors"] if e.startswith("unknown key")]
    assert any(e.endswith("actor_rollout_ref.model.enable_activation_offloading") for e in unknown)
    assert any(e.endswith("trainer.learning_rate") for e in unknown)


def test_batch_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRL_N_GPUS", "3")
    monkeypatch.setenv("AGENTRL_PPO_MINI_BATCH_SIZE", "16")
    report = check_training_config("webshop_grpo_test", directory=CONFIGS)
    errors = "\n".join(report["errors"])
    assert "not divisible by the GPU count 3" in errors
    assert "ppo_mini_batch_size = 16 is larger than data.train_batch_size = 8" in errors


def test_agent_worker_divisibility(tmp_path: Path) -> None:
    configs = _copy(tmp_path)
    base = configs / "base" / "grpo_test.yaml"
    base.write_text(base.read_text().replace("      num_workers: 4\n", "      num_workers: 5\n"))
    report = check_training_config("webshop_grpo_test", directory=configs)
    assert any("rollout.agent.num_workers = 5" in e for e in report["errors"])


def test_single_turn_default_is_rejected(tmp_path: Path) -> None:
    configs = _copy(tmp_path)
    base = configs / "base" / "grpo_test.yaml"
    base.write_text(
        base.read_text().replace("default_agent_loop: tool_agent", "default_agent_loop: single_turn_agent")
    )
    report = check_training_config("webshop_grpo_test", directory=configs)
    assert any("silently run single-turn" in e for e in report["errors"])


def test_an_environments_file_wins_over_its_base(tmp_path: Path) -> None:
    """Hydra's defaults list: verl's ppo_trainer, then the base, then the environment's own file (``_self_``)."""
    configs = _copy(tmp_path)
    overlay = configs / "textcraft_grpo_test.yaml"
    overlay.write_text(overlay.read_text().replace("trainer:\n", "trainer:\n  test_freq: 7\n", 1))
    _, config = compose_training_config("textcraft_grpo_test", directory=configs)
    assert config.trainer.test_freq == 7  # the base says ${AGENTRL_TEST_FREQ,4}
    _, other = compose_training_config("babyai_grpo_test", directory=configs)
    assert other.trainer.test_freq == 4


def test_interaction_config_in_the_guides_format_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "interaction.yaml"
    bad.write_text(
        "interaction:\n  - name: webshop\n    _target_: agent_trainer.interaction.WebshopInteraction\n"
    )
    monkeypatch.setenv("AGENTRL_INTERACTION_CONFIG", str(bad))
    report = check_training_config("webshop_grpo_test", directory=CONFIGS)
    assert any("lacks class_name, config" in e for e in report["errors"])


def test_train_launcher_command_and_output_layout(tmp_path: Path) -> None:
    command = train_command("full", ["trainer.total_epochs=1"], CONFIGS, tmp_path / "exp1")
    assert command[1:3] == ["-m", "agent_trainer.verl_main"]
    assert f"hydra.run.dir={tmp_path / 'exp1' / 'logs' / 'hydra'}/${{now:%Y-%m-%d_%H-%M-%S}}" in command
    assert command[command.index("--config-path") + 1] == str(CONFIGS.resolve())
    assert (
        command[command.index("--config-name") + 1] == "webshop_grpo_train"
        and command[-1] == "trainer.total_epochs=1"
    )
    env = train_environment(tmp_path, "exp1", CONFIGS)
    assert env["VERL_FILE_LOGGER_PATH"] == str(tmp_path / "exp1" / "metrics" / "metrics.jsonl")
    assert env["TENSORBOARD_DIR"] == str(tmp_path / "exp1" / "logs" / "tensorboard")
    assert all((tmp_path / "exp1" / d).is_dir() for d in ("logs", "checkpoints", "metrics"))
    assert main(["train", "--config", "test", "--dry-run", "--output-dir", str(tmp_path)]) == 0


def test_configs_copy_is_self_contained(tmp_path: Path) -> None:
    """The configs compose from any absolute directory (as in the Docker image, which copies configs/ whole, the
    bases included), not only from the checkout."""
    _, config = compose_training_config("webshop_grpo_train", directory=_copy(tmp_path))
    assert config.data.train_batch_size == 128


def test_the_guides_settings_and_a_saved_final_step() -> None:
    """lr 5e-7 and 25 turns in both runs, 4 GPUs for the full one; attention that needs no flash-attn; the
    test run saves its last step (verl saves on the last step whenever save_freq > 0) for `make eval`."""
    from omegaconf import OmegaConf

    steps = {}
    for name in ("webshop_grpo_test", "webshop_grpo_train"):
        _, config = compose_training_config(name, directory=CONFIGS)
        OmegaConf.resolve(config)
        model, actor = config.actor_rollout_ref.model, config.actor_rollout_ref.actor
        assert actor.optim.lr == 5e-7
        assert config.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 25
        assert model.override_config.attn_implementation == "sdpa" and model.use_remove_padding is False
        assert actor.fsdp_config.model_dtype == "fp32"
        steps[name] = config
    assert steps["webshop_grpo_train"].trainer.n_gpus_per_node == 4
    test = steps["webshop_grpo_test"]
    total_steps = test.data.train_max_samples // test.data.train_batch_size * test.trainer.total_epochs
    assert test.trainer.save_freq > 0 and test.trainer.save_freq >= total_steps  # the last step, only


def test_the_runs_own_overrides_are_preflighted() -> None:
    """TRAIN_EXTRA_ARGS reach the preflight (compose passes them) and are composed and checked like the configs."""
    from agent_trainer.cli import build_parser

    args = build_parser().parse_args(
        ["preflight", "--config", "full", "trainer.total_epochs=2", "data.train_batch_size=5"]
    )
    assert args.overrides == ["trainer.total_epochs=2", "data.train_batch_size=5"]
    misspelled = check_training_config("webshop_grpo_test", ["trainer.totl_epochs=2"], directory=CONFIGS)
    assert not misspelled["valid"] and "totl_epochs" in " ".join(misspelled["errors"])
    indivisible = check_training_config("webshop_grpo_train", args.overrides, directory=CONFIGS)
    assert not indivisible["valid"]
    assert any("train_batch_size * rollout.n = 20 is not divisible" in e for e in indivisible["errors"]), (
        indivisible["errors"]
    )
    fine = check_training_config("webshop_grpo_test", ["trainer.total_epochs=2"], directory=CONFIGS)
    assert fine["valid"] and fine["summary"]["total_epochs"] == 2


def test_memory_and_checkpoint_settings_of_the_gpu_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """FSDP2 for the actor and the reference (FSDP1 on one GPU, NO_SHARD, frees nothing when offloading); the
    full run's micro-batch of one 18k-token sequence (the logits peak) and one kept checkpoint (verl keeps it
    until the next save completes)."""
    monkeypatch.delenv("AGENTRL_MICRO_BATCH_SIZE", raising=False)
    _, test = compose_training_config("webshop_grpo_test", directory=CONFIGS)
    _, full = compose_training_config("webshop_grpo_train", directory=CONFIGS)
    for config in (test, full):
        assert config.actor_rollout_ref.actor.strategy == "fsdp2"
        assert config.actor_rollout_ref.ref.strategy == "fsdp2"
    assert full.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 1
    assert full.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu == 1
    assert full.trainer.max_actor_ckpt_to_keep == 1


# ---- the other environments and the mix (configs/{textcraft,babyai,sciworld,mixed}_grpo_{test,train}.yaml) -------
#: AgentGym-RL's settings (examples/train/AgentGym-RL/<env>_train.sh): batch, rollouts, rounds, response tokens,
#: new tokens per turn, PPO mini-batch, PPO epochs, and the full run's epochs.
AGENTGYM_RL = {"textcraft": (32, 8, 30, 10240, 512, 8, 2, 60), "babyai": (16, 8, 20, 4096, 200, 8, 1, 10),
               "sciworld": (8, 8, 20, 4096, 200, 4, 1, 10)}  # fmt: skip
ENV_CONFIGS = [f"{env}_grpo_{kind}" for env in (*AGENTGYM_RL, "mixed") for kind in ("test", "train")]


def _resolved(name: str, overrides: list[str] | None = None, directory: Path = CONFIGS):
    from omegaconf import OmegaConf

    _, config = compose_training_config(name, overrides or [], directory)
    OmegaConf.resolve(config)
    return config


@pytest.fixture
def no_size_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("AGENTRL_TRAIN_BATCH_SIZE", "AGENTRL_ROLLOUT_N", "AGENTRL_TURN_TOKENS", "AGENTRL_TRAIN_FILE",
                     "AGENTRL_N_GPUS", "AGENTRL_MODEL_PATH", "AGENTRL_PPO_MINI_BATCH_SIZE", "AGENTRL_MICRO_BATCH_SIZE",
                     "AGENTRL_TRAIN_MAX_SAMPLES"):  # fmt: skip
        monkeypatch.delenv(variable, raising=False)


@pytest.mark.parametrize("name", ENV_CONFIGS)
def test_each_environment_config_is_valid_for_verl_and_both_routes(name: str, no_size_settings: None) -> None:
    """verl 0.7.1's schema and validate_config; the interaction route (tool_agent + the interaction config + the
    reward function) and the agent-loop route (the agent-loop config) both configured; verl's turn limit leaves
    every environment its rounds (the last reply of a round budget of N needs N + 1 assistant turns)."""
    report = check_training_config(name, directory=CONFIGS)
    assert report["valid"], report["errors"]
    config = _resolved(name)
    rollout = config.actor_rollout_ref.rollout
    assert rollout.agent.default_agent_loop == "tool_agent"
    assert rollout.multi_turn.interaction_config_path.endswith("interaction.yaml")
    assert rollout.agent.agent_loop_config_path.endswith("agent_loop.yaml")
    assert config.reward.custom_reward_function.path == "pkg://agent_trainer.reward"
    longest = max(block.max_rounds for block in config.environments.values())
    assert rollout.multi_turn.max_assistant_turns == rollout.multi_turn.max_user_turns == longest + 1
    env = name.split("_grpo_")[0]
    assert config.data.train_files == f"data/verl/{env}/train.parquet"  # `agent-train data --env` writes it
    assert config.trainer.experiment_name == name
    tokens_per_turn = max(block.turn_tokens for block in config.environments.values())
    assert config.data.max_response_length >= tokens_per_turn  # room for one whole turn at least


@pytest.mark.parametrize("env_id", sorted(AGENTGYM_RL))
def test_the_environment_configs_have_agentgym_rls_settings(env_id: str, no_size_settings: None) -> None:
    batch, n, rounds, response, turn_tokens, mini, ppo_epochs, epochs = AGENTGYM_RL[env_id]
    for kind in ("test", "train"):
        config = _resolved(f"{env_id}_grpo_{kind}")
        actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
        assert (config.data.train_batch_size, rollout.n, config.data.max_response_length) == (
            batch,
            n,
            response,
        )
        assert dict(config.environments) == {env_id: {"max_rounds": rounds, "turn_tokens": turn_tokens}}
        assert (actor.optim.lr, actor.kl_loss_coef, actor.kl_loss_type) == (1e-6, 0.001, "low_var_kl")
        assert (actor.ppo_mini_batch_size, actor.ppo_epochs) == (mini, ppo_epochs)
        assert config.algorithm.adv_estimator == "grpo"
    test, full = _resolved(f"{env_id}_grpo_test"), _resolved(f"{env_id}_grpo_train")
    assert test.data.train_max_samples == 2 * batch and test.trainer.total_epochs == 1  # two steps
    assert test.trainer.n_gpus_per_node == 1 and full.trainer.n_gpus_per_node == 4
    assert full.trainer.total_epochs == epochs and full.trainer.save_freq == 25
    assert full.actor_rollout_ref.model.path == "Qwen/Qwen2.5-7B-Instruct"


def test_the_mixed_configs_keep_each_environments_episode_shape(no_size_settings: None) -> None:
    for kind in ("test", "train"):
        config = _resolved(f"mixed_grpo_{kind}")
        shapes = {env: (block.max_rounds, block.turn_tokens) for env, block in config.environments.items()}
        assert shapes == {"textcraft": (30, 512), "babyai": (20, 200), "webshop": (24, 512)}
        assert config.data.max_response_length == max(v[3] for v in AGENTGYM_RL.values())
        assert config.data.max_prompt_length == 2048  # WebShop's first turn, the longest


def test_the_launcher_runs_an_environment_config_by_name_on_this_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`agent-train train --config textcraft_grpo_test` picks configs/ on verl 0.7.1 (configs/verl09/ on 0.9);
    `test` and `full` stay WebShop's."""
    assert main(["train", "--config", "textcraft_grpo_test", "--dry-run", "--output-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().err
    assert "--config-name textcraft_grpo_test" in printed and f"--config-path {CONFIGS}" in printed
    assert "data/verl/textcraft/train.parquet" in printed
    assert main(["train", "--config", "test", "--dry-run", "--output-dir", str(tmp_path)]) == 0
    assert "--config-name webshop_grpo_test" in capsys.readouterr().err


@pytest.mark.parametrize("directory", [CONFIGS, CONFIGS / "verl09"], ids=["0.7", "0.9"])
def test_every_config_states_each_environments_rounds_so_the_run_prints_them(directory: Path) -> None:
    """verl prints the resolved config at the start of a run: every environment a config trains has its rounds
    there (``environments.<env>.max_rounds``, what ``turns.episode_rounds`` reads), WebShop's the spec's 24, and
    verl's turn limit leaves the longest of them its last reply."""
    from agent_trainer import envs

    for path in sorted(directory.glob("*_grpo_*.yaml")):
        config = _resolved(path.stem, directory=directory)
        env_ids = (
            [path.stem.split("_grpo_")[0]]
            if not path.stem.startswith("mixed")
            else ["textcraft", "babyai", "webshop"]
        )
        rounds = {env_id: config.environments[env_id].max_rounds for env_id in env_ids}
        assert all(isinstance(r, int) and r >= 1 for r in rounds.values()), (path.name, rounds)
        if "webshop" in rounds:
            assert rounds["webshop"] == envs.get("webshop").max_rounds == 24, path.name
        assert config.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == max(rounds.values()) + 1, (
            path.name
        )


@pytest.mark.parametrize("old, new", [("webshop_interaction.yaml", "interaction.yaml"),
                                      ("webshop_agent_loop.yaml", "agent_loop.yaml")])  # fmt: skip
def test_the_old_config_file_names_still_name_the_files_and_say_so(
    old: str, new: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """configs/webshop_interaction.yaml and webshop_agent_loop.yaml, the old names (one release): links to the new
    files, and a training config that names one (a setting from before the rename) gets a deprecation line."""
    from agent_trainer.config import old_config_file_notes

    assert (CONFIGS / old).is_symlink() and (CONFIGS / old).resolve() == (CONFIGS / new).resolve()
    assert old_config_file_notes(compose_training_config("webshop_grpo_test", directory=CONFIGS)[1]) == []
    setting = "AGENTRL_INTERACTION_CONFIG" if "interaction" in old else "AGENTRL_AGENT_LOOP_CONFIG"
    monkeypatch.setenv(setting, str(CONFIGS / old))
    (note,) = old_config_file_notes(compose_training_config("webshop_grpo_test", directory=CONFIGS)[1])
    assert f"{CONFIGS / old}: a deprecated file name" in note and f"use {new}" in note
    assert check_training_config("webshop_grpo_test", directory=CONFIGS)["errors"] == []
