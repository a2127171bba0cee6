"""An environment's training configs are written from its recipe (agent_trainer.envs.overlays): the committed
files are what the recipes render now (`agent-train configs --write` rewrites them, `--check` says which is
stale), each composes over its line's base into a run with the recipe's values, and an environment the trainer
learns of later (a plugin's spec with a recipe) gets its four files without any written by hand."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from pathlib import Path

import pytest

from agent_envs.envs import registry
from agent_trainer import envs
from agent_trainer.cli import main
from agent_trainer.config import TURN_TOKENS, load_training_config
from agent_trainer.envs import overlays
from agent_trainer.envs.spec import TrainingRecipe

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
BUILTIN = [registration.id for registration in registry.BUILTIN]
WITH_RECIPES = [e for e in BUILTIN if envs.get(e).recipe is not None]


def test_the_committed_training_configs_are_the_recipes() -> None:
    assert set(WITH_RECIPES) == {
        "webshop",
        "textcraft",
        "babyai",
        "sciworld",
        "sokoban",
    }  # every built-in environment's: only the mixed runs' are written by hand
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
        full_run = {"batch_size": recipe.batch_size, "rollouts": recipe.rollouts,
                    "mini_batch_size": recipe.mini_batch_size, "response_tokens": recipe.response_tokens}  # fmt: skip
        for config, shape in (
            (test, recipe.test_run),
            (full, full_run),
        ):  # a test run's own shape, if it has one
            assert config.data.train_batch_size == shape["batch_size"]
            assert (config.data.max_prompt_length, config.data.max_response_length) == (
                recipe.prompt_tokens, shape["response_tokens"])  # fmt: skip
            assert config.actor_rollout_ref.actor.optim.lr == recipe.lr
            assert config.actor_rollout_ref.actor.ppo_mini_batch_size == shape["mini_batch_size"]
            assert (
                config.actor_rollout_ref.actor.get("ppo_epochs", 1) == recipe.ppo_epochs
            )  # 1: verl's default
            assert config.actor_rollout_ref.rollout.n == shape["rollouts"]
            # the episode length is the spec's, and verl's turn limit one reply more
            assert config.environments[env_id].max_rounds == spec.max_rounds
            assert config.environments[env_id].turn_tokens == recipe.turn_tokens
            assert config.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == spec.max_rounds + 1
            assert config.trainer.project_name == recipe.project_name
            if line == "0.9":
                assert config.actor_rollout_ref.rollout.agent.default_agent_loop == spec.agent_name
        assert test.data.train_max_samples == recipe.test_samples and test.trainer.total_epochs == 1
        assert test.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == recipe.test_micro_batch_size
        assert full.trainer.total_epochs == recipe.epochs and full.trainer.save_freq == recipe.save_freq
        assert full.data.val_max_samples == recipe.full_val_samples
        assert test.actor_rollout_ref.rollout.tensor_model_parallel_size == 1  # the base's
        assert full.actor_rollout_ref.rollout.tensor_model_parallel_size == (recipe.full_rollout_tp or 1)
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
     ({"lr": 2.0}, "lr = 2.0"), ({"test_batch_size": 12}, "test run's mini-batch 8 must divide its batch 12"),
     ({"test_batch_size": 8, "test_mini_batch_size": 3}, "mini-batch 3 must divide its batch 8"),
     ({"test_batch_size": 64}, "test_samples 32 is less than the test run's batch 64"),
     ({"test_rollouts": 0}, "test_rollouts = 0"), ({"test_micro_batch_size": True}, "test_micro_batch_size = True"),
     ({"test_response_tokens": "4096"}, "test_response_tokens = '4096'"),
     ({"full_val_samples": 0}, "full_val_samples = 0"), ({"full_rollout_tp": -2}, "full_rollout_tp = -2"),
     ({"project_name": "my project"}, "project_name = 'my project'"), ({"project_name": ""}, "project_name")],
)  # fmt: skip
def test_a_recipe_verl_would_refuse_is_refused_when_declared(change: dict, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        dataclasses.replace(envs.get("babyai").recipe, **change)


def test_the_new_recipe_fields_default_to_what_the_other_recipes_wrote() -> None:
    """A recipe without a test run, validation rows, tensor parallel size or project of its own: the files the four
    AgentGym-RL recipes wrote before these fields existed (the stale check above holds them byte for byte)."""
    recipe = envs.get("babyai").recipe
    assert isinstance(recipe, TrainingRecipe) and not recipe.test_run_differs
    assert recipe.test_run == {"batch_size": 16, "rollouts": 8, "mini_batch_size": 8, "response_tokens": 4096,
                               "micro_batch_size": 1}  # fmt: skip
    assert (recipe.full_val_samples, recipe.full_rollout_tp, recipe.project_name) == (
        -1,
        None,
        "agentgym-grpo",
    )


@pytest.fixture
def no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The configs' defaults: no AGENTRL_* setting of the caller's environment overrides one."""
    for name in [n for n in os.environ if n.startswith(("AGENTRL_", "WEBSHOP_"))]:
        monkeypatch.delenv(name)


def test_webshops_four_configs_are_its_recipes_with_the_guides_values(
    no_settings: None, configs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WebShop's training configs are written from its recipe like every environment's (the stale check covers
    its four files), and its runs keep the guides' values they had when written by hand: the test run 8 prompts x
    2 rollouts (mini-batch 8, micro-batch 2, 6144 response tokens, 64 rows), the full run 128 x 4 (mini-batch 32,
    16384 response tokens, 15 epochs, a save every 20 steps, TP 2, 256 validation rows), lr 5e-7, 25 turns (24
    rounds), 2048 prompt tokens, the project webshop-grpo; the one new key, environments.webshop.turn_tokens, is the
    512 its agent loop already used (configs/agent_loop.yaml's turn_tokens: config.TURN_TOKENS)."""
    recipe = envs.get(envs.WEBSHOP).recipe
    assert recipe is not None
    names = {
        f"{folder}{envs.WEBSHOP}_grpo_{run}.yaml" for folder in ("", "verl09/") for run in ("test", "train")
    }
    assert {p.relative_to(CONFIGS).as_posix() for p in overlays.files(CONFIGS, [envs.WEBSHOP])} == names
    assert overlays.stale_files(CONFIGS, [envs.WEBSHOP]) == []
    assert all(overlays.GENERATED in (CONFIGS / name).read_text() for name in names)
    # the mixed runs' stay hand-written
    assert all(
        overlays.GENERATED not in (CONFIGS / f"mixed_grpo_{run}.yaml").read_text()
        for run in ("test", "train")
    )

    test_run = {"train_batch_size": 8, "n": 2, "ppo_mini_batch_size": 8, "micro": 2, "max_response_length": 6144,
                "tp": 1, "val_max_samples": 16, "total_epochs": 1}  # fmt: skip
    full_run = {"train_batch_size": 128, "n": 4, "ppo_mini_batch_size": 32, "micro": 1, "max_response_length": 16384,
                "tp": 2, "val_max_samples": 256, "total_epochs": 15}  # fmt: skip
    for line, folder in (("0.7", CONFIGS), ("0.9", CONFIGS / "verl09")):
        for run, values in (("test", test_run), ("train", full_run)):
            config = load_training_config(f"webshop_grpo_{run}", line, directory=folder, with_verl=False)
            actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
            assert {"train_batch_size": config.data.train_batch_size, "n": rollout.n,
                    "ppo_mini_batch_size": actor.ppo_mini_batch_size, "micro": actor.ppo_micro_batch_size_per_gpu,
                    "max_response_length": config.data.max_response_length,
                    "tp": rollout.tensor_model_parallel_size, "val_max_samples": config.data.val_max_samples,
                    "total_epochs": config.trainer.total_epochs} == values, (line, run)  # fmt: skip
            assert actor.optim.lr == 5.0e-7 and config.data.max_prompt_length == 2048
            assert rollout.multi_turn.max_assistant_turns == rollout.multi_turn.max_user_turns == 25
            assert dict(config.environments) == {"webshop": {"max_rounds": 24, "turn_tokens": TURN_TOKENS}}
            assert TURN_TOKENS == 512
            assert (config.trainer.project_name, config.trainer.experiment_name) == (
                "webshop-grpo", f"webshop_grpo_{run}")  # fmt: skip
            assert (config.data.train_files, config.data.val_files) == (
                "data/verl/webshop/train.parquet",
                "data/verl/webshop/val.parquet",
            )  # agent-train data --env webshop
            if run == "test":
                assert config.data.train_max_samples == 64
            else:
                assert config.trainer.save_freq == 20
            if line == "0.9":
                assert rollout.agent.default_agent_loop == "webshop_agent"

    # a change of its recipe leaves exactly its files stale until written
    webshop = envs.get(envs.WEBSHOP)
    smaller = dataclasses.replace(recipe, test_batch_size=16, test_mini_batch_size=16)
    monkeypatch.setitem(envs.SPECS, envs.WEBSHOP, dataclasses.replace(webshop, recipe=smaller))
    stale = {p.relative_to(configs).as_posix() for p in overlays.stale_files(configs, BUILTIN)}
    assert stale == {"webshop_grpo_test.yaml", "verl09/webshop_grpo_test.yaml"}
