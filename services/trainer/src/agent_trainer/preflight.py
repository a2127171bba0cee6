"""The GPU path's safety net, run on CPU: ``agent-train preflight``.

1. Compose each training config with Hydra as ``verl.trainer.main_ppo`` would (plus its legacy-reward
   migration), reject keys the stock verl config does not define (verl accepts misspelled YAML keys
   silently), check the batch divisibility rules and the multi-turn wiring, and run verl's ``validate_config``.
2. Build small parquet files and load them with verl's own dataset class and the tokenizer.
3. Start (or reuse) the local env cluster: real replicas behind a real nginx.
4. Run verl's real ``AgentLoopWorker`` -> ``ToolAgentLoop`` -> ``WebshopInteraction`` -> reward function path
   on CPU: once with a tiny random model built locally, once with a scripted policy replaying the oracle's
   actions, which must earn reward 1.0 through the reward function.
5. Check that no per-trajectory state is left behind; write ``summary.json``; exit non-zero on any failure.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import json
import logging
import os
import sys
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import (
    AGENT_LOOP_CONFIG,
    AGENT_LOOP_NAME,
    AGENT_NAME,
    ENVIRONMENT_SETTINGS,
    ENVIRONMENTS_KEY,
    INTERACTION_CONFIG,
    INTERACTION_NAME,
    TRAINING_CONFIGS,
    config_dir,
    default_env_url,
    installed_verl_line,
    training_config_dir,
)

logger = logging.getLogger(__name__)


class PreflightError(RuntimeError):
    """A preflight check failed; the message says which and why."""


# ---- 1. configs --------------------------------------------------------------------------------------------
def compose_training_config(name: str, overrides: Sequence[str] = (), directory: Path | None = None) -> Any:
    """Compose ``configs/<name>.yaml`` exactly as ``main_ppo`` does (Hydra + ``migrate_legacy_reward_impl``).

    Returns ``(config before migration, config after migration)``.
    """
    from hydra import compose, initialize_config_dir
    from verl.experimental.reward_loop import migrate_legacy_reward_impl

    directory = (directory or config_dir()).resolve()
    if not (directory / f"{name}.yaml").exists():
        raise PreflightError(f"no training config {directory / (name + '.yaml')}")
    with initialize_config_dir(config_dir=str(directory), version_base=None):
        raw = compose(config_name=name, overrides=list(overrides))
    migrated = migrate_legacy_reward_impl(copy.deepcopy(raw))
    return raw, migrated


def compose_stock_config() -> Any:
    """verl's own ``ppo_trainer`` config, composed from the installed package."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer")


def unknown_keys(ours: Any, stock: Any) -> list[str]:
    """Dotted keys set in ``ours`` that the stock config does not define.

    Below a stock node that is an empty mapping (``engine_kwargs.sglang: {}``, ``override_config: {}``...)
    any key is allowed: those are free-form by design.
    """
    from omegaconf import OmegaConf

    mine = OmegaConf.to_container(ours, resolve=False)
    base = OmegaConf.to_container(stock, resolve=False)
    found: list[str] = []

    def walk(node: Any, reference: Any, prefix: str) -> None:
        if not isinstance(node, dict) or not isinstance(reference, dict):
            return
        if not reference:  # free-form mapping
            return
        for key, value in node.items():
            path = f"{prefix}{key}"
            if key not in reference:
                found.append(path)
            else:
                walk(value, reference[key], path + ".")

    walk(mine, base, "")
    return found


def environment_errors(config: Any) -> list[str]:
    """The training config's ``environments`` block (per-environment episode shape, read by the agent loops):
    known environment ids, known keys, positive integers. A misspelling would silently fall back to a default."""
    from omegaconf import OmegaConf

    from . import envs

    section = config.get(ENVIRONMENTS_KEY) if hasattr(config, "get") else None
    if section is None:
        return []
    errors: list[str] = []
    block = OmegaConf.to_container(section, resolve=True) if OmegaConf.is_config(section) else section
    if not isinstance(block, dict):
        return [f"{ENVIRONMENTS_KEY}: expected a mapping of environment -> settings"]
    for env_id, settings in block.items():
        if env_id not in envs.SPECS:
            errors.append(
                f"{ENVIRONMENTS_KEY}.{env_id}: unknown environment (known: {', '.join(envs.SPECS)})"
            )
            continue
        for key, value in (settings or {}).items():
            if key not in ENVIRONMENT_SETTINGS:
                errors.append(f"{ENVIRONMENTS_KEY}.{env_id}.{key}: unknown setting "
                              f"(known: {', '.join(ENVIRONMENT_SETTINGS)})")  # fmt: skip
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                errors.append(f"{ENVIRONMENTS_KEY}.{env_id}.{key} = {value!r}: must be a positive integer")
    return errors


def batch_rule_errors(config: Any) -> list[str]:
    """The divisibility and wiring rules verl 0.7.1 enforces late (or never), checked up front."""
    errors: list[str] = []
    trainer, data = config.trainer, config.data
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    n_gpus = int(trainer.n_gpus_per_node) * int(trainer.nnodes)
    batch, n = int(data.train_batch_size), int(rollout.n)
    workers = int(rollout.agent.num_workers)
    if n_gpus < 1:
        errors.append(f"trainer.n_gpus_per_node * trainer.nnodes = {n_gpus}: need at least one GPU")
        return errors
    if (batch * n) % n_gpus:
        errors.append(
            f"data.train_batch_size * rollout.n = {batch * n} is not divisible by the GPU count {n_gpus}"
        )
    if (batch * n) % workers:
        errors.append(
            f"data.train_batch_size * rollout.n = {batch * n} is not divisible by rollout.agent.num_workers = "
            f"{workers} (the batch is split equally across agent-loop workers)"
        )
    mini = int(actor.ppo_mini_batch_size)
    if mini > batch:
        errors.append(f"actor.ppo_mini_batch_size = {mini} is larger than data.train_batch_size = {batch}")
    elif batch % mini:
        errors.append(
            f"data.train_batch_size = {batch} is not divisible by actor.ppo_mini_batch_size = {mini}"
        )
    model_parallel = (
        int(rollout.tensor_model_parallel_size)
        * int(rollout.data_parallel_size)
        * int(rollout.pipeline_model_parallel_size)
    )
    if n_gpus % model_parallel:
        errors.append(
            f"rollout.tensor_model_parallel_size * data_parallel_size * pipeline_model_parallel_size = "
            f"{model_parallel} does not divide the GPU count {n_gpus} (set tensor_model_parallel_size=1 on one GPU)"
        )
    for key in ("rollout", "ref"):
        node = config.actor_rollout_ref[key]
        if not actor.use_dynamic_bsz and node.log_prob_micro_batch_size_per_gpu is None:
            errors.append(f"actor_rollout_ref.{key}.log_prob_micro_batch_size_per_gpu is not set")
    if not actor.use_dynamic_bsz and actor.ppo_micro_batch_size_per_gpu is None:
        errors.append("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu is not set")
    from . import envs

    expected_agent = AGENT_NAME if installed_verl_line() == "0.7" else AGENT_LOOP_NAME
    # verl 0.9: any environment's agent loop (textcraft_agent...; rows name theirs, agent_trainer.envs)
    accepted = (
        {expected_agent} if expected_agent == AGENT_NAME else {s.agent_name for s in envs.SPECS.values()}
    )
    if rollout.agent.default_agent_loop not in accepted:
        errors.append(
            f"rollout.agent.default_agent_loop is {rollout.agent.default_agent_loop!r}, not {expected_agent!r}: "
            "verl would silently run single-turn"
        )
    if not data.return_raw_chat:
        errors.append("data.return_raw_chat must be true (the agent loop reads the raw chat)")
    if int(data.max_response_length) < 256:
        errors.append("data.max_response_length is the budget for ALL turns; it is far too small")
    return errors


def interaction_config_errors(path: str | None) -> list[str]:
    """The interaction config exists, has verl 0.7.1's format, names ``webshop`` and its class builds."""
    from omegaconf import OmegaConf

    if not path:
        return [
            "actor_rollout_ref.rollout.multi_turn.interaction_config_path is not set: no interaction would run"
        ]
    file = Path(path)
    if not file.exists():
        return [f"interaction config {file} does not exist"]
    try:
        loaded = OmegaConf.load(file)
        items = loaded.interaction
    except Exception as error:
        return [f"interaction config {file}: {error}"]
    errors: list[str] = []
    names = []
    for position, item in enumerate(items):
        missing = [k for k in ("class_name", "config") if k not in item]
        if missing:
            errors.append(f"interaction config {file}: entry {position} lacks {', '.join(missing)}")
            continue
        names.append(item.get("name"))
        try:
            from verl.interactions.utils.interaction_registry import get_interaction_class

            cls = get_interaction_class(item.class_name)
            cls(config={**OmegaConf.to_container(item.config, resolve=True), "name": item.get("name")})
        except Exception as error:
            errors.append(f"interaction config {file}: {item.class_name} cannot be built: {error}")
    if INTERACTION_NAME not in names:
        errors.append(
            f"interaction config {file} has no interaction named {INTERACTION_NAME!r} (has {names})"
        )
    return errors


def agent_loop_config_errors(path: str | None) -> list[str]:
    """The agent-loop YAML exists, is verl's list format, declares ``webshop_agent`` and its class imports."""
    from omegaconf import ListConfig, OmegaConf

    if not path:
        return [
            "actor_rollout_ref.rollout.agent.agent_loop_config_path is not set: webshop_agent is not declared"
        ]
    try:  # where each line's AgentLoopWorker imports it from
        from verl.utils.import_utils import resolve_config_path  # verl 0.9
    except ImportError:
        from verl.experimental.agent_loop.agent_loop import resolve_config_path  # verl 0.7.1

    try:
        file = Path(resolve_config_path(path))
        items = OmegaConf.load(file)
    except Exception as error:
        return [f"agent-loop config {path}: {error}"]
    if not isinstance(items, ListConfig):
        return [f"agent-loop config {file}: expected a list of {{name, _target_, ...}}"]
    errors: list[str] = []
    names = []
    for position, item in enumerate(items):
        if "name" not in item or "_target_" not in item:
            errors.append(f"agent-loop config {file}: entry {position} lacks name or _target_")
            continue
        names.append(item.name)
        module, _, cls = str(item._target_).rpartition(".")
        try:
            import importlib

            getattr(importlib.import_module(module), cls)
        except Exception as error:
            errors.append(f"agent-loop config {file}: {item._target_} cannot be imported: {error}")
    if AGENT_LOOP_NAME not in names:
        errors.append(f"agent-loop config {file} declares no {AGENT_LOOP_NAME!r} (has {names})")
    return errors


def check_training_config(
    name: str, overrides: Sequence[str] = (), directory: Path | None = None
) -> dict[str, Any]:
    """Step 1 for one config: ``{"name", "valid", "errors", "summary"}`` (never raises)."""
    from omegaconf import OmegaConf

    report: dict[str, Any] = {"name": name, "valid": False, "errors": []}
    errors: list[str] = report["errors"]
    try:
        raw, config = compose_training_config(name, overrides, directory)
    except Exception as error:
        errors.append(f"composing {name}: {type(error).__name__}: {error}")
        return report
    errors.extend(
        f"unknown key (not in verl's ppo_trainer config): {key}"
        for key in unknown_keys(raw, compose_stock_config())
        if key != ENVIRONMENTS_KEY  # ours: read by the agent loops (environment_errors checks it)
    )
    errors.extend(environment_errors(raw))
    try:
        resolved = copy.deepcopy(config)
        OmegaConf.resolve(resolved)
    except Exception as error:
        errors.append(f"resolving {name}: {error}")
        return report
    errors.extend(batch_rule_errors(resolved))
    if installed_verl_line() == "0.7":  # the interaction path: verl 0.8+ has no interactions
        errors.extend(
            interaction_config_errors(resolved.actor_rollout_ref.rollout.multi_turn.interaction_config_path)
        )
        try:
            from verl.trainer.ppo.reward import get_custom_reward_fn

            if get_custom_reward_fn(resolved) is None:
                errors.append(
                    "reward.custom_reward_function.path is not set: verl would use its default scorer"
                )
        except Exception as error:
            errors.append(f"reward.custom_reward_function cannot be loaded: {error}")
    # the agent-loop declarations: webshop_agent (both lines) and, on 0.7.1, tool_agent (WebShopToolAgentLoop)
    errors.extend(agent_loop_config_errors(resolved.actor_rollout_ref.rollout.agent.agent_loop_config_path))
    try:
        import warnings

        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import omega_conf_to_dataclass, validate_config

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            validate_config(resolved, use_reference_policy=need_reference_policy(resolved),
                            use_critic=need_critic(resolved))  # fmt: skip
        omega_conf_to_dataclass(resolved.actor_rollout_ref.rollout)
    except Exception as error:
        errors.append(f"verl's validate_config: {type(error).__name__}: {error}")
    rollout = resolved.actor_rollout_ref.rollout
    report["summary"] = {
        "n_gpus": int(resolved.trainer.n_gpus_per_node) * int(resolved.trainer.nnodes),
        "train_batch_size": int(resolved.data.train_batch_size),
        "rollout_n": int(rollout.n),
        "max_assistant_turns": rollout.multi_turn.max_assistant_turns,
        "lr": float(resolved.actor_rollout_ref.actor.optim.lr),
        "total_epochs": int(resolved.trainer.total_epochs),
        "model": str(resolved.actor_rollout_ref.model.path),
        "default_local_dir": str(resolved.trainer.default_local_dir),
    }
    report["valid"] = not errors
    return report


# ---- 3. cluster --------------------------------------------------------------------------------------------
def _get_json(url: str, timeout: float = 2.0) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None


@dataclass
class Cluster:
    url: str
    reused: bool
    run_dir: Path | None = None
    stop: Callable[[], Any] | None = None


def start_or_reuse_cluster(catalog_dir: Path, fingerprint: str, run_dir: Path, env_url: str | None,
                           replicas: int = 2) -> Cluster:  # fmt: skip
    """Reuse the service at ``env_url`` if it serves this catalog, else start replicas + nginx on free ports."""
    if env_url:
        info = _get_json(env_url.rstrip("/") + "/v1/info")
        if info and info.get("fingerprint") == fingerprint:
            return Cluster(url=env_url.rstrip("/"), reused=True)
        if info:
            logger.warning("the service at %s serves another catalog (%s, not %s); starting a local cluster",
                           env_url, info.get("fingerprint"), fingerprint)  # fmt: skip
    from webshop_env import cluster

    run_dir.mkdir(parents=True, exist_ok=True)
    cluster.down(run_dir, quiet=True)  # a previous preflight that was killed
    try:
        record = cluster.up(replicas=replicas, catalog=catalog_dir, base_port=0, port=0, workers=1, run_dir=run_dir,
                            timeout=120.0, quiet=True)  # fmt: skip
    except cluster.ClusterError as error:
        raise PreflightError(f"could not start the local env cluster: {error}") from None
    return Cluster(
        url=record["url"], reused=False, run_dir=run_dir, stop=lambda: cluster.down(run_dir, quiet=True)
    )


# ---- 2 + 4. data and rollouts ------------------------------------------------------------------------------
def pick_oracle_goals(
    catalog_dir: Path, goal_set: str, split: str, count: int, max_turns: int, scan: int | None = None
) -> dict[int, list[str]]:
    """``count`` goals of the split whose oracle plan fits the env steps ``max_turns`` assistant turns allow
    (``max_turns - 1``, see :mod:`.turns`), that replay to reward 1.0 in-process, and whose instruction is
    unique among the picked ones (the scripted policy finds its plan by instruction).

    The goals are spread over every plan length found among the first ``scan`` goals, longest first, so a run
    with as many goals as lengths has one goal at the step limit itself.
    """
    from webshop_env.envs.webshop.catalog.store import open_catalog
    from webshop_env.envs.webshop.core.env import WebShopEnv
    from webshop_env.envs.webshop.core.goals import split_range
    from webshop_env.envs.webshop.core.oracle import expert_actions, run_actions

    from .turns import env_steps_for_turns

    step_limit = env_steps_for_turns(max_turns)
    catalog = open_catalog(catalog_dir)
    env = WebShopEnv(catalog)
    by_length: dict[int, list[tuple[int, list[str]]]] = {}
    instructions: set[str] = set()
    scanned = 0
    for goal in split_range(split, catalog.goal_count(goal_set)):
        if scanned >= (scan or max(200, 25 * count)) and sum(len(v) for v in by_length.values()) >= count:
            break
        scanned += 1
        plan = expert_actions(env, goal, goal_set=goal_set)
        if not plan or len(plan) > step_limit or len(by_length.get(len(plan), [])) >= count:
            continue
        steps = run_actions(env, goal, plan, goal_set=goal_set)
        instruction = steps[0].instruction
        if steps[-1].reward != 1.0 or instruction in instructions:
            continue
        by_length.setdefault(len(plan), []).append((goal, plan))
        instructions.add(instruction)
    picked: dict[int, list[str]] = {}
    queues = [list(by_length[length]) for length in sorted(by_length, reverse=True)]
    while len(picked) < count and any(queues):
        for queue in queues:
            if queue and len(picked) < count:
                goal, plan = queue.pop(0)
                picked[goal] = plan
    if len(picked) < count:
        raise PreflightError(
            f"found only {len(picked)} {split} goals of the {goal_set} set that the oracle solves in {step_limit} "
            f"env steps ({max_turns} assistant turns)"
        )
    return picked


async def _run_rollouts(config: Any, samples: list[dict[str, Any]], n: int, server: Any) -> dict[str, Any]:
    """verl 0.7.1's AgentLoopWorker -> ToolAgentLoop -> WebshopInteraction -> reward function, then the trainer's
    per-step bookkeeping over the output (advantages, metrics)."""
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    from .interaction import close_shared_clients
    from .rehearsal.local_rollout import (
        LocalAgentLoopWorker,
        generation_batch,
        step_metrics_v07,
        summarize_output,
    )

    worker = LocalAgentLoopWorker(config, server, RewardLoopWorker(config))
    batch = generation_batch(samples, n)
    started = time.monotonic()
    try:
        output = await worker.generate_sequences(batch)
    finally:
        await close_shared_clients()
    summary = summarize_output(output)
    summary["agent_loop_worker"] = type(worker).__mro__[1].__name__
    _step_metrics(summary, lambda: step_metrics_v07(config, batch, output, time.monotonic() - started))
    summary["responses"] = [
        worker.tokenizer.decode(row[row != worker.tokenizer.pad_token_id][:400], skip_special_tokens=False)
        for row in output.batch["responses"][:2]
    ]
    return summary


def _step_metrics(summary: dict[str, Any], compute: Callable[[], dict[str, Any]]) -> None:
    """Run the trainer's per-step metric computation; record its metrics, or the error that would end a run."""
    try:
        summary["step_metrics"], summary["step_metrics_error"] = compute(), None
    except Exception as error:
        summary["step_metrics"], summary["step_metrics_error"] = {}, f"{type(error).__name__}: {error}"


@dataclass
class PreflightOptions:
    """What ``agent-train preflight`` runs (the defaults keep it under ~2 minutes on 2 cores)."""

    config: str | None = None  # "test" | "full" | None (check both; roll out with "test")
    catalog: Path | None = None
    out_dir: Path = Path("outputs/preflight")
    env_url: str | None = None  # reuse this service (default: $WEBSHOP_URL or the local balancer's address)
    fresh_cluster: bool = False  # never reuse: always start (and stop) a cluster of our own
    goal_set: str = "synthetic"
    goals: int = 4
    rollouts: int = 2
    # verl's max_assistant_turns for the rollouts: max_turns - 1 env steps (8: plans of up to 7 actions, every
    # plan length of the bundled catalog)
    max_turns: int = 8
    max_new_tokens: int = 24
    replicas: int = 2
    config_dir: Path | None = None
    extra_overrides: list[str] = field(default_factory=list)
    # the training run's own Hydra overrides (compose: TRAIN_EXTRA_ARGS): checked with the configs, and applied
    # to the rollout config before the preflight's small sizes
    overrides: list[str] = field(default_factory=list)
    # the environments (``--env textcraft`` or a mix): their configs, data, cluster and agent loop
    # (``run_env_preflight``); None or ["webshop"]: WebShop's preflight as it always was
    envs: list[str] | None = None


def _default_catalog(out_dir: Path) -> Path:
    """The configured catalog if it exists, else a small generated one under ``out_dir`` (built once)."""
    from webshop_env.settings import default_catalog_dir

    configured = default_catalog_dir()
    if (configured / "manifest.json").exists():
        return configured
    target = out_dir / "catalog"
    if not (target / "manifest.json").exists():
        from webshop_env.envs.webshop.catalog.generate import generate_catalog
        from webshop_env.envs.webshop.catalog.prepare import prepare_catalog

        print(f"preflight: no catalog at {configured}; generating a small one in {target}", file=sys.stderr)
        generate_catalog(out_dir / "raw", products=600, seed=7, progress=False)
        prepare_catalog(out_dir / "raw", target, progress=False)
    return target


# ---- the WebShop agent loop (both verl lines) --------------------------------------------------------------
def agent_loop_overrides(model_dir: Path, train_file: Path, rollouts: int, max_turns: int) -> list[str]:
    """Overrides that point a training config at the tiny model, the small dataset and the agent loop."""
    agent_file = (config_dir() / AGENT_LOOP_CONFIG).resolve()
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={train_file}",
        f"data.val_files={train_file}",
        "data.train_max_samples=-1",
        "data.val_max_samples=-1",
        "data.max_prompt_length=2048",
        "data.max_response_length=8192",
        f"actor_rollout_ref.rollout.n={rollouts}",
        f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={max_turns}",
        f"actor_rollout_ref.rollout.multi_turn.max_user_turns={max_turns}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_file}",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_LOOP_NAME}",
    ]


async def _run_agent_loop_rollouts(
    config: Any, samples: list[dict[str, Any]], n: int, server: Any
) -> dict[str, Any]:
    """The WebShop agent loop through the worker verl itself runs on the installed line, then that line's
    per-step bookkeeping: 0.7.1's ``AgentLoopWorker`` (no reward worker: the loop returns ``reward_score``);
    0.9.1's ``AgentLoopWorkerTQ`` through a real TransferQueue and the v1 trainer's metric computation."""
    from .agent_loop import record_trajectories
    from .interaction import close_shared_clients
    from .rehearsal.local_rollout import (
        LocalAgentLoopWorker,
        generation_batch,
        local_transfer_queue,
        run_tq_rollouts,
        step_metrics_v07,
        summarize_output,
    )

    with record_trajectories() as records:
        try:
            if installed_verl_line() == "0.7":
                worker = LocalAgentLoopWorker(config, server, None)
                batch = generation_batch(samples, n)
                started = time.monotonic()
                output = await worker.generate_sequences(batch)
                summary = summarize_output(output)
                summary["agent_loop_worker"] = type(worker).__mro__[1].__name__
                _step_metrics(
                    summary, lambda: step_metrics_v07(config, batch, output, time.monotonic() - started)
                )
                mask = output.batch["response_mask"]
                summary["padded_mask_ok"] = bool(((mask == 0) | (mask == 1)).all())
            else:
                with local_transfer_queue(config):
                    summary = await run_tq_rollouts(config, samples, server)
                summary["padded_mask_ok"] = (
                    True  # no padded batch on this path: the records are checked below
                )
        finally:
            await close_shared_clients()
    summary["records"] = list(records)
    return summary


def token_stream_report(records: Sequence[Mapping[str, Any]], tokenizer: Any) -> dict[str, Any]:
    """Check each trajectory's token stream.

    - the mask-1 tokens are exactly the tokens the model generated, in order; everything else has mask 0;
    - every trajectory whose replies re-tokenize to the generated tokens (always the scripted oracle's; a
      random model's only sometimes) equals the chat template's full render of its conversation (up to the
      template's separator after the last turn).
    """
    problems: list[str] = []
    compared = 0
    for number, record in enumerate(records):
        ids, mask, start = list(record["ids"]), list(record["mask"]), int(record["prompt_length"])
        response = ids[start:]
        model_tokens = [t for t, m in zip(response, mask, strict=True) if m == 1]
        generated = [t for turn in record["generated"] for t in turn]
        if model_tokens != generated:
            problems.append(f"trajectory {number}: mask-1 tokens are not the model's tokens")
        if len(record["generated"]) > 1 and 0 not in mask:
            problems.append(f"trajectory {number}: several turns but no env tokens (mask 0)")
        canonical = all(
            turn == [*tokenizer.encode(message["content"], add_special_tokens=False), tokenizer.eos_token_id]
            for turn, message in zip(record["generated"],
                                     [m for m in record["messages"] if m["role"] == "assistant"], strict=True)
        )  # fmt: skip
        if not canonical:
            continue
        compared += 1
        render = tokenizer.apply_chat_template(record["messages"], tokenize=True, add_generation_prompt=False)
        render = list(render["input_ids"] if isinstance(render, Mapping) else render)
        rest = render[len(ids) :]
        if render[: len(ids)] != ids or tokenizer.decode(rest).strip():
            problems.append(
                f"trajectory {number} ({record['mode']}): the token stream differs from the chat template's render"
            )
    return {"ok": not problems and compared > 0, "trajectories": len(records), "compared_with_render": compared,
            "problems": problems[:10]}  # fmt: skip


def run_agent_loop_stage(options: PreflightOptions, directory: Path, out_dir: Path, catalog_dir: Path,
                         model_dir: Path, plans: Mapping[int, Sequence[str]]) -> dict[str, Any]:  # fmt: skip
    """The WebShop agent loop through verl's real AgentLoopWorker: tiny model, then the scripted oracle.

    Needs the env cluster's URL in ``WEBSHOP_URL``. Returns results, ``checks`` and ``errors`` (never raises
    for a failed check; raises for a broken setup).
    """
    from omegaconf import OmegaConf
    from verl.utils import hf_tokenizer

    try:
        from verl.trainer.ppo.utils import create_rl_dataset  # verl 0.9
    except ImportError:
        from verl.trainer.main_ppo import create_rl_dataset  # verl 0.7.1

    from .data import build_dataset
    from .interaction import EPISODES
    from .rehearsal.local_rollout import ScriptedServer, TinyModelServer

    result: dict[str, Any] = {"agent_loop": AGENT_LOOP_NAME, "errors": [], "checks": {}}
    errors, checks = result["errors"], result["checks"]
    train_file = out_dir / "data" / "train_agent_loop.parquet"
    built = build_dataset(catalog_dir, "train", train_file, goal_set=options.goal_set, goal_ids=list(plans),
                          progress=False, agent_name=AGENT_LOOP_NAME)  # fmt: skip
    # the training run's own overrides first, then the preflight's small sizes (as the interaction path does)
    overrides = [*options.overrides, *agent_loop_overrides(model_dir, train_file, options.rollouts, options.max_turns),
                 *options.extra_overrides]  # fmt: skip
    _, config = compose_training_config(TRAINING_CONFIGS[options.config or "test"], overrides, directory)
    OmegaConf.resolve(config)
    tokenizer = hf_tokenizer(str(model_dir))
    dataset = create_rl_dataset([str(train_file)], config.data, tokenizer, None, is_train=True)
    samples = [dataset[i] for i in range(len(dataset))]
    checks["agent_loop_dataset"] = len(samples) == built["rows"] and all(
        s.get("agent_name") == AGENT_LOOP_NAME for s in samples
    )
    if not checks["agent_loop_dataset"]:
        errors.append(
            f"agent loop: verl's dataset kept {len(samples)} of {built['rows']} rows or lost agent_name"
        )

    EPISODES.clear()
    tiny = asyncio.run(_run_agent_loop_rollouts(config, samples, options.rollouts,
                                                TinyModelServer(str(model_dir), options.max_new_tokens)))  # fmt: skip
    result["agent_loop_worker"] = tiny["agent_loop_worker"]
    instruction_plans = {s["extra_info"]["instruction"]: plans[int(s["extra_info"]["goal"])] for s in samples}
    oracle = asyncio.run(_run_agent_loop_rollouts(config, samples, options.rollouts,
                                                  ScriptedServer(tokenizer, instruction_plans)))  # fmt: skip
    gc.collect()
    result["rollouts"] = len(tiny["scores"])
    result["mean_reward"] = _mean(tiny["scores"])
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
    result["oracle_mean_reward"] = _mean(oracle["scores"])
    result["leaked_states"] = len(EPISODES)
    records = tiny["records"] + oracle["records"]
    report = token_stream_report(records, tokenizer)
    result["token_stream"] = report
    result["tokenization"] = sorted({r["mode"] for r in records})
    result["token_stream_ok"] = report["ok"] and tiny["padded_mask_ok"] and oracle["padded_mask_ok"]
    result["tiny_model"] = {
        "mean_turns": _mean(tiny["num_turns"]),
        "mean_steps": _mean(tiny["extras"].get("steps", [])),
        "invalid_rate": _mean(tiny["extras"].get("invalid_rate", [])),
        "stops": sorted({r["stop"] for r in tiny["records"]}),
    }
    result["oracle"] = {
        "success_rate": _mean(oracle["extras"].get("success", [])),
        "mean_steps": _mean(oracle["extras"].get("steps", [])),
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


def run_agent_loop_preflight(options: PreflightOptions) -> dict[str, Any]:
    """The preflight on verl >= 0.8 (the 0.9 line): configs, data, cluster, the agent loop; no interaction."""
    from importlib.metadata import version

    started = time.monotonic()
    out_dir = line_dir(options.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"ok": False, "verl_version": version("verl"), "verl_line": installed_verl_line(),
                               "agent_loop": AGENT_LOOP_NAME, "config_valid": False, "rollouts": 0,
                               "mean_reward": None, "oracle_mean_reward": None, "leaked_states": None,
                               "token_stream_ok": False, "errors": [], "checks": {}, "timings": {}}  # fmt: skip
    errors: list[str] = summary["errors"]
    checks: dict[str, bool] = summary["checks"]
    cluster: Cluster | None = None
    directory = (options.config_dir or training_config_dir()).resolve()
    t = time.monotonic()
    try:
        names = [options.config] if options.config else list(TRAINING_CONFIGS)
        # the configs name the agent-loop file relative to the repository; found from any working directory
        os.environ.setdefault("WEBSHOP_AGENT_LOOP_CONFIG", str(config_dir() / AGENT_LOOP_CONFIG))
        reports = [
            check_training_config(TRAINING_CONFIGS[n], options.overrides, directory=directory) for n in names
        ]
        summary["configs"] = {n: r for n, r in zip(names, reports, strict=True)}
        for report in reports:
            errors.extend(f"{report['name']}: {e}" for e in report["errors"])
        summary["config_valid"] = checks["config_valid"] = all(r["valid"] for r in reports)
        summary["timings"]["configs"] = round(time.monotonic() - t, 2)

        from webshop_env.envs.webshop.catalog.store import open_catalog

        from .tiny_model import build_tiny_model

        catalog_dir = (options.catalog or _default_catalog(out_dir)).resolve()
        fingerprint = open_catalog(catalog_dir).fingerprint
        summary["catalog"] = {"dir": str(catalog_dir), "fingerprint": fingerprint}
        model_dir = build_tiny_model(out_dir / "tiny_model", catalog_dir)
        plans = pick_oracle_goals(catalog_dir, options.goal_set, "train", options.goals, options.max_turns)
        reuse_url = None if options.fresh_cluster else (options.env_url or default_env_url())
        cluster = start_or_reuse_cluster(
            catalog_dir, fingerprint, out_dir / "cluster", reuse_url, options.replicas
        )
        os.environ["WEBSHOP_URL"] = cluster.url  # the agent-loop config reads ${oc.env:WEBSHOP_URL}
        summary["cluster"] = {"url": cluster.url, "reused": cluster.reused}
        t = time.monotonic()
        stage = run_agent_loop_stage(options, directory, out_dir, catalog_dir, model_dir, plans)
        summary["timings"]["agent_loop_rollouts"] = round(time.monotonic() - t, 2)
        errors.extend(stage.pop("errors"))
        checks.update(stage.pop("checks"))
        summary.update(stage)
    except Exception as error:
        errors.append(f"{type(error).__name__}: {error}")
        summary["traceback"] = traceback.format_exc(limit=8)
    finally:
        if cluster is not None and cluster.stop is not None:
            cluster.stop()
    return _write_summary(summary, errors, checks, started, out_dir)


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
        names = [options.config] if options.config else list(TRAINING_CONFIGS)
        os.environ.setdefault("WEBSHOP_INTERACTION_CONFIG", str(directory / INTERACTION_CONFIG))
        os.environ.setdefault("WEBSHOP_AGENT_LOOP_CONFIG", str(config_dir() / AGENT_LOOP_CONFIG))
        reports = [
            check_training_config(TRAINING_CONFIGS[n], options.overrides, directory=directory) for n in names
        ]
        summary["configs"] = {n: r for n, r in zip(names, reports, strict=True)}
        for report in reports:
            errors.extend(f"{report['name']}: {e}" for e in report["errors"])
        summary["config_valid"] = checks["config_valid"] = all(r["valid"] for r in reports)
        t = lap("configs", t)

        # 2. data + tiny model
        from webshop_env.envs.webshop.catalog.store import open_catalog

        from .data import build_dataset
        from .tiny_model import build_tiny_model

        catalog_dir = (options.catalog or _default_catalog(out_dir)).resolve()
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
            f"actor_rollout_ref.model.path={model_dir}",
            f"data.train_files={train_file}",
            f"data.val_files={train_file}",
            "data.train_max_samples=-1",
            "data.val_max_samples=-1",
            "data.max_prompt_length=2048",
            "data.max_response_length=8192",
            f"actor_rollout_ref.rollout.n={options.rollouts}",
            f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={options.max_turns}",
            f"actor_rollout_ref.rollout.multi_turn.max_user_turns={options.max_turns}",
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
        reuse_url = None if options.fresh_cluster else (options.env_url or default_env_url())
        cluster = start_or_reuse_cluster(
            catalog_dir, fingerprint, out_dir / "cluster", reuse_url, options.replicas
        )
        os.environ["WEBSHOP_URL"] = cluster.url  # the interaction config reads ${oc.env:WEBSHOP_URL}
        summary["cluster"] = {"url": cluster.url, "reused": cluster.reused}
        t = lap("cluster", t)

        # 4. rollouts: tiny model, then the scripted oracle
        from .interaction import EPISODES
        from .rehearsal.local_rollout import ScriptedServer, TinyModelServer

        EPISODES.clear()
        tiny = asyncio.run(_run_rollouts(rollout_config, samples, options.rollouts,
                                         TinyModelServer(str(model_dir), options.max_new_tokens)))  # fmt: skip
        t = lap("tiny_rollouts", t)
        summary["rollouts"] = len(tiny["scores"])
        summary["mean_reward"] = _mean(tiny["scores"])
        summary["tiny_model"] = {
            "mean_turns": _mean(tiny["num_turns"]),
            "mean_steps": _mean(tiny["extras"].get("steps", [])),
            "invalid_rate": _mean(tiny["extras"].get("invalid_rate", [])),
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
        oracle = asyncio.run(_run_rollouts(rollout_config, samples, options.rollouts,
                                           ScriptedServer(tokenizer, instruction_plans)))  # fmt: skip
        t = lap("oracle_rollouts", t)
        summary["oracle_rollouts"] = len(oracle["scores"])
        summary["oracle_mean_reward"] = _mean(oracle["scores"])
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
            "success_rate": _mean(oracle["extras"].get("success", [])),
            "mean_steps": _mean(oracle["extras"].get("steps", [])),
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
    return _write_summary(summary, errors, checks, started, out_dir)


def line_dir(out_dir: Path) -> Path:
    """Where one verl line's preflight works and writes its summary: ``OUT/verl0.7`` or ``OUT/verl0.9``
    (the two lines' tiny models, data and summaries never overwrite each other)."""
    return out_dir.resolve() / f"verl{installed_verl_line()}"


def _write_summary(
    summary: dict[str, Any], errors: list[str], checks: Mapping[str, bool], started: float, out_dir: Path
) -> dict[str, Any]:
    """Close a preflight run: its time, its verdict (no error, every check true, configs valid), and its
    ``summary.json`` in the line's directory, copied to the parent's ``summary.json`` (the last run's)."""
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary.setdefault("step_metrics_ok", False)
    summary["ok"] = not errors and all(checks.values()) and summary["config_valid"]
    text = json.dumps(summary, indent=2, default=str) + "\n"
    path = out_dir / "summary.json"
    path.write_text(text)
    (out_dir.parent / "summary.json").write_text(text)
    summary["summary_path"] = str(path)
    return summary


def _mean(values: Sequence[float] | Mapping[Any, float]) -> float | None:
    values = list(values)
    return round(sum(values) / len(values), 4) if values else None


# ---- another environment, or a mix (make preflight ENV=textcraft / ENV=textcraft,webshop) -------------------------
def env_config_names(env_ids: Sequence[str], config: str | None) -> list[str]:
    """The training configs of ``env_ids``: ``<env>_grpo_test`` / ``_train`` (``mixed_grpo_*`` for several
    environments); ``config`` (test | full) picks one, the first is what the rollouts use."""
    name = env_ids[0] if len(env_ids) == 1 else "mixed"
    runs = {"test": f"{name}_grpo_test", "full": f"{name}_grpo_train"}
    return [runs[config]] if config else [runs["test"], runs["full"]]


def pick_env_tasks(env_id: str, count: int, max_rounds: int | None = None, env_url: str | None = None
                   ) -> dict[int, list[str]]:  # fmt: skip
    """``count`` training tasks of ``env_id`` whose expert plan fits ``max_rounds`` (default: the spec's rounds) and
    replays to success through the spec (``envs.replay``: the parser, the outcome), with distinct first user turns
    (the scripted policy finds its plan by them), spread over the split. The core is this process's where the
    environment's package is installed, else the service's at ``env_url`` (the trainer images have no
    environment extras: ``webshop_env.client.served``)."""
    from webshop_env.client.served import core_or_served

    from . import envs
    from .env_data import split_tasks
    from .envs.replay import replay_score
    from .evaluation.policies import as_agentgym_reply

    spec = envs.get(env_id)
    core, _ = core_or_served(env_id, env_url)
    train = split_tasks(env_id, "train")
    stride = max(1, len(train) // max(1, 8 * count))
    picked: dict[int, list[str]] = {}
    openings: set[str] = set()
    for task in train[::stride]:
        if len(picked) >= count:
            break
        plan = list(core.expert(task) or [])
        if not plan or len(plan) > (max_rounds or spec.max_rounds or 15):
            continue
        if replay_score(env_id, task, [as_agentgym_reply(a) for a in plan], core=core)["success"] != 1.0:
            continue
        first = core.reset(task)
        opening = spec.first_message({"observation": first.observation, "info": dict(first.info)})
        if opening in openings:
            continue
        openings.add(opening)
        picked[task] = plan
    if len(picked) < count:
        raise PreflightError(f"found only {len(picked)} {env_id} training tasks whose expert plan succeeds")
    return picked


class PlanByOpeningServer:
    """The scripted oracle of a mixed batch: replies ``Action: <plan[k]>`` at the k-th assistant turn of the
    trajectory whose prompt holds one of ``plans``' first user turns (every environment parses that reply)."""

    def __init__(self, tokenizer: Any, plans: Mapping[str, Sequence[str]]) -> None:
        from .rehearsal.local_rollout import _StandInServer

        self.tokenizer, self.plans = tokenizer, {k: list(v) for k, v in plans.items()}
        self._base = _StandInServer()

    async def set_global_steps(self, global_steps: int) -> None:
        await self._base.set_global_steps(global_steps)

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: Mapping[str, Any],
                       **kwargs: Any) -> Any:  # fmt: skip
        from .evaluation.policies import as_agentgym_reply
        from .rehearsal.local_rollout import _ASSISTANT_TURN

        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        plan = next((p for opening, p in self.plans.items() if opening in text), None)
        if plan is None:
            raise RuntimeError(f"scripted policy: no plan for the prompt of request {request_id}")
        turn = max(0, text.count(_ASSISTANT_TURN) - 1)
        reply = "Thought: the plan's next step.\n" + as_agentgym_reply(plan[min(turn, len(plan) - 1)])
        ids = [*self.tokenizer.encode(reply, add_special_tokens=False), self.tokenizer.eos_token_id]
        self._base.calls += 1
        return self._base._output(ids, [0.0] * len(ids) if sampling_params.get("logprobs") else None)


def start_or_reuse_env_cluster(options: PreflightOptions, catalog_dir: Path, fingerprint: str, env_ids: Sequence[str],
                               run_dir: Path) -> Cluster:  # fmt: skip
    """The service at ``--env-url`` when it serves the catalog and every one of ``env_ids``, else replicas + nginx
    of our own serving WebShop and them."""
    url = None if options.fresh_cluster else (options.env_url or default_env_url())
    if url:
        info = _get_json(url.rstrip("/") + "/v1/info")
        if (
            info
            and info.get("fingerprint") == fingerprint
            and all(_get_json(f"{url.rstrip('/')}/{e}/v1/info") for e in env_ids if e != "webshop")
        ):
            return Cluster(url=url.rstrip("/"), reused=True)
    from webshop_env import cluster

    served = ",".join(dict.fromkeys(["webshop", *env_ids]))
    run_dir.mkdir(parents=True, exist_ok=True)
    cluster.down(run_dir, quiet=True)
    try:
        record = cluster.up(replicas=options.replicas, catalog=catalog_dir, base_port=0, port=0, workers=1,
                            run_dir=run_dir, env={"WEBSHOP_ENVS": served}, timeout=180.0, quiet=True)  # fmt: skip
    except cluster.ClusterError as error:
        raise PreflightError(f"could not start the local env cluster ({served}): {error}") from None
    return Cluster(
        url=record["url"], reused=False, run_dir=run_dir, stop=lambda: cluster.down(run_dir, quiet=True)
    )


def run_env_preflight(options: PreflightOptions) -> dict[str, Any]:
    """``agent-train preflight --env textcraft`` (or a mix): the environment's configs through Hydra and verl's
    checks, its rows (``env_data``'s builder) loaded by verl's dataset class, a cluster serving it, and its agent loop
    through the installed line's worker, with the tiny model and with the scripted oracle (each environment's expert
    plan, which must succeed on every trajectory), with per-environment metrics, token streams and leaks checked."""
    from importlib.metadata import version

    from . import envs

    started = time.monotonic()
    env_ids = list(options.envs or [])
    out_dir = line_dir(options.out_dir) / "+".join(env_ids)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"ok": False, "verl_version": version("verl"), "verl_line": installed_verl_line(),
                               "envs": env_ids, "config_valid": False, "rollouts": 0, "mean_reward": None,
                               "oracle_mean_reward": None, "leaked_states": None, "token_stream_ok": False,
                               "errors": [], "checks": {}, "timings": {}}  # fmt: skip
    errors: list[str] = summary["errors"]
    checks: dict[str, bool] = summary["checks"]
    cluster: Cluster | None = None
    directory = (options.config_dir or training_config_dir()).resolve()
    try:
        t = time.monotonic()
        os.environ.setdefault("WEBSHOP_INTERACTION_CONFIG", str(config_dir() / INTERACTION_CONFIG))
        os.environ.setdefault("WEBSHOP_AGENT_LOOP_CONFIG", str(config_dir() / AGENT_LOOP_CONFIG))
        names = env_config_names(env_ids, options.config)
        reports = [check_training_config(n, options.overrides, directory=directory) for n in names]
        summary["configs"] = {n: r for n, r in zip(names, reports, strict=True)}
        for report in reports:
            errors.extend(f"{report['name']}: {e}" for e in report["errors"])
        summary["config_valid"] = checks["config_valid"] = all(r["valid"] for r in reports)
        summary["timings"]["configs"] = round(time.monotonic() - t, 2)

        t = time.monotonic()
        from webshop_env.envs.webshop.catalog.store import open_catalog

        from .tiny_model import build_tiny_model

        catalog_dir = (options.catalog or _default_catalog(out_dir)).resolve()
        catalog = open_catalog(catalog_dir)
        summary["catalog"] = {"dir": str(catalog_dir), "fingerprint": catalog.fingerprint}
        model_dir = build_tiny_model(line_dir(options.out_dir) / "tiny_model", catalog_dir)
        summary["timings"]["model"] = round(time.monotonic() - t, 2)

        t = time.monotonic()
        cluster = start_or_reuse_env_cluster(
            options, catalog_dir, catalog.fingerprint, env_ids, out_dir / "cluster"
        )
        os.environ["WEBSHOP_URL"] = cluster.url  # the agent-loop config reads ${oc.env:WEBSHOP_URL}
        summary["cluster"] = {"url": cluster.url, "reused": cluster.reused}
        summary["timings"]["cluster"] = round(time.monotonic() - t, 2)

        t = time.monotonic()
        from webshop_env.client.served import core_or_served

        plans: dict[str, dict[int, list[str]]] = {}
        summary["cores"] = {}
        for env_id in env_ids:
            if env_id == envs.WEBSHOP:
                plans[env_id] = pick_oracle_goals(
                    catalog_dir, options.goal_set, "train", options.goals, options.max_turns
                )
            else:  # the trainer images have no environment extras: the served core plans and replays there
                summary["cores"][env_id] = core_or_served(env_id, cluster.url)[1]
                plans[env_id] = pick_env_tasks(env_id, options.goals, options.max_turns - 1, cluster.url)
        train_file = out_dir / "data" / "train.parquet"
        rows, openings = write_env_rows(
            env_ids, plans, catalog, options.goal_set, train_file, env_url=cluster.url
        )
        summary["dataset"] = {"rows": len(rows), "tasks": {e: sorted(p) for e, p in plans.items()},
                              "plan_lengths": {e: sorted(len(p) for p in ps.values()) for e, ps in plans.items()}}  # fmt: skip
        summary["timings"]["data"] = round(time.monotonic() - t, 2)

        t = time.monotonic()
        summary.update(_env_agent_loop_stage(options, directory, names[0], model_dir, train_file, rows, openings,
                                             env_ids, errors, checks))  # fmt: skip
        summary["timings"]["agent_loop_rollouts"] = round(time.monotonic() - t, 2)
        if installed_verl_line() == "0.7":  # the interaction route too (the 0.7 configs' default: tool_agent)
            t = time.monotonic()
            interaction_file = out_dir / "data" / "train_interaction.parquet"
            rows, _ = write_env_rows(
                env_ids,
                plans,
                catalog,
                options.goal_set,
                interaction_file,
                interaction=True,
                env_url=cluster.url,
            )
            summary["interaction"] = _env_interaction_stage(options, directory, names[0], model_dir,
                                                            interaction_file, rows, openings, errors, checks)  # fmt: skip
            summary["timings"]["interaction_rollouts"] = round(time.monotonic() - t, 2)
    except Exception as error:
        errors.append(f"{type(error).__name__}: {error}")
        summary["traceback"] = traceback.format_exc(limit=8)
    finally:
        if cluster is not None and cluster.stop is not None:
            cluster.stop()
    return _write_summary(summary, errors, checks, started, out_dir)


def write_env_rows(env_ids: Sequence[str], plans: Mapping[str, Mapping[int, Sequence[str]]], catalog: Any,
                   goal_set: str, path: Path, interaction: bool = False, env_url: str | None = None
                   ) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """The rows of the picked tasks (``env_data.RowBuilder``: what ``agent-train data --env`` writes; the
    interaction route's with ``interaction``; resets in process, else the service's at ``env_url``) into ``path``;
    the rows and each row's first user turn -> its plan."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .env_data import SCHEMA, RowBuilder

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
    """Each environment's rounds capped at ``max_turns - 1`` for the CPU rollouts (WebShop's preflight plays as few
    turns; the expert plans picked fit them): a tiny model would otherwise play 30 TextCraft rounds per trajectory."""
    return [f"++environments.{e}.max_rounds={max_turns - 1}" for e in env_ids]


def _env_interaction_stage(options: PreflightOptions, directory: Path, name: str, model_dir: Path, train_file: Path,
                           rows: Sequence[Mapping[str, Any]], openings: Mapping[str, Sequence[str]],
                           errors: list[str], checks: dict[str, bool]) -> dict[str, Any]:  # fmt: skip
    """verl 0.7.1's interaction route for the same tasks: ``ToolAgentLoop`` -> the environment's interaction
    (configs/webshop_interaction.yaml, chosen by ``interaction_kwargs.name``) -> the reward function; the scripted
    oracle must earn every trajectory's success."""
    from omegaconf import OmegaConf
    from verl.trainer.main_ppo import create_rl_dataset
    from verl.utils import hf_tokenizer

    from .interaction import EPISODES

    interaction_file = config_dir() / INTERACTION_CONFIG
    overrides = [*options.overrides, *agent_loop_overrides(model_dir, train_file, options.rollouts, options.max_turns),
                 f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={interaction_file}",
                 f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_NAME}",
                 *env_round_overrides([str(r["data_source"]) for r in rows], options.max_turns),
                 *options.extra_overrides]  # fmt: skip
    _, config = compose_training_config(name, overrides, directory)
    OmegaConf.resolve(config)
    tokenizer = hf_tokenizer(str(model_dir))
    dataset = create_rl_dataset([str(train_file)], config.data, tokenizer, None, is_train=True)
    samples = [dataset[i] for i in range(len(dataset))]
    checks["interaction_dataset"] = len(samples) == len(rows) and all(
        s.get("agent_name") == AGENT_NAME and s["interaction_kwargs"].get("name") == s.get("data_source")
        for s in samples
    )  # fmt: skip
    if not checks["interaction_dataset"]:
        errors.append("interaction route: verl's dataset lost rows, agent_name or interaction_kwargs.name")
    EPISODES.clear()
    oracle = asyncio.run(
        _run_rollouts(config, samples, options.rollouts, PlanByOpeningServer(tokenizer, openings))
    )
    gc.collect()
    expected = len(samples) * options.rollouts
    success = oracle["extras"].get("success", [])
    result = {"worker": oracle.get("agent_loop_worker"), "oracle_rollouts": len(oracle["scores"]),
              "oracle_mean_reward": _mean(oracle["scores"]), "oracle_success_rate": _mean(success),
              "leaked_states": len(EPISODES), "step_metrics_error": oracle["step_metrics_error"]}  # fmt: skip
    checks["interaction_oracle_success"] = len(success) == expected and all(x == 1.0 for x in success)
    if not checks["interaction_oracle_success"]:
        errors.append(f"interaction route: the scripted oracle did not succeed on every trajectory: {success} "
                      f"(scores {oracle['scores']})")  # fmt: skip
    checks["interaction_step_metrics"] = not oracle["step_metrics_error"]
    if oracle["step_metrics_error"]:
        errors.append(
            f"interaction route: the per-step metric computation failed: {oracle['step_metrics_error']}"
        )
    checks["interaction_no_leaked_states"] = result["leaked_states"] == 0
    return result


def _env_agent_loop_stage(options: PreflightOptions, directory: Path, name: str, model_dir: Path, train_file: Path,
                          rows: Sequence[Mapping[str, Any]], openings: Mapping[str, Sequence[str]],
                          env_ids: Sequence[str], errors: list[str], checks: dict[str, bool]) -> dict[str, Any]:  # fmt: skip
    """The rows through verl's dataset class and the installed line's agent-loop worker: the tiny model, then the
    scripted oracle; what it found (``errors``/``checks`` filled in place)."""
    from omegaconf import OmegaConf
    from verl.utils import hf_tokenizer

    try:
        from verl.trainer.ppo.utils import create_rl_dataset  # verl 0.9
    except ImportError:
        from verl.trainer.main_ppo import create_rl_dataset  # verl 0.7.1

    from .interaction import EPISODES
    from .rehearsal.local_rollout import TinyModelServer

    overrides = [*options.overrides, *agent_loop_overrides(model_dir, train_file, options.rollouts, options.max_turns),
                 *env_round_overrides(env_ids, options.max_turns), *options.extra_overrides]  # fmt: skip
    _, config = compose_training_config(name, overrides, directory)
    OmegaConf.resolve(config)
    tokenizer = hf_tokenizer(str(model_dir))
    dataset = create_rl_dataset([str(train_file)], config.data, tokenizer, None, is_train=True)
    samples = [dataset[i] for i in range(len(dataset))]
    by_env = [str(s.get("data_source")) for s in samples]
    checks["env_dataset"] = len(samples) == len(rows) and all(
        s.get("agent_name") == f"{s.get('data_source')}_agent" for s in samples
    ) and sorted(set(by_env)) == sorted(env_ids)  # fmt: skip
    if not checks["env_dataset"]:
        errors.append(
            f"verl's dataset kept {len(samples)} of {len(rows)} rows or lost agent_name/data_source"
        )
    EPISODES.clear()
    tiny = asyncio.run(_run_agent_loop_rollouts(config, samples, options.rollouts,
                                                TinyModelServer(str(model_dir), options.max_new_tokens)))  # fmt: skip
    oracle = asyncio.run(_run_agent_loop_rollouts(config, samples, options.rollouts,
                                                  PlanByOpeningServer(tokenizer, openings)))  # fmt: skip
    gc.collect()
    expected = len(samples) * options.rollouts
    result: dict[str, Any] = {"config_used": name, "agent_loop_worker": tiny.get("agent_loop_worker"),
                              "rollouts": len(tiny["scores"]), "mean_reward": _mean(tiny["scores"]),
                              "oracle_rollouts": len(oracle["scores"]), "oracle_mean_reward": _mean(oracle["scores"]),
                              "leaked_states": len(EPISODES), "step_metrics": oracle["step_metrics"]}  # fmt: skip
    result["per_env"] = {"tiny_model": per_env_records(tiny["records"], env_ids),
                         "oracle": per_env_records(oracle["records"], env_ids)}  # fmt: skip
    result["oracle"] = {"success_rate": _mean(oracle["extras"].get("success", [])),
                        "mean_steps": _mean(oracle["extras"].get("steps", [])),
                        "invalid_actions": sum(oracle["extras"].get("invalid_actions", []))}  # fmt: skip
    checks["env_tiny_rollouts"] = result["rollouts"] == expected and sorted(result["per_env"]["tiny_model"]) == sorted(
        env_ids)  # fmt: skip
    if not checks["env_tiny_rollouts"]:
        errors.append(f"tiny-model rollouts: {result['rollouts']} of {expected}, per environment "
                      f"{result['per_env']['tiny_model']}")  # fmt: skip
    success = oracle["extras"].get("success", [])
    checks["env_oracle_success"] = (
        len(success) == expected and all(s == 1.0 for s in success)
        and sorted(result["per_env"]["oracle"]) == sorted(env_ids)
    )  # fmt: skip
    if not checks["env_oracle_success"]:
        errors.append(f"the scripted oracle's expert plans did not succeed on every trajectory: success {success}, "
                      f"per environment {result['per_env']['oracle']}")  # fmt: skip
    result["step_metrics_ok"] = checks["env_step_metrics"] = bool(oracle["step_metrics"]) and not any(
        run["step_metrics_error"] for run in (tiny, oracle)
    )
    for label, run in (("tiny model", tiny), ("oracle", oracle)):
        if run["step_metrics_error"]:
            errors.append(
                f"{label}: the trainer's per-step metric computation failed: {run['step_metrics_error']}"
            )
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
    report = token_stream_report(tiny["records"] + oracle["records"], tokenizer)
    result["token_stream"] = report
    result["token_stream_ok"] = checks["env_token_stream"] = report["ok"] and tiny["padded_mask_ok"] and oracle[
        "padded_mask_ok"]  # fmt: skip
    if not result["token_stream_ok"]:
        errors.append(f"token stream check failed: {report['problems'] or report}")
    checks["env_no_leaked_states"] = result["leaked_states"] == 0
    if result["leaked_states"]:
        errors.append(f"{result['leaked_states']} episode state(s) left behind")
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
            out[env_id] = {"trajectories": len(mine), "mean_score": _mean([float(r["reward"]) for r in mine]),
                           "mean_turns": _mean([len(r["generated"]) for r in mine]),
                           "stops": sorted({str(r["stop"]) for r in mine})}  # fmt: skip
    return out
