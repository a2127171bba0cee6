"""Step 1: each training config, composed as verl's ``main_ppo`` composes it, checked before a GPU is spent on it.

Keys the stock verl config does not define (verl accepts misspelled YAML keys silently), the ``environments``
block, the batch divisibility rules verl enforces late or never, the multi-turn wiring (the interaction and
agent-loop declarations), and verl's own ``validate_config``. Also the overrides that point a config at the
preflight's tiny model, small dataset and agent loop.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import (
    AGENT_LOOP_CONFIG,
    AGENT_LOOP_NAME,
    AGENT_NAME,
    ENVIRONMENT_SETTINGS,
    ENVIRONMENTS_KEY,
    INTERACTION_CONFIG,
    INTERACTION_NAME,
    config_dir,
    installed_verl_line,
    load_training_config,
)


class PreflightError(RuntimeError):
    """A preflight check failed; the message says which and why."""


def compose_training_config(name: str, overrides: Sequence[str] = (), directory: Path | None = None) -> Any:
    """Compose ``configs/<name>.yaml`` exactly as ``main_ppo`` does (Hydra: the environment's file over its base over
    verl's ``ppo_trainer``, :func:`~agent_trainer.config.load_training_config`; then ``migrate_legacy_reward_impl``).

    Returns ``(config before migration, config after migration)``.
    """
    from verl.experimental.reward_loop import migrate_legacy_reward_impl

    try:
        raw = load_training_config(name, overrides=overrides, directory=(directory or config_dir()).resolve())
    except FileNotFoundError as error:
        raise PreflightError(str(error)) from None
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

    from .. import envs

    section = config.get(ENVIRONMENTS_KEY) if hasattr(config, "get") else None
    if section is None:
        return []
    errors: list[str] = []
    block = OmegaConf.to_container(section, resolve=True) if OmegaConf.is_config(section) else section
    if not isinstance(block, dict):
        return [f"{ENVIRONMENTS_KEY}: expected a mapping of environment -> settings"]
    for env_id, settings in block.items():
        if env_id not in envs.ids():
            errors.append(
                f"{ENVIRONMENTS_KEY}.{env_id}: unknown environment (known: {', '.join(envs.ids())})"
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
    from .. import envs

    expected_agent = AGENT_NAME if installed_verl_line() == "0.7" else AGENT_LOOP_NAME
    # verl 0.9: any environment's agent loop (textcraft_agent...; rows name theirs, agent_trainer.envs)
    accepted = (
        {expected_agent} if expected_agent == AGENT_NAME else {s.agent_name for s in envs.specs().values()}
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
    # the agent-loop declarations: webshop_agent (both lines) and, on 0.7.1, tool_agent (EnvToolAgentLoop)
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


def env_config_names(env_ids: Sequence[str], config: str | None) -> list[str]:
    """The training configs of ``env_ids``: ``<env>_grpo_test`` / ``_train`` (``mixed_grpo_*`` for several
    environments); ``config`` (test | full) picks one, the first is what the rollouts use."""
    name = env_ids[0] if len(env_ids) == 1 else "mixed"
    runs = {"test": f"{name}_grpo_test", "full": f"{name}_grpo_train"}
    return [runs[config]] if config else [runs["test"], runs["full"]]


def preflight_configs(env_ids: Sequence[str], config: str | None) -> dict[str, str]:
    """The configs a preflight checks, the first the one its rollouts use (:func:`env_config_names`), keyed by
    name as the summary shows them (``webshop_grpo_test``, ``mixed_grpo_train``: what a training run names)."""
    return {name: name for name in env_config_names(env_ids, config)}


def check_training_configs(
    configs: dict[str, str],
    overrides: Sequence[str],
    directory: Path,
    summary: dict[str, Any],
    errors: list[str],
) -> None:
    """Step 1 of a preflight: each of ``configs`` (summary key -> config name, :func:`preflight_configs`) checked;
    the reports go into ``summary["configs"]``, their errors into ``errors``, and whether all are valid into
    ``summary["config_valid"]`` and ``summary["checks"]["config_valid"]``."""
    reports = {
        key: check_training_config(name, overrides, directory=directory) for key, name in configs.items()
    }
    summary["configs"] = reports
    for report in reports.values():
        errors.extend(f"{report['name']}: {e}" for e in report["errors"])
    summary["config_valid"] = summary["checks"]["config_valid"] = all(r["valid"] for r in reports.values())


def tiny_run_overrides(model_dir: Path, train_file: Path, rollouts: int, max_turns: int) -> list[str]:
    """Overrides that point a training config at the tiny model and the small dataset, with the preflight's rounds
    (either route: the agent loop's or the interaction's file comes after them)."""
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
    ]


def agent_loop_file() -> Path:
    """The checkout's agent-loop config (configs/agent_loop.yaml: every environment's entry)."""
    return (config_dir() / AGENT_LOOP_CONFIG).resolve()


def interaction_file(directory: Path) -> Path:
    """The interaction config a preflight's training configs in ``directory`` use (verl 0.7.1's route): the one
    beside them, else the checkout's (configs/interaction.yaml)."""
    beside = directory / INTERACTION_CONFIG
    return beside if beside.is_file() else config_dir() / INTERACTION_CONFIG


def agent_loop_overrides(model_dir: Path, train_file: Path, rollouts: int, max_turns: int) -> list[str]:
    """Overrides that point a training config at the tiny model, the small dataset and the agent loop."""
    agent_file = agent_loop_file()
    return [
        *tiny_run_overrides(model_dir, train_file, rollouts, max_turns),
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_file}",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_LOOP_NAME}",
    ]
