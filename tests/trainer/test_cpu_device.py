"""The CPU build's device substitution (``AGENTRL_DEVICE=cpu``: ``make train-test|eval DEVICE=cpu``) and the
container preflight's ``--config`` (the trainer job passes its TRAIN_CONFIG as it is)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_trainer.cli import main, preflight_target
from agent_trainer.rehearsal import device


def test_the_run_keeps_its_own_overrides_and_gets_the_rest_of_the_scale_down(tmp_path: Path) -> None:
    env = {"AGENTRL_MODEL_PATH": "/models/small", "AGENTRL_DEVICE": "cpu"}
    out_env, overrides, listed = device.cpu_train("0.9", ["data.train_batch_size=8", "trainer.total_epochs=2"],
                                                  env, tmp_path)  # fmt: skip
    keys = [device.override_key(o) for o in overrides]
    assert len(keys) == len(set(keys)), "Hydra refuses an override given twice"
    assert "data.train_batch_size=8" in overrides and "data.train_batch_size=4" not in overrides
    assert (
        "actor_rollout_ref.rollout.name=cpu" in overrides
        and f"trainer.total_training_steps={device.CPU_STEPS}" in overrides
    )
    assert not any("wrap_policy" in o for o in overrides)  # 0.7.1's transformers-5 seam only
    assert out_env["VERL_PLATFORM"] == "cpu" and out_env["AGENTRL_TURN_TOKENS"] == str(device.CPU_TURN_TOKENS)
    assert out_env["AGENTRL_MODEL_PATH"] == "/models/small"  # the run's model, not a tiny one
    assert any("data.train_batch_size: the run's own override kept" in line for line in listed)
    assert any(line.startswith("rollout engine: CpuLLMServer") for line in listed)
    assert not any(line.startswith("policy:") for line in listed)
    text = device.substitution_lines(listed)
    assert text.startswith("agent-train: CPU run:") and "actor_rollout_ref.rollout.name=cpu" in text


def test_without_a_model_the_cpu_run_builds_a_tiny_one_from_the_catalog(
    tmp_path: Path, generated_catalog_dir: Path
) -> None:
    env = {"WEBSHOP_CATALOG": str(generated_catalog_dir)}
    out_env, overrides, listed = device.cpu_train("0.7", [], env, tmp_path / "run")
    model = Path(out_env["AGENTRL_MODEL_PATH"])
    assert model.parent == tmp_path / "run" and (model / "config.json").is_file()
    assert any(line.startswith("policy: a tiny local") for line in listed)
    assert all(o in overrides for o in device.WRAP_07)
    with pytest.raises(RuntimeError, match="no prepared catalog"):
        device.cpu_train("0.7", [], {"WEBSHOP_CATALOG": str(tmp_path / "none")}, tmp_path / "other")


def test_the_launcher_substitutes_the_device_only_on_the_cpu_build(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``agent-train train --dry-run``: the GPU build passes the config as it is; the CPU build (the image's
    AGENTRL_DEVICE) adds the scale-down and says what it substituted."""
    monkeypatch.setenv("AGENTRL_MODEL_PATH", str(tmp_path / "model"))
    args = ["train", "--config", "test", "--output-dir", str(tmp_path), "--dry-run"]
    monkeypatch.setenv("AGENTRL_DEVICE", "gpu")
    assert main(args) == 0
    gpu = capsys.readouterr().err
    assert "rollout.name=cpu" not in gpu and "CPU run" not in gpu
    monkeypatch.setenv("AGENTRL_DEVICE", "cpu")
    assert main(args) == 0
    cpu = capsys.readouterr().err
    assert "agent-train: CPU run: what differs from the GPU run" in cpu
    command = next(line for line in cpu.splitlines() if line.startswith("+ "))
    assert "actor_rollout_ref.rollout.name=cpu" in command and "trainer.n_gpus_per_node=2" in command


@pytest.mark.parametrize(
    ("config", "envs"),
    [("babyai_grpo_test", ["babyai"]), ("mixed_grpo_test", ["babyai", "textcraft", "webshop"]),
     ("webshop_grpo_test", ["webshop"])],
)  # fmt: skip
def test_a_cpu_run_holds_each_of_its_environments_to_the_turn_limits_rounds(
    config: str,
    envs: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scale-down's turn limit (5 replies) holds every environment of the run to 4 env steps: the agent loop
    and the interaction end an episode after its rounds and never read verl's limit. It once set WebShop's rounds
    on every CPU run, BabyAI's included, whose episodes then ran to their 20 rounds' worth of turns."""
    monkeypatch.setenv("AGENTRL_MODEL_PATH", str(tmp_path / "model"))
    monkeypatch.setenv("AGENTRL_DEVICE", "cpu")
    assert main(["train", "--config", config, "--output-dir", str(tmp_path), "--dry-run"]) == 0
    command = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("+ "))
    held = sorted(word.split(".")[1] for word in command.split() if word.endswith(".max_rounds=4"))
    assert held == envs, command
    assert "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5" in command
    # the run's own value wins
    assert main(["train", "--config", config, "--output-dir", str(tmp_path), "--dry-run",
                 f"++environments.{envs[0]}.max_rounds=3"]) == 0  # fmt: skip
    command = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("+ "))
    assert f"++environments.{envs[0]}.max_rounds=3" in command
    assert f"++environments.{envs[0]}.max_rounds=4" not in command


@pytest.mark.parametrize(
    ("config", "env", "expected"),
    [
        ("test", None, ("test", None)),
        ("full", "textcraft", ("full", "textcraft")),
        ("textcraft_grpo_test", None, ("test", "textcraft")),
        ("babyai_grpo_train", None, ("full", "babyai")),
        ("mixed_grpo_test", "textcraft,babyai", ("test", "textcraft,babyai")),
        ("mixed_grpo_test", None, ("test", "textcraft,babyai,webshop")),
        ("webshop_grpo_test", None, ("test", "webshop")),
    ],
)
def test_preflight_takes_the_trainer_jobs_config_names(config: str, env: str | None, expected: tuple) -> None:
    """The trainer job runs ``agent-train preflight --config "$TRAIN_CONFIG"``: a config's own name is accepted
    (it was refused with 'invalid choice' before, for every environment but WebShop)."""
    assert preflight_target(config, env) == expected


def test_preflight_refuses_a_config_that_does_not_exist(capsys: pytest.CaptureFixture) -> None:
    assert main(["preflight", "--config", "alfworld_grpo_test"]) == 2
    assert "no training config 'alfworld_grpo_test'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="test, full or one of"):
        preflight_target("huge", None)


def test_the_launcher_names_the_rows_verl_would_drop_for_a_long_first_turn(
    tmp_path: Path,
    generated_catalog_dir: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """verl's filter_overlong_prompts drops a row whose first turn is over data.max_prompt_length without a word
    (one TextCraft task's first turn is ~1,330 Qwen tokens): the launcher says which rows, how long, what happens."""
    from agent_trainer.env_data import build_env_datasets
    from agent_trainer.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", generated_catalog_dir)
    data = tmp_path / "data"
    build_env_datasets(["textcraft"], data, train_rows=4, val_rows=2, test_rows=2, progress=False)
    monkeypatch.setenv("AGENTRL_MODEL_PATH", str(model))
    args = ["train", "--config", "textcraft_grpo_test", "--output-dir", str(tmp_path / "out"), "--dry-run",
            f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'val.parquet'}"]  # fmt: skip
    assert main([*args, "data.max_prompt_length=8192"]) == 0
    assert "first turn over" not in capsys.readouterr().err
    assert main([*args, "data.max_prompt_length=64"]) == 0
    err = capsys.readouterr().err
    assert (
        "6 of 6 rows have a first turn over data.max_prompt_length (64 tokens): verl's filter_overlong_prompts"
        in err
    )
    assert "train.parquet row 0: textcraft task" in err


def test_the_rehearsal_stops_before_verl_when_a_row_would_be_dropped(
    tmp_path: Path, generated_catalog_dir: Path
) -> None:
    """A SciWorld rehearsal lost step 3 here: 3 of its 14 rows (lifespan tasks, ~1,100 tokens) were over the
    scale-down's 1024-token prompt budget, verl dropped them, and 2 batches were left. Its prompt budget is now the
    environment's (PROMPT_TOKENS_OF), and a row that does not fit stops the rehearsal before verl, naming it."""
    from agent_trainer.env_data import build_env_datasets
    from agent_trainer.rehearsal import run as rehearsal
    from agent_trainer.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", generated_catalog_dir)
    data = tmp_path / "data"
    build_env_datasets(["textcraft"], data, train_rows=4, val_rows=2, test_rows=2, progress=False)
    prepared = {"model": model, "train": str(data / "train.parquet"), "val": str(data / "val.parquet")}
    rehearsal._every_row_fits(prepared, "data.max_prompt_length=8192")
    with pytest.raises(
        RuntimeError, match=r"6 rows have a first turn over data.max_prompt_length=64 \(textcraft task"
    ):
        rehearsal._every_row_fits(prepared, "data.max_prompt_length=64")
    assert rehearsal.prompt_overrides(["textcraft", "sciworld"]) == ["data.max_prompt_length=1536"]
    assert rehearsal.prompt_overrides(["webshop", "textcraft"]) == []
