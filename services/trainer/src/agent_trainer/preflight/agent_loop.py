"""A catalog run's agent-loop stage (``webshop_agent``) through the worker verl itself runs, on both verl lines: the
catalog's goals played with the tiny model and with the scripted oracle (found by the goal's instruction); the
only stage on verl >= 0.8, which has no interaction route."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import AGENT_LOOP_NAME
from .configs import agent_loop_overrides
from .envs import env_round_overrides
from .options import PreflightOptions
from .rollouts import load_samples, run_agent_loop_rollouts, token_stream_report
from .summary import rounded_mean


def run_agent_loop_stage(options: PreflightOptions, directory: Path, config_name: str, out_dir: Path,
                         catalog_dir: Path, model_dir: Path, plans: Mapping[int, Sequence[str]]) -> dict[str, Any]:  # fmt: skip
    """The WebShop agent loop through verl's real AgentLoopWorker: tiny model, then the scripted oracle.

    Needs the env cluster's URL in ``AGENTRL_URL``. Returns results, ``checks`` and ``errors`` (never raises
    for a failed check; raises for a broken setup).
    """
    from ..envs.webshop.data import build_dataset
    from ..harness.model_servers import ScriptedServer, TinyModelServer
    from ..interaction import EPISODES

    result: dict[str, Any] = {"agent_loop": AGENT_LOOP_NAME, "errors": [], "checks": {}}
    errors, checks = result["errors"], result["checks"]
    train_file = out_dir / "data" / "train_agent_loop.parquet"
    built = build_dataset(catalog_dir, "train", train_file, goal_set=options.goal_set, goal_ids=list(plans),
                          progress=False, agent_name=AGENT_LOOP_NAME)  # fmt: skip
    # the training run's own overrides first, then the preflight's small sizes (as the interaction path does)
    overrides = [*options.overrides, *agent_loop_overrides(model_dir, train_file, options.rollouts, options.max_turns),
                 *env_round_overrides(options.env_ids, options.max_turns), *options.extra_overrides]  # fmt: skip
    config, tokenizer, samples = load_samples(config_name, overrides, directory, model_dir, train_file)
    checks["agent_loop_dataset"] = len(samples) == built["rows"] and all(
        s.get("agent_name") == AGENT_LOOP_NAME for s in samples
    )
    if not checks["agent_loop_dataset"]:
        errors.append(
            f"agent loop: verl's dataset kept {len(samples)} of {built['rows']} rows or lost agent_name"
        )

    EPISODES.clear()
    tiny = asyncio.run(run_agent_loop_rollouts(config, samples, options.rollouts,
                                                TinyModelServer(str(model_dir), options.max_new_tokens)))  # fmt: skip
    result["agent_loop_worker"] = tiny["agent_loop_worker"]
    instruction_plans = {s["extra_info"]["instruction"]: plans[int(s["extra_info"]["goal"])] for s in samples}
    oracle = asyncio.run(run_agent_loop_rollouts(config, samples, options.rollouts,
                                                  ScriptedServer(tokenizer, instruction_plans)))  # fmt: skip
    gc.collect()
    result["rollouts"] = len(tiny["scores"])
    result["mean_reward"] = rounded_mean(tiny["scores"])
    # the trainer's own per-step metric computation accepted both steps' trajectories
    result["step_metrics"] = oracle["step_metrics"]
    result["step_metrics_ok"] = checks["agent_loop_step_metrics"] = bool(oracle["step_metrics"]) and not any(
        run["step_metrics_error"] for run in (tiny, oracle)
    )
    for label, run in (("tiny model", tiny), ("oracle", oracle)):
        if run["step_metrics_error"]:
            errors.append(f"agent loop ({label}): {result['agent_loop_worker']}'s trajectories failed the trainer's "
                          f"per-step metric computation: {run['step_metrics_error']}")  # fmt: skip
    result["oracle_rollouts"] = len(oracle["scores"])
    result["oracle_mean_reward"] = rounded_mean(oracle["scores"])
    result["leaked_states"] = len(EPISODES)
    records = tiny["records"] + oracle["records"]
    report = token_stream_report(records, tokenizer)
    result["token_stream"] = report
    result["tokenization"] = sorted({r["mode"] for r in records})
    result["token_stream_ok"] = report["ok"] and tiny["padded_mask_ok"] and oracle["padded_mask_ok"]
    result["tiny_model"] = {
        "mean_turns": rounded_mean(tiny["num_turns"]),
        "mean_steps": rounded_mean(tiny["extras"].get("steps", [])),
        "invalid_rate": rounded_mean(tiny["extras"].get("invalid_rate", [])),
        "stops": sorted({r["stop"] for r in tiny["records"]}),
    }
    result["oracle"] = {
        "success_rate": rounded_mean(oracle["extras"].get("success", [])),
        "mean_steps": rounded_mean(oracle["extras"].get("steps", [])),
        "invalid_actions": sum(oracle["extras"].get("invalid_actions", [])),
        "stops": sorted({r["stop"] for r in oracle["records"]}),
    }
    expected = len(samples) * options.rollouts
    checks["agent_loop_tiny_rollouts"] = result["rollouts"] == expected and all(
        s >= 2 for s in tiny["extras"].get("steps", [0])
    )
    if not checks["agent_loop_tiny_rollouts"]:
        errors.append(
            f"agent loop: tiny-model rollouts incomplete or single-turn: {tiny['extras'].get('steps')}"
        )
    checks["agent_loop_oracle_reward"] = len(oracle["scores"]) == expected and all(
        s == 1.0 for s in oracle["scores"]
    )
    if not checks["agent_loop_oracle_reward"]:
        errors.append(
            f"agent loop: the scripted oracle did not earn 1.0 on every trajectory: {oracle['scores']}"
        )
    checks["agent_loop_reward_extra_info"] = all(
        len(oracle["extras"].get(k, [])) == expected for k in ("success", "steps", "invalid_actions")
    )
    if not checks["agent_loop_reward_extra_info"]:
        errors.append(
            f"agent loop: reward_extra_info lacks success/steps/invalid_actions: {sorted(oracle['extras'])}"
        )
    checks["agent_loop_token_stream"] = result["token_stream_ok"]
    if not result["token_stream_ok"]:
        errors.append(f"agent loop: token stream check failed: {report['problems'] or report}")
    checks["agent_loop_no_leaked_states"] = result["leaked_states"] == 0
    if result["leaked_states"]:
        errors.append(f"agent loop: {result['leaked_states']} episode state(s) left behind")
    return result
