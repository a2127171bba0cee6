"""``agent-train preflight``: the run for the installed verl line and the environments asked for.

Another environment or a mix goes to :mod:`.envs`, verl >= 0.8 to :mod:`.agent_loop`; on verl 0.7.1 WebShop's
preflight runs here: configs, data, cluster, the interaction route (verl's ``AgentLoopWorker`` -> ``ToolAgentLoop``
-> ``WebshopInteraction`` -> the reward function) with the tiny model and the scripted oracle, the leak check,
then the same goals through the WebShop agent loop.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
import traceback
from typing import Any

from ..config import (
    AGENT_LOOP_CONFIG,
    AGENT_NAME,
    INTERACTION_CONFIG,
    INTERACTION_NAME,
    TRAINING_CONFIGS,
    config_dir,
    installed_verl_line,
)
from ..harness.catalog import default_catalog
from ..harness.cluster import Cluster, start_or_reuse_cluster
from ..harness.tasks import pick_oracle_goals
from .agent_loop import run_agent_loop_preflight, run_agent_loop_stage
from .configs import check_training_configs, compose_training_config, tiny_run_overrides
from .envs import run_env_preflight
from .options import PreflightOptions
from .rollouts import run_interaction_rollouts
from .summary import line_dir, rounded_mean, write_summary


def run_preflight(options: PreflightOptions) -> dict[str, Any]:
    """Run every step; returns the summary (``ok`` False and ``errors`` filled when a check failed)."""
    if options.envs and list(options.envs) != ["webshop"]:
        return run_env_preflight(options)
    if installed_verl_line() != "0.7":
        return run_agent_loop_preflight(options)
    started = time.monotonic()
    out_dir = line_dir(options.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from importlib.metadata import version

    summary: dict[str, Any] = {"ok": False, "verl_version": version("verl"), "verl_line": "0.7",
                               "config_valid": False, "rollouts": 0, "mean_reward": None,
                               "oracle_mean_reward": None, "leaked_states": None, "errors": [], "checks": {},
                               "timings": {}}  # fmt: skip
    errors: list[str] = summary["errors"]
    checks: dict[str, bool] = summary["checks"]
    timings: dict[str, float] = summary["timings"]
    cluster: Cluster | None = None
    directory = (options.config_dir or config_dir()).resolve()

    def lap(name: str, since: float) -> float:
        now = time.monotonic()
        timings[name] = round(now - since, 2)
        return now

    try:
        # 1. configs
        t = time.monotonic()
        os.environ.setdefault("WEBSHOP_INTERACTION_CONFIG", str(directory / INTERACTION_CONFIG))
        os.environ.setdefault("WEBSHOP_AGENT_LOOP_CONFIG", str(config_dir() / AGENT_LOOP_CONFIG))
        check_training_configs(options.config, options.overrides, directory, summary, errors)
        t = lap("configs", t)

        # 2. data + tiny model
        from webshop_env.envs.webshop.catalog.store import open_catalog

        from ..data import build_dataset
        from ..tiny_model import build_tiny_model

        catalog_dir = (options.catalog or default_catalog(out_dir)).resolve()
        fingerprint = open_catalog(catalog_dir).fingerprint
        summary["catalog"] = {"dir": str(catalog_dir), "fingerprint": fingerprint}
        model_dir = build_tiny_model(out_dir / "tiny_model", catalog_dir)
        t = lap("tiny_model", t)
        plans = pick_oracle_goals(catalog_dir, options.goal_set, "train", options.goals, options.max_turns)
        train_file = out_dir / "data" / "train.parquet"
        built = build_dataset(catalog_dir, "train", train_file, goal_set=options.goal_set, goal_ids=list(plans),
                              progress=False)  # fmt: skip
        summary["dataset"] = {"train": built}
        rollout_name = TRAINING_CONFIGS[options.config or "test"]
        interaction_file = directory / INTERACTION_CONFIG
        summary["oracle_plan_lengths"] = sorted(len(plan) for plan in plans.values())
        summary["env_step_limit"] = options.max_turns - 1
        overrides = [
            *options.overrides,
            *tiny_run_overrides(model_dir, train_file, options.rollouts, options.max_turns),
            f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={interaction_file}",
            *options.extra_overrides,
        ]
        _, rollout_config = compose_training_config(rollout_name, overrides, directory)
        from omegaconf import OmegaConf
        from verl.trainer.main_ppo import create_rl_dataset
        from verl.utils import hf_tokenizer

        OmegaConf.resolve(rollout_config)
        tokenizer = hf_tokenizer(str(model_dir))
        dataset = create_rl_dataset([str(train_file)], rollout_config.data, tokenizer, None, is_train=True)
        samples = [dataset[i] for i in range(len(dataset))]
        checks["dataset_loads"] = len(samples) == built["rows"] and all(
            s.get("agent_name") == AGENT_NAME and s["interaction_kwargs"].get("name") == INTERACTION_NAME
            and "ground_truth" in s["reward_model"] for s in samples
        )  # fmt: skip
        summary["dataset"]["loaded_rows"] = len(samples)
        if not checks["dataset_loads"]:
            errors.append(
                f"verl's dataset kept {len(samples)} of {built['rows']} rows or lost required fields"
            )
        t = lap("data", t)

        # 3. cluster
        cluster = start_or_reuse_cluster(
            catalog_dir, fingerprint, out_dir / "cluster", options.reuse_url(), options.replicas
        )
        os.environ["WEBSHOP_URL"] = cluster.url  # the interaction config reads ${oc.env:WEBSHOP_URL}
        summary["cluster"] = {"url": cluster.url, "reused": cluster.reused}
        t = lap("cluster", t)

        # 4. rollouts: tiny model, then the scripted oracle
        from ..harness.model_servers import ScriptedServer, TinyModelServer
        from ..interaction import EPISODES

        EPISODES.clear()
        tiny = asyncio.run(run_interaction_rollouts(rollout_config, samples, options.rollouts,
                                         TinyModelServer(str(model_dir), options.max_new_tokens)))  # fmt: skip
        t = lap("tiny_rollouts", t)
        summary["rollouts"] = len(tiny["scores"])
        summary["mean_reward"] = rounded_mean(tiny["scores"])
        summary["tiny_model"] = {
            "mean_turns": rounded_mean(tiny["num_turns"]),
            "mean_steps": rounded_mean(tiny["extras"].get("steps", [])),
            "invalid_rate": rounded_mean(tiny["extras"].get("invalid_rate", [])),
            "sample_response": tiny["responses"][0] if tiny["responses"] else "",
        }
        checks["tiny_rollouts"] = summary["rollouts"] == len(samples) * options.rollouts and all(
            s >= 2 for s in tiny["extras"].get("steps", [0])
        )
        if not checks["tiny_rollouts"]:
            errors.append(f"tiny-model rollouts incomplete or single-turn: {tiny['extras'].get('steps')}")

        instruction_plans = {
            s["extra_info"]["instruction"]: plans[int(s["extra_info"]["goal"])] for s in samples
        }
        oracle = asyncio.run(run_interaction_rollouts(rollout_config, samples, options.rollouts,
                                           ScriptedServer(tokenizer, instruction_plans)))  # fmt: skip
        t = lap("oracle_rollouts", t)
        summary["oracle_rollouts"] = len(oracle["scores"])
        summary["oracle_mean_reward"] = rounded_mean(oracle["scores"])
        summary["agent_loop_worker"] = tiny["agent_loop_worker"]
        summary["step_metrics"] = oracle["step_metrics"]
        checks["step_metrics"] = bool(oracle["step_metrics"]) and not any(
            run["step_metrics_error"] for run in (tiny, oracle)
        )
        for label, run in (("tiny model", tiny), ("oracle", oracle)):
            if run["step_metrics_error"]:
                errors.append(f"interaction ({label}): the trainer's per-step metric computation failed: "
                              f"{run['step_metrics_error']}")  # fmt: skip
        summary["oracle"] = {
            "success_rate": rounded_mean(oracle["extras"].get("success", [])),
            "mean_steps": rounded_mean(oracle["extras"].get("steps", [])),
            "invalid_actions": sum(oracle["extras"].get("invalid_actions", [])),
        }
        checks["oracle_reward"] = bool(oracle["scores"]) and all(s == 1.0 for s in oracle["scores"])
        if not checks["oracle_reward"]:
            errors.append(f"the scripted oracle did not earn 1.0 on every trajectory: {oracle['scores']}")
        checks["multi_turn"] = all(s >= 2 for s in oracle["extras"].get("steps", [0]))
        if not checks["multi_turn"]:
            errors.append(f"trajectories were not multi-turn: steps {oracle['extras'].get('steps')}")

        # 5. leaks: every trajectory's state must be gone once verl dropped its agent loop
        gc.collect()
        summary["leaked_states"] = len(EPISODES)
        summary["states"] = {"opened": EPISODES.opened, "peak_open": EPISODES.peak, "expired_by_ttl": EPISODES.expired,
                             "tiny_trajectories_without_purchase": sum(
                                 1 for p in tiny["extras"].get("purchased", []) if not p)}  # fmt: skip
        checks["no_leaked_states"] = summary["leaked_states"] == 0
        if not checks["no_leaked_states"]:
            errors.append(f"{summary['leaked_states']} per-trajectory state(s) left behind")
        t = lap("checks", t)

        # 6. the same episodes through the WebShop agent loop (the path verl 0.8+ keeps), on this verl 0.7.1
        stage = run_agent_loop_stage(options, directory, out_dir, catalog_dir, model_dir, plans)
        lap("agent_loop_rollouts", t)
        errors.extend(stage.pop("errors"))
        checks.update(stage.pop("checks"))
        summary["agent_loop"] = stage["agent_loop"]
        summary["step_metrics_ok"] = checks["step_metrics"] and stage["step_metrics_ok"]
        summary["token_stream_ok"] = stage["token_stream_ok"]
        summary["leaked_states"] += stage["leaked_states"]
        summary["agent_loop_rollouts"] = stage
    except Exception as error:
        errors.append(f"{type(error).__name__}: {error}")
        summary["traceback"] = traceback.format_exc(limit=8)
    finally:
        if cluster is not None and cluster.stop is not None:
            cluster.stop()
    return write_summary(summary, errors, checks, started, out_dir)
