"""Every preflight's stages, WebShop alone as any environment or mix (``make preflight``, ``ENV=textcraft``,
``ENV=textcraft,webshop``): each environment's tasks picked through its spec, their rows (``env_data``'s builder,
what ``agent-train data --env`` writes for a training run), then the agent loops through the installed line's
worker with the tiny model and with the scripted oracle (each environment's expert plan, which must succeed on every
trajectory), on verl 0.7.1 the interaction route for the same tasks too, and the state checks over all of them:
every trajectory's state opened, none left behind."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import AGENT_NAME
from .configs import agent_loop_overrides, interaction_file
from .options import PreflightOptions
from .rollouts import load_samples, run_agent_loop_rollouts, run_interaction_rollouts, token_stream_report
from .summary import rounded_mean

#: The per-trajectory figures every route's reward must report (``reward.METRIC_KEYS``: what a training step logs).
REWARD_EXTRAS = ("success", "purchased", "steps", "invalid_actions")


def pick_plans(options: PreflightOptions, catalog_dir: Path, env_url: str
               ) -> tuple[dict[str, dict[int, list[str]]], dict[str, Any]]:  # fmt: skip
    """Each environment's oracle tasks and their expert plans, fitting ``options.max_turns - 1`` env steps: the
    catalog's goals (its oracle, in process) where the spec ``needs_catalog``, else the tasks its core's expert
    solves (the trainer images have no environment extras: the core served at ``env_url`` plans and replays there).
    Returns the plans by environment and, for the cores, where each ran (``agent_envs.client.served``)."""
    from agent_envs.client.served import core_or_served

    from .. import envs
    from ..harness.tasks import pick_env_tasks, pick_oracle_goals

    plans: dict[str, dict[int, list[str]]] = {}
    cores: dict[str, Any] = {}
    for env_id in options.env_ids:
        if envs.get(env_id).needs_catalog:
            plans[env_id] = pick_oracle_goals(
                catalog_dir, options.goal_set, "train", options.goals, options.max_turns
            )
        else:
            cores[env_id] = core_or_served(env_id, env_url)[1]
            plans[env_id] = pick_env_tasks(env_id, options.goals, options.max_turns - 1, env_url)
    return plans, cores


def run_env_stages(options: PreflightOptions, directory: Path, config_name: str, out_dir: Path, catalog: Any,
                   model_dir: Path, env_url: str, summary: dict[str, Any], lap: Any) -> None:  # fmt: skip
    """A preflight's stages, into ``summary`` (its ``errors``/``checks`` filled in place): the tasks and rows
    (their plans within the ``env_step_limit`` verl's turns allow), the agent loops, on verl 0.7.1 the interaction
    route for the same tasks, then the state counts over every trajectory of the run."""
    from ..config import installed_verl_line
    from ..interaction import EPISODES

    errors, checks, env_ids = summary["errors"], summary["checks"], options.env_ids
    plans, summary["cores"] = pick_plans(options, Path(catalog.root), env_url)
    train_file = out_dir / "data" / "train.parquet"
    rows, openings = write_env_rows(env_ids, plans, catalog, options.goal_set, train_file, env_url=env_url)
    # verl's max_assistant_turns = N leaves N - 1 env steps (it stops after the N-th reply without sending it)
    limit = summary["env_step_limit"] = options.max_turns - 1
    lengths = {e: sorted(len(p) for p in ps.values()) for e, ps in plans.items()}
    summary["dataset"] = {"rows": len(rows), "tasks": {e: sorted(p) for e, p in plans.items()},
                          "plan_lengths": lengths}  # fmt: skip
    checks["oracle_plans_fit"] = all(0 < n <= limit for ns in lengths.values() for n in ns)
    if not checks["oracle_plans_fit"]:
        errors.append(f"the oracle's plans {lengths} do not fit the {limit} env steps verl's turns allow")
    lap("data")
    EPISODES.clear()  # the run's state counters: every trajectory of every stage below
    summary.update(_env_agent_loop_stage(options, directory, config_name, model_dir, train_file, rows, openings,
                                         env_ids, errors, checks))  # fmt: skip
    played = summary["rollouts"] + summary["oracle_rollouts"]
    lap("agent_loop_rollouts")
    if installed_verl_line() == "0.7":  # the interaction route too (the 0.7 configs' default: tool_agent)
        interaction_file = out_dir / "data" / "train_interaction.parquet"
        rows, _ = write_env_rows(env_ids, plans, catalog, options.goal_set, interaction_file, interaction=True,
                                 env_url=env_url)  # fmt: skip
        stage = summary["interaction"] = _env_interaction_stage(options, directory, config_name, model_dir,
                                                                interaction_file, rows, openings, errors, checks)  # fmt: skip
        summary["leaked_states"] += stage["leaked_states"]
        played += stage["rollouts"] + stage["oracle_rollouts"]
        lap("interaction_rollouts")
    # every trajectory kept its state in the registry (else the leak count proves nothing), and dropped it
    summary["states"] = {"opened": EPISODES.opened, "peak_open": EPISODES.peak, "expired_by_ttl": EPISODES.expired,
                         "trajectories": played}  # fmt: skip
    checks["states_tracked"] = EPISODES.opened == played
    if not checks["states_tracked"]:
        errors.append(f"{EPISODES.opened} episode state(s) opened for {played} trajectories")
    checks["no_leaked_states"] = summary["leaked_states"] == 0
    if summary["leaked_states"]:
        errors.append(f"{summary['leaked_states']} episode state(s) left behind")


def write_env_rows(env_ids: Sequence[str], plans: Mapping[str, Mapping[int, Sequence[str]]], catalog: Any,
                   goal_set: str, path: Path, interaction: bool = False, env_url: str | None = None
                   ) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """The rows of the picked tasks (``env_data.RowBuilder``: what ``agent-train data --env`` writes; the
    interaction route's with ``interaction``; resets in process, else the service's at ``env_url``) into ``path``;
    the rows and each row's first user turn -> its plan."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..env_data import SCHEMA, RowBuilder

    rows: list[dict[str, Any]] = []
    openings: dict[str, Sequence[str]] = {}
    for env_id in env_ids:
        builder = RowBuilder(env_id, catalog, goal_set, interaction=interaction, env_url=env_url)
        for task, plan in plans[env_id].items():
            row = builder.row(task, "train", len(rows))
            rows.append(row)
            openings[next(m["content"] for m in row["prompt"] if m["role"] == "user")] = plan
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
    return rows, openings


def env_round_overrides(env_ids: Sequence[str], max_turns: int) -> list[str]:
    """Each environment's rounds capped at ``max_turns - 1`` for the CPU rollouts (the expert plans picked fit
    them): a tiny model would otherwise play 30 TextCraft rounds per trajectory."""
    return [f"++environments.{e}.max_rounds={max_turns - 1}" for e in env_ids]


def rollout_errors(label: str, tiny: Mapping[str, Any], oracle: Mapping[str, Any], expected: int,
                   checks: dict[str, bool], prefix: str = "") -> list[str]:  # fmt: skip
    """The checks both routes make on their tiny-model and oracle rollouts (``checks`` filled in place, named with
    ``prefix``); the errors to report, ``label`` naming the route.

    Every trajectory played and its reward reported the figures a training step logs; the oracle succeeded on every
    one; no tiny-model trajectory stopped after a single env step unless its environment ended it (a random reply
    can solve a one-action BabyAI task or end an episode; nothing else may cut the loop to one turn); the trainer's
    per-step metric computation accepted both batches."""
    errors: list[str] = []
    tiny_extras, oracle_extras = tiny["extras"], oracle["extras"]
    checks[f"{prefix}tiny_rollouts"] = len(tiny["scores"]) == expected
    if not checks[f"{prefix}tiny_rollouts"]:
        errors.append(f"{label}tiny-model rollouts: {len(tiny['scores'])} of {expected}")
    checks[f"{prefix}reward_extra_info"] = all(
        len(run["extras"].get(k, [])) == expected for run in (tiny, oracle) for k in REWARD_EXTRAS
    )
    if not checks[f"{prefix}reward_extra_info"]:
        errors.append(f"{label}the reward's extra info lacks {'/'.join(REWARD_EXTRAS)} for some trajectory: "
                      f"tiny model {sorted(tiny_extras)}, oracle {sorted(oracle_extras)}")  # fmt: skip
    cut = [s for s, ended in zip(tiny_extras.get("steps", []), tiny_extras.get("purchased", []), strict=False)
           if s < 2 and not ended]  # fmt: skip
    checks[f"{prefix}tiny_multi_turn"] = not cut
    if cut:
        errors.append(f"{label}{len(cut)} tiny-model trajectories stopped after one env step the environment did "
                      f"not end: steps {tiny_extras.get('steps')}")  # fmt: skip
    success = oracle_extras.get("success", [])
    checks[f"{prefix}oracle_success"] = len(success) == expected and all(x == 1.0 for x in success)
    if not checks[f"{prefix}oracle_success"]:
        errors.append(f"{label}the scripted oracle's expert plans did not succeed on every trajectory: success "
                      f"{success} (scores {oracle['scores']})")  # fmt: skip
    checks[f"{prefix}step_metrics"] = bool(oracle["step_metrics"]) and not any(
        run["step_metrics_error"] for run in (tiny, oracle)
    )
    for name, run in (("tiny model", tiny), ("oracle", oracle)):
        if run["step_metrics_error"]:
            errors.append(
                f"{label}{name}: the trainer's per-step metric computation failed: {run['step_metrics_error']}"
            )
    return errors


def _env_interaction_stage(options: PreflightOptions, directory: Path, name: str, model_dir: Path, train_file: Path,
                           rows: Sequence[Mapping[str, Any]], openings: Mapping[str, Sequence[str]],
                           errors: list[str], checks: dict[str, bool]) -> dict[str, Any]:  # fmt: skip
    """verl 0.7.1's interaction route for the same tasks: ``ToolAgentLoop`` -> the environment's interaction
    (configs/interaction.yaml, chosen by ``interaction_kwargs.name``) -> the reward function, with the tiny model
    and the scripted oracle (:func:`rollout_errors`); what it found (``errors``/``checks`` filled in place)."""
    from ..harness.model_servers import PlanByOpeningServer, TinyModelServer
    from ..interaction import EPISODES

    overrides = [*options.overrides, *agent_loop_overrides(model_dir, train_file, options.rollouts, options.max_turns),
                 f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={interaction_file(directory)}",
                 f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_NAME}",
                 *env_round_overrides([str(r["data_source"]) for r in rows], options.max_turns),
                 *options.extra_overrides]  # fmt: skip
    config, tokenizer, samples = load_samples(name, overrides, directory, model_dir, train_file)
    checks["interaction_dataset"] = len(samples) == len(rows) and all(
        s.get("agent_name") == AGENT_NAME and s["interaction_kwargs"].get("name") == s.get("data_source")
        and "ground_truth" in s["reward_model"] for s in samples
    )  # fmt: skip
    if not checks["interaction_dataset"]:
        errors.append("interaction route: verl's dataset lost rows, agent_name, interaction_kwargs.name or "
                      "reward_model.ground_truth")  # fmt: skip
    before = len(EPISODES)
    tiny = asyncio.run(run_interaction_rollouts(config, samples, options.rollouts,
                                                TinyModelServer(str(model_dir), options.max_new_tokens)))  # fmt: skip
    oracle = asyncio.run(
        run_interaction_rollouts(config, samples, options.rollouts, PlanByOpeningServer(tokenizer, openings))
    )
    gc.collect()
    expected = len(samples) * options.rollouts
    errors.extend(
        rollout_errors("interaction route: ", tiny, oracle, expected, checks, prefix="interaction_")
    )
    return {"worker": oracle.get("agent_loop_worker"), "rollouts": len(tiny["scores"]),
            "mean_reward": rounded_mean(tiny["scores"]), "oracle_rollouts": len(oracle["scores"]),
            "oracle_mean_reward": rounded_mean(oracle["scores"]),
            "oracle_success_rate": rounded_mean(oracle["extras"].get("success", [])),
            "tiny_model": {"mean_steps": rounded_mean(tiny["extras"].get("steps", [])),
                           "invalid_rate": rounded_mean(tiny["extras"].get("invalid_rate", [])),
                           "sample_response": tiny["responses"][0] if tiny["responses"] else ""},
            "leaked_states": len(EPISODES) - before, "step_metrics": oracle["step_metrics"]}  # fmt: skip


def _env_agent_loop_stage(options: PreflightOptions, directory: Path, name: str, model_dir: Path, train_file: Path,
                          rows: Sequence[Mapping[str, Any]], openings: Mapping[str, Sequence[str]],
                          env_ids: Sequence[str], errors: list[str], checks: dict[str, bool]) -> dict[str, Any]:  # fmt: skip
    """The rows through verl's dataset class and the installed line's agent-loop worker: the tiny model, then the
    scripted oracle (:func:`rollout_errors`), each environment's step metrics and every token stream; what it found
    (``errors``/``checks`` filled in place)."""
    from ..harness.model_servers import PlanByOpeningServer, TinyModelServer
    from ..interaction import EPISODES

    overrides = [*options.overrides, *agent_loop_overrides(model_dir, train_file, options.rollouts, options.max_turns),
                 *env_round_overrides(env_ids, options.max_turns), *options.extra_overrides]  # fmt: skip
    config, tokenizer, samples = load_samples(name, overrides, directory, model_dir, train_file)
    by_env = [str(s.get("data_source")) for s in samples]
    checks["env_dataset"] = len(samples) == len(rows) and all(
        s.get("agent_name") == f"{s.get('data_source')}_agent" for s in samples
    ) and sorted(set(by_env)) == sorted(env_ids)  # fmt: skip
    if not checks["env_dataset"]:
        errors.append(
            f"verl's dataset kept {len(samples)} of {len(rows)} rows or lost agent_name/data_source"
        )
    before = len(EPISODES)
    tiny = asyncio.run(run_agent_loop_rollouts(config, samples, options.rollouts,
                                                TinyModelServer(str(model_dir), options.max_new_tokens)))  # fmt: skip
    oracle = asyncio.run(run_agent_loop_rollouts(config, samples, options.rollouts,
                                                  PlanByOpeningServer(tokenizer, openings)))  # fmt: skip
    gc.collect()
    expected = len(samples) * options.rollouts
    records = tiny["records"] + oracle["records"]
    result: dict[str, Any] = {"config_used": name, "agent_loops": {str(s.get("data_source")): s.get("agent_name")
                                                                   for s in samples},
                              "agent_loop_worker": tiny.get("agent_loop_worker"),
                              "rollouts": len(tiny["scores"]), "mean_reward": rounded_mean(tiny["scores"]),
                              "oracle_rollouts": len(oracle["scores"]),
                              "oracle_mean_reward": rounded_mean(oracle["scores"]),
                              "leaked_states": len(EPISODES) - before, "step_metrics": oracle["step_metrics"],
                              "tokenization": sorted({r["mode"] for r in records})}  # fmt: skip
    result["per_env"] = {"tiny_model": per_env_records(tiny["records"], env_ids),
                         "oracle": per_env_records(oracle["records"], env_ids)}  # fmt: skip
    result["tiny_model"] = {"mean_turns": rounded_mean(tiny["num_turns"]),
                            "mean_steps": rounded_mean(tiny["extras"].get("steps", [])),
                            "invalid_rate": rounded_mean(tiny["extras"].get("invalid_rate", [])),
                            "stops": sorted({str(r["stop"]) for r in tiny["records"]})}  # fmt: skip
    result["oracle"] = {"success_rate": rounded_mean(oracle["extras"].get("success", [])),
                        "mean_steps": rounded_mean(oracle["extras"].get("steps", [])),
                        "invalid_actions": sum(oracle["extras"].get("invalid_actions", [])),
                        "stops": sorted({str(r["stop"]) for r in oracle["records"]})}  # fmt: skip
    errors.extend(rollout_errors("", tiny, oracle, expected, checks, prefix="env_"))
    # every environment played on both runs (a mix's rows could lose one silently)
    checks["env_every_env_played"] = all(
        sorted(result["per_env"][run]) == sorted(env_ids) for run in result["per_env"]
    )
    if not checks["env_every_env_played"]:
        errors.append(f"an environment played no trajectory: per environment {result['per_env']}")
    result["step_metrics_ok"] = checks["env_step_metrics"]
    # the per-environment figures every training step logs (verl_main), from the oracle's batch: all solved
    per_env_metrics = {e: {k.rsplit("/", 1)[1]: v for k, v in oracle["step_metrics"].items()
                           if k.startswith(f"env/{e}/")} for e in env_ids}  # fmt: skip
    result["step_metrics_per_env"] = per_env_metrics
    oracle_counts = {e: r["trajectories"] for e, r in result["per_env"]["oracle"].items()}
    checks["env_step_metrics_per_env"] = all(
        m.get("success_rate") == 1.0 and m.get("trajectories") == oracle_counts.get(e)
        for e, m in per_env_metrics.items()
    )
    if not checks["env_step_metrics_per_env"]:
        errors.append(
            f"the step's per-environment metrics (env/<env>/...) are missing or wrong: {per_env_metrics}"
        )
    report = token_stream_report(records, tokenizer)
    result["token_stream"] = report
    result["token_stream_ok"] = checks["env_token_stream"] = report["ok"] and tiny["padded_mask_ok"] and oracle[
        "padded_mask_ok"]  # fmt: skip
    if not result["token_stream_ok"]:
        errors.append(f"token stream check failed: {report['problems'] or report}")
    return result


def per_env_records(
    records: Sequence[Mapping[str, Any]], env_ids: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Trajectories per environment (the agent loop's records carry their environment): count, mean score, mean
    model turns, and how they stopped."""
    out: dict[str, dict[str, Any]] = {}
    for env_id in env_ids:
        mine = [r for r in records if r.get("env") == env_id]
        if mine:
            out[env_id] = {"trajectories": len(mine),
                           "mean_score": rounded_mean([float(r["reward"]) for r in mine]),
                           "mean_turns": rounded_mean([len(r["generated"]) for r in mine]),
                           "stops": sorted({str(r["stop"]) for r in mine})}  # fmt: skip
    return out
