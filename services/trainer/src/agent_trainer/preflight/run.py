"""``agent-train preflight``: one route for any environment or a mix, on the installed verl line.

Every run: the environments' training configs through Hydra and verl's checks, the catalog and the tiny model, a
cluster serving the environments, each environment's oracle tasks picked through its spec
(:func:`.envs.pick_plans`), then its stages, the leak checks and ``summary.json``. The stages follow the run's
layout (``PreflightOptions.catalog_run``): a run of the catalog's environment alone (WebShop) plays its own rows
(``agent-train data``) with the oracle found by instruction, on verl 0.7.1 the interaction route (``AgentLoopWorker``
-> ``ToolAgentLoop`` -> ``WebshopInteraction`` -> the reward function) first and then the agent loop
(:mod:`.agent_loop`); any other run is laid out per environment (:mod:`.envs`).
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import AGENT_LOOP_NAME, AGENT_NAME, INTERACTION_NAME, installed_verl_line, training_config_dir
from ..harness.catalog import default_catalog
from ..harness.cluster import Cluster, start_or_reuse_cluster, start_or_reuse_env_cluster
from .agent_loop import run_agent_loop_stage
from .configs import (
    agent_loop_file,
    check_training_configs,
    interaction_file,
    preflight_configs,
    tiny_run_overrides,
)
from .envs import pick_plans, run_env_stages
from .options import PreflightOptions
from .rollouts import load_samples, run_interaction_rollouts
from .summary import line_dir, rounded_mean, write_summary


def run_preflight(options: PreflightOptions) -> dict[str, Any]:
    """Run every step; returns the summary (``ok`` False and ``errors`` filled when a check failed)."""
    from importlib.metadata import version

    from agent_envs.envs.webshop.catalog.store import open_catalog

    from ..tiny_model import build_tiny_model

    started = time.monotonic()
    env_ids, catalog_run, line = options.env_ids, options.catalog_run, installed_verl_line()
    out_dir = line_dir(options.out_dir) / options.run_folder
    out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"ok": False, "verl_version": version("verl"), "verl_line": line}
    if not catalog_run:
        summary["envs"] = env_ids
    elif line != "0.7":
        summary["agent_loop"] = AGENT_LOOP_NAME
    summary.update({"config_valid": False, "rollouts": 0, "mean_reward": None, "oracle_mean_reward": None,
                    "leaked_states": None})  # fmt: skip
    if not (catalog_run and line == "0.7"):  # there the agent-loop stage reports it
        summary["token_stream_ok"] = False
    summary.update({"errors": [], "checks": {}, "timings": {}})
    errors: list[str] = summary["errors"]
    checks: dict[str, bool] = summary["checks"]
    cluster: Cluster | None = None
    directory = (options.config_dir or training_config_dir()).resolve()
    since = [time.monotonic()]

    def lap(name: str) -> None:
        """The time since the last lap, as ``timings[name]``."""
        now = time.monotonic()
        summary["timings"][name] = round(now - since[0], 2)
        since[0] = now

    try:
        # the configs name the interaction and agent-loop files relative to the repository: found from anywhere
        os.environ.setdefault("AGENTRL_INTERACTION_CONFIG", str(interaction_file(directory)))
        os.environ.setdefault("AGENTRL_AGENT_LOOP_CONFIG", str(agent_loop_file()))
        configs = preflight_configs(env_ids, options.config, by_run=catalog_run)
        check_training_configs(configs, options.overrides, directory, summary, errors)
        config_name = next(iter(configs.values()))
        lap("configs")

        catalog_dir = (options.catalog or default_catalog(out_dir)).resolve()
        catalog = open_catalog(catalog_dir)
        summary["catalog"] = {"dir": str(catalog_dir), "fingerprint": catalog.fingerprint}
        model_dir = build_tiny_model(line_dir(options.out_dir) / "tiny_model", catalog_dir)
        lap("model")

        if catalog_run:  # the catalog's service alone
            cluster = start_or_reuse_cluster(
                catalog_dir, catalog.fingerprint, out_dir / "cluster", options.reuse_url(), options.replicas
            )
        else:
            cluster = start_or_reuse_env_cluster(catalog_dir, catalog.fingerprint, env_ids, out_dir / "cluster",
                                                 options.reuse_url(), options.replicas)  # fmt: skip
        os.environ["AGENTRL_URL"] = cluster.url  # the configs read ${oc.env:AGENTRL_URL}
        summary["cluster"] = {"url": cluster.url, "reused": cluster.reused}
        lap("cluster")

        if catalog_run:
            plans = pick_plans(options, catalog_dir, cluster.url)[0][env_ids[0]]
            run_catalog_stages(
                options, directory, config_name, out_dir, catalog_dir, model_dir, plans, summary, lap
            )
        else:
            run_env_stages(
                options, directory, config_name, out_dir, catalog, model_dir, cluster.url, summary, lap
            )
    except Exception as error:
        errors.append(f"{type(error).__name__}: {error}")
        summary["traceback"] = traceback.format_exc(limit=8)
    finally:
        if cluster is not None and cluster.stop is not None:
            cluster.stop()
    return write_summary(summary, errors, checks, started, out_dir)


def run_catalog_stages(options: PreflightOptions, directory: Path, config_name: str, out_dir: Path,
                       catalog_dir: Path, model_dir: Path, plans: Mapping[int, Sequence[str]], summary: dict[str, Any],
                       lap: Any) -> None:  # fmt: skip
    """A catalog run's stages, into ``summary``: on verl 0.7.1 the interaction route (tiny model, scripted oracle,
    the state leak check) and then the same goals through the agent loop (``agent_loop_rollouts``); on verl >= 0.8
    the agent loop alone, its figures the summary's own."""
    errors, checks = summary["errors"], summary["checks"]
    if installed_verl_line() != "0.7":
        stage = run_agent_loop_stage(options, directory, config_name, out_dir, catalog_dir, model_dir, plans)
        lap("agent_loop_rollouts")
        errors.extend(stage.pop("errors"))
        checks.update(stage.pop("checks"))
        summary.update(stage)
        return
    _catalog_interaction_stage(
        options, directory, config_name, out_dir, catalog_dir, model_dir, plans, summary, lap
    )
    # the same episodes through the WebShop agent loop (the path verl 0.8+ keeps), on this verl 0.7.1
    stage = run_agent_loop_stage(options, directory, config_name, out_dir, catalog_dir, model_dir, plans)
    lap("agent_loop_rollouts")
    errors.extend(stage.pop("errors"))
    checks.update(stage.pop("checks"))
    summary["agent_loop"] = stage["agent_loop"]
    summary["step_metrics_ok"] = checks["step_metrics"] and stage["step_metrics_ok"]
    summary["token_stream_ok"] = stage["token_stream_ok"]
    summary["leaked_states"] += stage["leaked_states"]
    summary["agent_loop_rollouts"] = stage


def _catalog_interaction_stage(options: PreflightOptions, directory: Path, config_name: str, out_dir: Path,
                               catalog_dir: Path, model_dir: Path, plans: Mapping[int, Sequence[str]],
                               summary: dict[str, Any], lap: Any) -> None:  # fmt: skip
    """verl 0.7.1's interaction route for a catalog run's goals: the rows ``agent-train data`` writes through
    verl's dataset class, the tiny model and the scripted oracle (its plan found by the goal's instruction), which
    must earn 1.0 on every trajectory, and no per-trajectory state left behind."""
    from ..envs.webshop.data import build_dataset
    from ..harness.model_servers import ScriptedServer, TinyModelServer
    from ..interaction import EPISODES

    errors, checks = summary["errors"], summary["checks"]
    train_file = out_dir / "data" / "train.parquet"
    built = build_dataset(catalog_dir, "train", train_file, goal_set=options.goal_set, goal_ids=list(plans),
                          progress=False)  # fmt: skip
    summary["dataset"] = {"train": built}
    summary["oracle_plan_lengths"] = sorted(len(plan) for plan in plans.values())
    summary["env_step_limit"] = options.max_turns - 1
    overrides = [
        *options.overrides,
        *tiny_run_overrides(model_dir, train_file, options.rollouts, options.max_turns),
        f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={interaction_file(directory)}",
        *options.extra_overrides,
    ]
    rollout_config, tokenizer, samples = load_samples(
        config_name, overrides, directory, model_dir, train_file
    )
    checks["dataset_loads"] = len(samples) == built["rows"] and all(
        s.get("agent_name") == AGENT_NAME and s["interaction_kwargs"].get("name") == INTERACTION_NAME
        and "ground_truth" in s["reward_model"] for s in samples
    )  # fmt: skip
    summary["dataset"]["loaded_rows"] = len(samples)
    if not checks["dataset_loads"]:
        errors.append(f"verl's dataset kept {len(samples)} of {built['rows']} rows or lost required fields")
    lap("data")

    # rollouts: tiny model, then the scripted oracle
    EPISODES.clear()
    tiny = asyncio.run(run_interaction_rollouts(rollout_config, samples, options.rollouts,
                                     TinyModelServer(str(model_dir), options.max_new_tokens)))  # fmt: skip
    lap("tiny_rollouts")
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

    instruction_plans = {s["extra_info"]["instruction"]: plans[int(s["extra_info"]["goal"])] for s in samples}
    oracle = asyncio.run(run_interaction_rollouts(rollout_config, samples, options.rollouts,
                                       ScriptedServer(tokenizer, instruction_plans)))  # fmt: skip
    lap("oracle_rollouts")
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

    # leaks: every trajectory's state must be gone once verl dropped its agent loop
    gc.collect()
    summary["leaked_states"] = len(EPISODES)
    summary["states"] = {"opened": EPISODES.opened, "peak_open": EPISODES.peak, "expired_by_ttl": EPISODES.expired,
                         "tiny_trajectories_without_purchase": sum(
                             1 for p in tiny["extras"].get("purchased", []) if not p)}  # fmt: skip
    checks["no_leaked_states"] = summary["leaked_states"] == 0
    if not checks["no_leaked_states"]:
        errors.append(f"{summary['leaked_states']} per-trajectory state(s) left behind")
    lap("checks")
