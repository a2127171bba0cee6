"""An environment's training configs are written from its recipe (agent_trainer.envs.overlays): the committed
files are what the recipes render now (`agent-train configs --write` rewrites them, `--check` says which is
stale), each composes over its line's base into a run with the recipe's values, and an environment the trainer
learns of later (a plugin's spec with a recipe) gets its four files without any written by hand."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from agent_envs.envs import registry
from agent_trainer import envs
from agent_trainer.cli import main
from agent_trainer.config import load_training_config
from agent_trainer.envs import overlays
from agent_trainer.envs.spec import TrainingRecipe

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
BUILTIN = [registration.id for registration in registry.BUILTIN]
WITH_RECIPES = [e for e in BUILTIN if envs.get(e).recipe is not None]


def test_the_committed_training_configs_are_the_recipes() -> None:
    assert set(WITH_RECIPES) == {
        "textcraft",
        "babyai",
        "sciworld",
        "sokoban",
    }  # WebShop's are written by hand
    assert overlays.stale_files(CONFIGS, BUILTIN) == [], "stale: run `agent-train configs --write`"
    for env_id in WITH_RECIPES:  # both lines, both runs
        for folder in ("", "verl09"):
            for run in ("test", "train"):
                assert (CONFIGS / folder / f"{env_id}_grpo_{run}.yaml").is_file()


@pytest.fixture
def configs(tmp_path: Path) -> Path:
    """A copy of the configs directory (the bases, the declaration files, every training config)."""
    shutil.copytree(CONFIGS, tmp_path / "configs", ignore=shutil.ignore_patterns("nginx"))
    return tmp_path / "configs"


@pytest.mark.parametrize("env_id", WITH_RECIPES)
def test_each_run_composes_with_its_recipes_values(env_id: str) -> None:
    spec = envs.get(env_id)
    recipe = spec.recipe
    assert recipe is not None
    for line, folder in (("0.7", CONFIGS), ("0.9", CONFIGS / "verl09")):
        test = load_training_config(f"{env_id}_grpo_test", line, directory=folder, with_verl=False)
        full = load_training_config(f"{env_id}_grpo_train", line, directory=folder, with_verl=False)
        for config in (test, full):
            assert config.data.train_batch_size == recipe.batch_size
            assert (config.data.max_prompt_length, config.data.max_response_length) == (
                recipe.prompt_tokens, recipe.response_tokens)  # fmt: skip
            assert config.actor_rollout_ref.actor.optim.lr == recipe.lr
            assert config.actor_rollout_ref.actor.ppo_mini_batch_size == recipe.mini_batch_size
            assert (
                config.actor_rollout_ref.actor.get("ppo_epochs", 1) == recipe.ppo_epochs
            )  # 1: verl's default
            assert config.actor_rollout_ref.rollout.n == recipe.rollouts
            # the episode length is the spec's, and verl's turn limit one reply more
            assert config.environments[env_id].max_rounds == spec.max_rounds
            assert config.environments[env_id].turn_tokens == recipe.turn_tokens
            assert config.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == spec.max_rounds + 1
            assert config.trainer.project_name == "agentgym-grpo"
            if line == "0.9":
                assert config.actor_rollout_ref.rollout.agent.default_agent_loop == spec.agent_name
        assert test.data.train_max_samples == recipe.test_samples and test.trainer.total_epochs == 1
        assert full.trainer.total_epochs == recipe.epochs and full.trainer.save_freq == recipe.save_freq
        assert full.data.val_max_samples == -1
        if recipe.full_gpu_memory_utilization is not None:
            assert full.actor_rollout_ref.rollout.gpu_memory_utilization == recipe.full_gpu_memory_utilization
        assert test.trainer.experiment_name == f"{env_id}_grpo_test"


def test_a_changed_recipe_leaves_its_files_stale_until_written(
    configs: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    babyai = envs.get("babyai")
    recipe = dataclasses.replace(babyai.recipe, lr=3.0e-6)
    monkeypatch.setitem(envs.SPECS, "babyai", dataclasses.replace(babyai, recipe=recipe))
    stale = {p.relative_to(configs).as_posix() for p in overlays.stale_files(configs, BUILTIN)}
    assert stale == {"babyai_grpo_test.yaml", "babyai_grpo_train.yaml", "verl09/babyai_grpo_test.yaml",
                     "verl09/babyai_grpo_train.yaml"}  # fmt: skip
    assert main(["configs", "--check", "--config-dir", str(configs)]) == 1
    assert "stale: " in capsys.readouterr().out
    assert main(["configs", "--write", "--config-dir", str(configs)]) == 0
    assert main(["configs", "--check", "--config-dir", str(configs)]) == 0
    written = load_training_config("babyai_grpo_train", "0.7", directory=configs, with_verl=False)
    assert written.actor_rollout_ref.actor.optim.lr == 3.0e-6


def test_a_new_environment_with_a_recipe_gets_its_four_training_configs(
    configs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spec the trainer learns of through a registration (as a plugin's) with a recipe: its training configs
    are written, none by hand, and compose for both lines."""
    spec = dataclasses.replace(
        envs.get("sokoban"), env_id="maze", title="Maze: find the way out", max_rounds=12
    )
    monkeypatch.setattr(envs, "plugins", lambda: {"maze": spec})
    written = overlays.stale_files(configs, write=True)
    assert {p.relative_to(configs).as_posix() for p in written} == {
        "maze_grpo_test.yaml", "maze_grpo_train.yaml", "verl09/maze_grpo_test.yaml", "verl09/maze_grpo_train.yaml"}  # fmt: skip
    for line, folder in (("0.7", configs), ("0.9", configs / "verl09")):
        config = load_training_config("maze_grpo_test", line, directory=folder, with_verl=False)
        assert config.data.train_files.endswith("data/verl/maze/train.parquet")
        assert config.environments.maze.max_rounds == 12
        assert config.actor_rollout_ref.rollout.multi_turn.max_user_turns == 13
    assert "Maze GRPO on verl 0.9.1 (test run)" in (configs / "verl09" / "maze_grpo_test.yaml").read_text()


@pytest.mark.parametrize(
    ("change", "says"),
    [({"mini_batch_size": 5}, "must divide batch_size"), ({"rollouts": 0}, "rollouts = 0"),
     ({"lr": 2.0}, "lr = 2.0")],
)  # fmt: skip
def test_a_recipe_verl_would_refuse_is_refused_when_declared(change: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        dataclasses.replace(envs.get("babyai").recipe, **change)


def test_webshop_and_the_mixed_runs_keep_their_hand_written_configs() -> None:
    assert envs.get(envs.WEBSHOP).recipe is None
    assert all("generated by" not in (CONFIGS / f"{name}.yaml").read_text()
               for name in ("webshop_grpo_test", "webshop_grpo_train", "mixed_grpo_test", "mixed_grpo_train"))  # fmt: skip
    assert isinstance(envs.get("babyai").recipe, TrainingRecipe)
