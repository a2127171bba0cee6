"""The verl 0.9.1 line end to end on CPU: the installed facts the agent loop relies on, the configs against
verl 0.9.1's stock config, and ``agent-train preflight`` (real AgentLoopWorker, tiny model, scripted oracle,
real replicas + nginx)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")


def test_the_installed_verl_is_the_0_9_1_the_line_is_built_for() -> None:
    from importlib.metadata import version

    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput

    assert version("verl") == "0.9.1"
    assert version("numpy").split(".")[0] == "2"
    # 0.9.1 removed apply_chat_template in favour of the Continuous Token helpers the shim uses
    assert not hasattr(AgentLoopBase, "apply_chat_template")
    for helper in ("ct_build_initial_tokens", "ct_merge_assistant_token", "ct_merge_context_msg"):
        assert callable(getattr(AgentLoopBase, helper))
    assert {"reward_score", "num_turns", "extra_fields", "response_mask"} <= set(AgentLoopOutput.model_fields)
    with pytest.raises(ImportError):
        import verl.interactions.base  # noqa: F401  (removed in 0.8.0: the interaction path is 0.7-only)


def test_the_0_9_images_module_list_imports_here_except_the_gpu_image_packages() -> None:
    """docker/trainer-verl09.Dockerfile's import check (verl 0.9 line) on CPU: every module but sglang's server
    (installed only in the image) imports under verl 0.9.1, TransferQueue and the v1 trainer included."""
    repo = Path(__file__).resolve().parents[3]
    not_here = ["sglang", "sglang.launch_server", "verl.workers.rollout.sglang_rollout.async_sglang_server"]
    result = subprocess.run([sys.executable, str(repo / "docker" / "trainer-image-check.py"), "--configs",
                             str(repo / "configs" / "verl09"), "--skip", *not_here],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "image check (verl 0.9 line, gpu): imported 17/17 modules" in result.stdout


def test_both_0_9_configs_compose_against_the_stock_config_and_validate() -> None:
    from agent_trainer.config import TRAINING_CONFIGS, training_config_dir
    from agent_trainer.preflight import check_training_config

    assert training_config_dir().name == "verl09"
    for name in TRAINING_CONFIGS.values():
        report = check_training_config(name, directory=training_config_dir())
        assert report["valid"], report["errors"]


def test_an_unknown_key_is_rejected() -> None:
    from agent_trainer.config import training_config_dir
    from agent_trainer.preflight import check_training_config

    report = check_training_config("webshop_grpo_test", ["+actor_rollout_ref.rollout.agent.num_workerz=2"],
                                   training_config_dir())  # fmt: skip
    assert not report["valid"]
    assert any("actor_rollout_ref.rollout.agent.num_workerz" in e for e in report["errors"])


def test_the_0_7_interaction_key_is_rejected_by_verl_0_9() -> None:
    from agent_trainer.config import training_config_dir
    from agent_trainer.preflight import check_training_config

    report = check_training_config(
        "webshop_grpo_test",
        ["+actor_rollout_ref.rollout.multi_turn.interaction_config_path=x.yaml"],
        training_config_dir(),
    )
    assert not report["valid"]


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.skipif(shutil.which("nginx") is None and not os.access("/usr/sbin/nginx", os.X_OK),
                    reason="nginx not installed: run `make nginx`")  # fmt: skip
def test_preflight_passes_on_verl_0_9_1(generated_catalog_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "preflight"
    env = {k: v for k, v in os.environ.items() if k != "AGENTRL_URL"}  # never reuse a developer's service
    result = subprocess.run(
        [sys.executable, "-m", "agent_trainer.cli", "preflight", "--catalog", str(generated_catalog_dir),
         "--out", str(out), "--fresh-cluster"],
        capture_output=True, text=True, env=env, timeout=540,
    )  # fmt: skip
    # the layout of every run: OUT/verl<line>/<envs>/summary.json
    summary_path = out / "verl0.9" / "webshop" / "summary.json"
    assert summary_path.exists(), result.stderr[-4000:]
    summary = json.loads(summary_path.read_text())
    assert result.returncode == 0, json.dumps(
        {k: summary.get(k) for k in ("errors", "checks", "traceback")}, indent=1
    )
    assert json.loads((out / "summary.json").read_text()) == summary  # the last run's copy
    assert summary["verl_version"] == "0.9.1" and summary["agent_loops"] == {"webshop": "webshop_agent"}
    # verl 0.9.1's default worker, and the v1 trainer's metric step accepted the trajectories
    assert summary["agent_loop_worker"] == "AgentLoopWorkerTQ" and summary["step_metrics_ok"] is True
    assert summary["step_metrics"]["training/off_policy/trajectory_spans/max"] == 1.0
    assert summary["step_metrics"]["env/webshop/success_rate"] == 1.0  # the per-environment figures
    assert summary["ok"] and summary["config_valid"] and summary["envs"] == ["webshop"]
    assert set(summary["configs"]) == {"webshop_grpo_test", "webshop_grpo_train"}
    assert summary["rollouts"] == 8 and summary["oracle_rollouts"] == 8
    assert summary["oracle_mean_reward"] == 1.0 and summary["oracle"]["success_rate"] == 1.0
    assert 0.0 <= summary["mean_reward"] <= 1.0
    lengths = summary["dataset"]["plan_lengths"]["webshop"]
    assert summary["env_step_limit"] == 7 and len(lengths) == 4 and max(lengths) <= 7
    assert "interaction" not in summary  # verl 0.8+ has no interaction route
    assert summary["leaked_states"] == 0 and summary["states"]["opened"] == 16  # tiny model and oracle
    assert summary["token_stream_ok"] is True
    assert summary["token_stream"]["compared_with_render"] >= 8
    assert summary["tokenization"] == ["continuous-token (0.9.1: ct_merge_context_msg)"]
    assert all(summary["checks"].values())
    assert not (out / "verl0.9" / "webshop" / "cluster" / "pids.json").exists()


def test_the_launcher_runs_verls_main_ppo_through_verl_main_with_the_0_9_configs(tmp_path: Path) -> None:
    from agent_trainer.cli import train_command, train_environment
    from agent_trainer.config import training_config_dir

    directory = training_config_dir()
    command = train_command("test", ["trainer.total_epochs=1"], directory, tmp_path / "run")
    assert command[1:3] == ["-m", "agent_trainer.verl_main"]  # verl's main_ppo with the v1 task runner
    assert command[command.index("--config-path") + 1] == str(directory.resolve())
    assert directory.name == "verl09" and (directory / "webshop_grpo_test.yaml").is_file()
    agent_file = Path(train_environment(tmp_path, "run", directory)["AGENTRL_AGENT_LOOP_CONFIG"])
    assert agent_file.name == "agent_loop.yaml" and agent_file.is_file()


def test_the_cpu_builds_module_list_imports_here() -> None:
    """The CPU build of the 0.9 image (TRAINER_DEVICE=cpu): the GPU engine replaced by its CPU stand-ins, every
    module of the list imports under verl 0.9.1 with nothing skipped."""
    repo = Path(__file__).resolve().parents[3]
    result = subprocess.run([sys.executable, str(repo / "docker" / "trainer-image-check.py"), "--configs",
                             str(repo / "configs" / "verl09"), "--device", "cpu", "--skip"],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "image check (verl 0.9 line, cpu): imported 20/20 modules" in result.stdout
    assert "agent_trainer.rehearsal.cpu_platform" in result.stdout
