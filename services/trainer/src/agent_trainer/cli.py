"""``agent-train``: dataset builder, preflight, tiny model and the training launcher.

agent-train data --env ENV [--catalog DIR]           # data/verl/<env>/{train,val,test}.parquet (WebShop: --catalog)
agent-train data --env textcraft,babyai,webshop --weights 1,1,2 --catalog DIR --out-dir data/verl/mix
agent-train data --catalog DIR --split train --out FILE [--limit N]   # WebShop's own form: one split, one file
agent-train data --catalog DIR --split train --out FILE --from-agentgym webshop_train.json
agent-train envs                                     # the environments the trainer knows
agent-train configs [--write|--check]                # the registry's entries of the agent-loop/interaction files
agent-train configs --show NAME [overrides...]       # a training config as Hydra composes it
agent-train preflight [--config test|full]          # CPU; writes outputs/preflight/summary.json
agent-train train --config NAME [overrides...]      # verl's main_ppo (agent_trainer.verl_main): <env>_grpo_test|train
agent-train tiny-model --catalog DIR --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .config import (
    AGENT_LOOP_CONFIG,
    AGENT_LOOP_NAME,
    AGENT_NAME,
    INTERACTION_CONFIG,
    TRAINING_CONFIGS,
    VERL_LINES,
    config_dir,
    installed_verl_line,
    load_training_config,
    old_config_file_notes,
    training_config_dir,
    training_config_name,
    training_config_names,
    worker_env,
    worker_secrets,
)
from .rehearsal.device import on_cpu
from .worker_secrets import (
    given_secret_overrides,
    hook_overrides,
    remove_secrets,
    secrets_path,
    write_secrets,
)


def _data(args: argparse.Namespace) -> int:
    from agent_envs.envs.webshop.catalog.store import CatalogError

    from .envs.webshop.data import DataError, build_dataset

    if args.env:  # any environment, or a mix: train/val/test files in --out-dir
        return _env_data(args)
    missing = [flag for flag, value in (("--catalog", args.catalog), ("--split", args.split), ("--out", args.out))
               if value is None]  # fmt: skip
    if missing:
        print(f"agent-train data: the following arguments are required: {', '.join(missing)} "
              "(or --env ENV[,ENV...] --out-dir DIR for any environment and mixes)", file=sys.stderr)  # fmt: skip
        return 2
    try:
        summary = build_dataset(args.catalog, args.split, args.out, limit=args.limit, goal_set=args.goal_set,
                                agentgym_file=args.from_agentgym, progress=not args.quiet,
                                agent_name=AGENT_LOOP_NAME if args.agent_loop else AGENT_NAME)  # fmt: skip
    except (DataError, CatalogError) as error:
        print(f"agent-train data: {error}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


def _env_data(args: argparse.Namespace) -> int:
    """``data --env textcraft,babyai,webshop [--weights 1,1,2]``: train/val/test parquet, split sizes printed."""
    from agent_envs.envs.webshop.catalog.store import CatalogError

    from . import envs
    from .env_data import build_env_datasets, sizes_table
    from .envs.webshop.data import DEFAULT_GOAL_SET, DataError

    try:
        env_ids = envs.parse_ids(args.env)
        weights = [float(w) for w in args.weights.split(",")] if args.weights else None
        out_dir = args.out_dir or Path("data/verl") / "_".join(env_ids)
        if args.agent_loop and args.interaction:
            raise DataError("--agent-loop and --interaction name two routes: pick one")
        if args.interaction and installed_verl_line() != "0.7":
            raise DataError(
                "--interaction writes rows for verl 0.7.1's ToolAgentLoop + interactions, which verl 0.8 removed; "
                f"this environment has verl {installed_verl_line()}: leave it out (rows for the agent loops)"
            )
        # the route: --agent-loop (<env>_agent, both lines), --interaction (tool_agent, 0.7.1), else the line's own
        interaction = args.interaction or (not args.agent_loop and installed_verl_line() == "0.7")
        summary = build_env_datasets(env_ids, out_dir, weights=weights, catalog_dir=args.catalog,
                                     goal_set=args.goal_set or DEFAULT_GOAL_SET, train_rows=args.train_rows,
                                     val_rows=args.val_rows, test_rows=args.test_rows,
                                     interaction=interaction, progress=not args.quiet,
                                     env_url=args.env_url or os.environ.get("AGENTRL_URL") or None)  # fmt: skip
    except (DataError, CatalogError, envs.UnknownEnvironment, ValueError) as error:
        print(f"agent-train data: {error}", file=sys.stderr)
        return 2
    if summary.get("reused"):
        print(
            f"agent-train data: reusing the rows in {summary['out_dir']} ({summary['reused']})",
            file=sys.stderr,
        )
    print(sizes_table(summary), file=sys.stderr)
    print(json.dumps(summary))
    return 0


def _envs(args: argparse.Namespace) -> int:
    """``agent-train envs``: what the trainer knows of each environment."""
    from . import envs

    for spec in envs.specs().values():
        rounds = spec.max_rounds  # the override: a training config's environments.<env>.max_rounds
        print(f"{spec.env_id}: {spec.title}\n  agent_name {spec.agent_name}, data_source {spec.data_source}, "
              f"rounds {rounds}\n  reward: {spec.reward_rule}\n  success: {spec.success_rule}")  # fmt: skip
    return 0


def _configs(args: argparse.Namespace) -> int:
    """``agent-train configs``: what the registered environments write into the configs (``--write`` /
    ``--check``): the agent-loop and interaction files' entries and the training configs of each environment with
    a recipe; or a training config as Hydra composes it (``--show``)."""
    from .envs import entries, overlays

    directory = (args.config_dir or config_dir()).resolve()
    if args.show:
        return _show_config(args)
    try:
        stale = entries.stale_files(directory, write=args.write)
        written = overlays.files(directory)
        stale += overlays.stale_files(directory, write=args.write)
    except (entries.StaleEntries, FileNotFoundError) as error:
        print(f"agent-train configs: {error}", file=sys.stderr)
        return 2
    for path in stale:
        print(f"{'wrote' if args.write else 'stale'}: {path}")
    if stale and not args.write:
        print("agent-train configs: the generated entries or training configs differ from the registered "
              "environments': run `agent-train configs --write`", file=sys.stderr)  # fmt: skip
        return 1
    if not stale:
        print(f"up to date: {directory / entries.AGENT_LOOP_FILE}, {directory / entries.INTERACTION_FILE} and "
              f"{len(written)} training configs from the environments' recipes")  # fmt: skip
    return 0


def _show_config(args: argparse.Namespace) -> int:
    """``agent-train configs --show NAME``: the training config as ``main_ppo`` gets it (YAML on stdout)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    line = args.verl_line
    with_verl = not args.without_verl and (line is None or line == installed_verl_line())
    directory = training_config_dir(line) if args.config_dir is None else args.config_dir.resolve()
    try:
        config = load_training_config(args.show, overrides=args.overrides, directory=directory,
                                      with_verl=with_verl, resolve=args.resolve)  # fmt: skip
    except (FileNotFoundError, OmegaConfBaseException) as error:
        print(f"agent-train configs: {error}", file=sys.stderr)
        return 2
    if not with_verl:
        print(f"# {args.show} of {directory}: the project's files only (verl's own defaults left out)")
    print(OmegaConf.to_yaml(config), end="")
    return 0


#: A training config's own name: ``<env>_grpo_test`` / ``<env>_grpo_train`` (``mixed_`` for several environments).
CONFIG_NAME = re.compile(r"(?P<env>[a-z0-9]+)_grpo_(?P<run>test|train)")
#: ``mixed``: the environments of ``make train-test ENV=mixed``.
MIXED_ENVS = "textcraft,babyai,webshop"


def preflight_target(config: str | None, env: str | None) -> tuple[str | None, str | None]:
    """``--config`` and ``--env`` of ``agent-train preflight`` as ``(test|full|None, environments)``: ``--config``
    is ``test`` or ``full``, or a config's own name (``textcraft_grpo_test``, ``mixed_grpo_train``: what the trainer
    job's TRAIN_CONFIG holds), whose environment is the default of ``--env``. Raises ValueError naming what it
    accepts."""
    if config is None or config in TRAINING_CONFIGS:
        return config, env
    match = CONFIG_NAME.fullmatch(config)
    directory = training_config_dir()
    if match is None or not (directory / f"{config}.yaml").is_file():
        known = training_config_names(directory)
        raise ValueError(
            f"no training config {config!r} in {directory}: test, full or one of {', '.join(known)}"
        )
    run = "test" if match["run"] == "test" else "full"
    named = MIXED_ENVS if match["env"] == "mixed" else match["env"]
    return run, env or named


def _preflight(args: argparse.Namespace) -> int:
    from . import envs
    from .preflight import PreflightOptions, run_preflight

    try:  # --env: one environment or a mix (make preflight ENV=...), all played the same way; none: WebShop
        config, env = preflight_target(args.config, args.env)
        env_ids = envs.parse_ids(env) if env else None
    except (ValueError, envs.UnknownEnvironment) as error:
        print(f"agent-train preflight: {error}", file=sys.stderr)
        return 2
    options = PreflightOptions(
        config=config, catalog=args.catalog, out_dir=args.out, env_url=args.env_url, goals=args.goals,
        rollouts=args.rollouts, max_turns=args.max_turns, replicas=args.replicas, config_dir=args.config_dir,
        goal_set=args.goal_set, fresh_cluster=args.fresh_cluster, overrides=list(args.overrides), envs=env_ids,
    )  # fmt: skip
    summary = run_preflight(options)
    brief = {k: summary.get(k) for k in ("ok", "envs", "config_valid", "agent_loop_worker", "step_metrics_ok", "rollouts",
                                         "mean_reward", "oracle_mean_reward",
                                         "leaked_states", "seconds", "checks", "errors", "summary_path")}  # fmt: skip
    print(json.dumps(brief, indent=2))
    if not summary["ok"]:
        print("preflight FAILED: " + "; ".join(summary["errors"]), file=sys.stderr)
        if summary.get("traceback"):
            print(summary["traceback"], file=sys.stderr)
        return 1
    return 0


def _rehearse(args: argparse.Namespace) -> int:
    from . import envs
    from .rehearsal.run import RehearsalOptions, run_rehearsal

    try:
        env_ids = tuple(envs.parse_ids(args.envs))
    except envs.UnknownEnvironment as error:
        print(f"agent-train rehearse: --envs: {error}", file=sys.stderr)
        return 2
    summary = run_rehearsal(RehearsalOptions(out_dir=args.out, catalog=args.catalog, goals=args.goals,
                                             outage_s=args.outage_s, env=args.env,
                                             train_further=args.train_further, fail_fast=args.fail_fast,
                                             model_dir=args.model_dir, envs=env_ids))  # fmt: skip
    brief = {k: summary.get(k) for k in ("ok", "verl_version", "injected", "steps_completed", "resumed_from_step",
                                         "checkpoint", "merged_model", "eval_episodes", "env_outage_survived",
                                         "env_reward_mean", "update_direction_ok", "seconds", "checks", "errors",
                                         "summary_path", "envs")}  # fmt: skip
    brief["per_env"] = summary.get("per_env")
    print(json.dumps(brief, indent=2))
    if not summary["ok"]:
        print(f"rehearsal FAILED: {'; '.join(summary['errors']) or 'a check failed'} (log: {summary['log']})",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


def _tiny_model(args: argparse.Namespace) -> int:
    from .tiny_model import build_tiny_model

    print(build_tiny_model(args.out, args.catalog, force=args.force))
    return 0


TRAIN_MODULE = "agent_trainer.verl_main"  # verl's main_ppo + per-step WebShop and per-environment metrics
# verl 0.9: the same module, which runs verl's main_ppo (the v1 TransferQueue trainer) with a task runner that
# adds the per-environment step metrics (verl_main.main_v1)
TRAIN_MODULE_VERL09 = "agent_trainer.verl_main"


def train_command(
    config: str, overrides: Sequence[str], directory: Path, run_dir: Path | None = None
) -> list[str]:
    """The ``main_ppo`` command line (``--config-path`` must be absolute with a pip-installed verl).

    With ``run_dir``, Hydra's own output directory (``outputs/<date>/<time>`` in the working directory by
    default, created before anything else runs) goes to ``<run_dir>/logs/hydra/<date>_<time>``: the trainer
    runs as any uid, in a working directory it may not be able to write.
    """
    hydra_dir = (
        [f"hydra.run.dir={run_dir.resolve() / 'logs' / 'hydra'}/${{now:%Y-%m-%d_%H-%M-%S}}"]
        if run_dir
        else []
    )
    module = TRAIN_MODULE if installed_verl_line() == "0.7" else TRAIN_MODULE_VERL09
    return [sys.executable, "-m", module, "--config-path", str(directory.resolve()),
            "--config-name", training_config_name(config), *hydra_dir, *overrides]  # fmt: skip


def train_environment(output_root: Path, experiment: str, directory: Path) -> dict[str, str]:
    """Where verl's loggers write: ``<output_root>/<experiment>/{logs,checkpoints,metrics}``."""
    run = output_root.resolve() / experiment
    for sub in ("logs", "checkpoints", "metrics"):
        (run / sub).mkdir(parents=True, exist_ok=True)
    return {
        "AGENTRL_OUTPUT_DIR": str(output_root.resolve()),
        "AGENTRL_EXPERIMENT": experiment,
        "AGENTRL_INTERACTION_CONFIG": os.environ.get("AGENTRL_INTERACTION_CONFIG")
        or str((directory / INTERACTION_CONFIG).resolve()),
        # the agent loop's declarations (verl 0.9 line, or the agent loop on 0.7.1); one file for both lines
        "AGENTRL_AGENT_LOOP_CONFIG": os.environ.get("AGENTRL_AGENT_LOOP_CONFIG")
        or str((config_dir() / AGENT_LOOP_CONFIG).resolve()),
        "VERL_FILE_LOGGER_PATH": str(run / "metrics" / "metrics.jsonl"),
        "TENSORBOARD_DIR": str(run / "logs" / "tensorboard"),
    }


def _config_train_file(config: Any) -> str | None:
    """The composed config's ``data.train_files`` (its ``AGENTRL_TRAIN_FILE`` or default), when it names one file."""
    value = config.data.get("train_files") if config is not None else None
    return value if isinstance(value, str) else None


def _default_train_file(config: str) -> str:
    """The training rows a config's file names by default: ``data/verl/<env>/train.parquet`` for ``<env>_grpo_<run>``
    (what ``agent-train data --env <env>`` writes; the mixed runs' ``data/verl/mixed/``)."""
    return f"data/verl/{training_config_name(config).split('_grpo_', 1)[0]}/train.parquet"


def _training_catalog_line(
    env: dict[str, str], overrides: Sequence[str], default: str | None = None, config: str = "test"
) -> str:
    """The training data's catalog and reward definition (from the parquet's metadata), for train.log: rewards
    from heuristic and spaCy title nouns, or seeded and pinned prices, are different numbers. The training file: a
    ``data.train_files=`` override, ``AGENTRL_TRAIN_FILE``, ``default`` (the composed config's), else the one the
    config ``config`` names by default (:func:`_default_train_file`)."""
    from .envs.webshop.data import dataset_catalog_line

    train_file = next((o.split("=", 1)[1] for o in overrides if o.startswith("data.train_files=")), None)
    train_file = train_file or env.get("AGENTRL_TRAIN_FILE") or default or _default_train_file(config)
    return (
        dataset_catalog_line(train_file)
        or f"catalog of {train_file}: unknown (not built by agent-train data)"
    )


def composed_config(
    config_name: str, overrides: Sequence[str], directory: Path, env: Mapping[str, str]
) -> Any:
    """The training config as ``main_ppo`` composes it, resolved with ``env`` (the configs read AGENTRL_*
    through oc.env)."""
    from omegaconf import OmegaConf

    from .preflight import compose_training_config

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        _, config = compose_training_config(training_config_name(config_name), overrides, directory)
        OmegaConf.resolve(config)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return config


#: The dataset settings verl reads files from, relative to the working directory of its task runner.
DATA_FILE_KEYS = ("data.train_files", "data.val_files")


def _hydra_string(value: str) -> str:
    """A Hydra override's quoted string (only the quote is escaped)."""
    return "'" + value.replace("'", "\\'") + "'"


def caller_data_overrides(config: Any, overrides: Sequence[str], cwd: Path) -> list[str]:
    """``overrides`` with every relative dataset path of ``config`` (the config's defaults, ``AGENTRL_TRAIN_FILE``,
    a ``data.*_files=`` override) made absolute against ``cwd``, the caller's directory.

    Why: verl opens ``data.train_files`` from its task runner's working directory, which is the run directory
    (the launcher's ``cwd``) or, on a joined cluster, wherever that node's ``ray start`` ran; a path the user
    typed means the directory they typed it in. URLs (``hdfs://``, ``s3://``) are left as they are.
    """
    from omegaconf import OmegaConf

    resolved = list(overrides)
    for key in DATA_FILE_KEYS:
        value = OmegaConf.select(config, key)
        if value is None:
            continue
        paths = [value] if isinstance(value, str) else [str(v) for v in value]
        fixed = [p if "://" in p or Path(p).is_absolute() else str((cwd / p).resolve()) for p in paths]
        if fixed == paths:
            continue
        text = (
            _hydra_string(fixed[0])
            if isinstance(value, str)
            else "[" + ",".join(map(_hydra_string, fixed)) + "]"
        )
        resolved = [o for o in resolved if o.split("=", 1)[0].lstrip("+~") != key]
        resolved.append(f"{key}={text}")
    return resolved


def batch_problems(config: Any) -> list[str]:
    """What verl would refuse, or silently floor, about the batch sizes for ``nnodes x n_gpus_per_node`` GPUs
    (its ``validate_config`` and FSDP workers' checks), in words, for the launcher to say before anything starts."""
    trainer, actor = config.trainer, config.actor_rollout_ref.actor
    rollout = config.actor_rollout_ref.rollout
    world = int(trainer.nnodes) * int(trainer.n_gpus_per_node)
    if world <= 0:
        return [f"trainer.nnodes x n_gpus_per_node is {world}"]
    problems = []
    n = int(rollout.n)
    tp = int(rollout.get("tensor_model_parallel_size") or 1)
    if world % tp:
        problems.append(f"{world} GPUs do not divide into rollout engines of tensor_model_parallel_size {tp}")
    if actor.get("use_dynamic_bsz"):
        return problems
    sequences = int(config.data.train_batch_size) * n
    if sequences % world:
        problems.append(f"data.train_batch_size x rollout.n = {config.data.train_batch_size} x {n} = {sequences} "
                        f"sequences per step do not divide among {world} GPUs")  # fmt: skip
    sp = int(actor.get("ulysses_sequence_parallel_size") or 1)
    mini = int(actor.ppo_mini_batch_size) * n // max(1, world // sp)
    micro = int(actor.get("ppo_micro_batch_size_per_gpu") or 1)
    if mini <= 0:
        problems.append(f"actor.ppo_mini_batch_size x rollout.n = {actor.ppo_mini_batch_size} x {n} is less than one "
                        f"sequence per GPU on {world} GPUs")  # fmt: skip
    elif mini % micro:
        problems.append(f"each GPU's mini-batch (ppo_mini_batch_size x rollout.n / GPUs = {mini}) is not a multiple "
                        f"of ppo_micro_batch_size_per_gpu ({micro})")  # fmt: skip
    return problems


TRACKER = "latest_checkpointed_iteration.txt"


def complete_checkpoint(step_dir: Path, need_data: bool = True) -> bool:
    """Whether ``global_step_N`` is whole: verl writes ``data.pt`` (the dataloader's state) after every rank saved
    its part of ``actor/`` (FSDP: ``model_world_size_W_rank_R.pt`` for every R), and a rotation
    (max_actor_ckpt_to_keep) may remove ``actor/`` later. ``need_data=False``: the actor alone."""
    import re

    actor = step_dir / "actor"
    if (need_data and not (step_dir / "data.pt").is_file()) or not actor.is_dir():
        return False
    ranks: dict[int, set[int]] = {}
    for path in actor.glob("model_world_size_*_rank_*.pt"):
        match = re.fullmatch(r"model_world_size_(\d+)_rank_(\d+)\.pt", path.name)
        if match:
            ranks.setdefault(int(match.group(1)), set()).add(int(match.group(2)))
    if not ranks:  # another layout (Megatron): a non-empty actor/
        return need_data and any(actor.iterdir())
    return any(found == set(range(size)) for size, found in ranks.items())


def repair_resume_point(checkpoints: Path) -> str | None:
    """Make verl's resume (``resume_mode: auto``: the step in ``latest_checkpointed_iteration.txt``) start from a
    complete checkpoint: a tracker naming an incomplete or missing one (a job killed while saving, or between
    verl's rotation of the previous checkpoint and the new one's ``data.pt``; an empty tracker) is pointed at the
    newest complete step (else the newest whole actor, whose dataloader then restarts its epoch), or moved aside
    when there is none. Returns what it did, or None when the tracker was sound (or absent)."""
    tracker = checkpoints / TRACKER
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    if text.isdigit() and complete_checkpoint(checkpoints / f"global_step_{int(text)}"):
        return None
    saved = sorted((int(p.name.split("_")[-1]), p) for p in checkpoints.glob("global_step_*")
                   if p.name.split("_")[-1].isdigit())  # fmt: skip
    whole = [step for step, path in saved if complete_checkpoint(path)]
    actor_only = [step for step, path in saved if complete_checkpoint(path, need_data=False)]
    named = repr(text) if text else "nothing"
    if whole or actor_only:
        step = whole[-1] if whole else actor_only[-1]
        temporary = tracker.with_name(f".{TRACKER}.tmp")
        temporary.write_text(str(step))
        os.replace(temporary, tracker)
        how = (
            "the newest complete one"
            if whole
            else "the newest whole actor (no dataloader state: its epoch restarts)"
        )
        return f"{TRACKER} named {named}, not a complete checkpoint: resuming from global_step_{step}, {how}"
    aside = tracker.with_name(f"{TRACKER}.incomplete-{text or 'empty'}")
    os.replace(tracker, aside)
    return f"{TRACKER} named {named} and no checkpoint is complete: starting fresh (moved to {aside.name})"


def finished_run(config_name: str, overrides: Sequence[str], directory: Path, env: dict[str, str],
                 config: Any = None) -> tuple[int, int, Path] | None:  # fmt: skip
    """``(last saved step, total steps, checkpoint directory)`` when the run this launch would resume has already
    saved its last step (verl would resume there and train nothing), else None.

    The total is where verl's loop ends: ``len(train dataset) // train_batch_size * total_epochs`` (the rows
    from the parquet, capped by ``data.train_max_samples``), or ``trainer.total_training_steps`` if that is less.
    """
    import pyarrow.parquet as pq

    if config is None:  # the launcher passes the one it composed (a composition costs seconds)
        config = composed_config(config_name, overrides, directory, env)
    trainer = config.trainer
    checkpoints = Path(str(trainer.default_local_dir))
    marker = checkpoints / "latest_checkpointed_iteration.txt"
    if trainer.resume_mode != "auto" or not marker.is_file():
        return None
    try:
        step = int(marker.read_text().strip())
    except ValueError:
        return None
    files = config.data.train_files
    files = [files] if isinstance(files, str) else list(files)
    try:
        rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    except OSError:
        return None
    limit = int(config.data.get("train_max_samples", -1) or -1)
    rows = min(rows, limit) if limit > 0 else rows
    # verl's loop ends at whichever comes first: the last epoch or total_training_steps
    total = rows // int(config.data.train_batch_size) * int(trainer.total_epochs)
    if trainer.get("total_training_steps") is not None:
        total = min(total, int(trainer.total_training_steps))
    return (step, total, checkpoints) if step >= total > 0 else None


def keep_earlier_metrics(path: Path) -> Path | None:
    """verl's file logger truncates its file when a run starts, so a resumed run would lose the steps logged
    before it: move an earlier, non-empty log aside (``metrics.<its last write, UTC>.jsonl``, next to it, where
    ``agent-train report`` reads it too). Returns where it went."""
    import time

    if not path.is_file() or path.stat().st_size == 0:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(path.stat().st_mtime))
    target = path.with_name(f"{path.stem}.{stamp}{path.suffix}")
    counter = 1
    while target.exists():
        target = path.with_name(f"{path.stem}.{stamp}-{counter}{path.suffix}")
        counter += 1
    path.rename(target)
    return target


def worker_env_overrides(env: Mapping[str, str]) -> list[str]:
    """Hydra overrides that give every Ray worker of the run the launcher's settings (``worker_env``).

    Why: on a cluster made with ``ray start`` a node's workers inherit that node's ``ray start`` environment,
    not the launcher's, so ``AGENTRL_ENV``, ``AGENTRL_TURN_TOKENS``, ... would silently fall back to their
    defaults on every node. verl passes ``ray_kwargs.ray_init.runtime_env`` to ``ray.init``: its ``env_vars``
    reach every worker of the job, on every node.
    """
    return [
        f"++ray_kwargs.ray_init.runtime_env.env_vars.{key}='{value}'"
        for key, value in ((k, v.replace("'", "\\'")) for k, v in worker_env(env).items())
    ]  # Hydra's quoted string: only the quote is escaped


def head_unreachable(env: Mapping[str, str]) -> str | None:
    """Why the Ray cluster the run joins cannot be reached (None: its head answers), within the attach timeout.

    Why: verl's ``ray.init`` on a dead head retries for minutes without a word; a launcher that checks first says
    what is wrong at once (agent_envs.ray_serve.attach, the same check as serve-ray and env-check)."""
    from agent_envs.ray_serve.attach import AttachError, check_head

    try:
        check_head(env.get("RAY_ADDRESS") or None)
    except AttachError as error:
        return str(error)
    return None


def deploy_env_on_cluster(env: Mapping[str, str]) -> int:
    """``AGENTRL_ENV=ray``: deploy the env app on the training cluster (or find it there) and wait until every
    node serves it, before verl starts (``agent-envs serve-ray``: idempotent). Returns its exit status."""
    command = [
        sys.executable,
        "-m",
        "agent_envs.cli",
        "serve-ray",
        "--if-missing",  # a deployed app (by hand: its replicas, its catalog path) is kept, never restarted
        "--wait",
        env.get("AGENTRL_RAY_WAIT_S", "600"),
    ]
    if env.get("AGENTRL_RAY_STAGE_CATALOG", "").strip().lower() in ("1", "true", "yes"):
        command.append("--stage-catalog")
    print("+ " + " ".join(shlex.quote(c) for c in command), file=sys.stderr)
    return subprocess.run(command, env=dict(env), stdout=sys.stderr).returncode


def _train(args: argparse.Namespace) -> int:
    directory = (args.config_dir or training_config_dir()).resolve()
    if not (directory / f"{training_config_name(args.config)}.yaml").is_file():
        known = training_config_names(directory)
        print(f"agent-train train: no training config {args.config!r} in {directory} (test, full, or one of "
              f"{', '.join(known)})", file=sys.stderr)  # fmt: skip
        return 2
    experiment = args.experiment or os.environ.get("AGENTRL_EXPERIMENT") or training_config_name(args.config)
    output_root = Path(args.output_dir or os.environ.get("AGENTRL_OUTPUT_DIR") or "outputs")
    env = {**os.environ, **train_environment(output_root, experiment, directory)}
    overrides = list(args.overrides)
    secret_keys = given_secret_overrides(overrides)
    if secret_keys:  # named, never echoed
        print(f"agent-train train: {', '.join(secret_keys)}: a secret never goes into an override (it would be "
              "printed, kept in .hydra/overrides.yaml and sent to W&B with the config); set it in the environment "
              "(or .env) instead: the launcher hands it to the workers in a file only they read", file=sys.stderr)  # fmt: skip
        return 2
    if env.get("WANDB_API_KEY") and not any(o.startswith("trainer.logger=") for o in overrides):
        overrides.append("trainer.logger=[console,file,tensorboard,wandb]")
    device_note = ""
    if on_cpu(
        env
    ):  # the CPU build of the trainer image: the device substituted, and said so in the run's log
        from .rehearsal.device import cpu_train, substitution_lines

        # the run's environments (its config's `environments:`), whose episodes the CPU scale-down shortens
        config_envs = load_training_config(args.config, directory=directory, with_verl=False).get(
            "environments"
        )
        try:
            env, overrides, listed = cpu_train(
                installed_verl_line(),
                overrides,
                env,
                output_root.resolve() / experiment,
                list(config_envs or ()),
            )
        except RuntimeError as error:
            print(f"agent-train train: {error}", file=sys.stderr)
            return 2
        device_note = substitution_lines(listed)
        print(device_note, file=sys.stderr)
    on_ray = env.get("AGENTRL_ENV", "").strip().lower() == "ray"
    # verl joins a running cluster (AGENTRL_ENV=ray, RAY_ADDRESS, an address override): its workers inherit their
    # node's `ray start` environment, not this one, so the run's settings travel in verl's runtime_env
    joined = (
        on_ray
        or bool(env.get("RAY_ADDRESS"))
        or any(o.split("=", 1)[0].lstrip("+") == "ray_kwargs.ray_init.address" for o in overrides)
    )
    run_dir = output_root.resolve() / experiment
    secrets_file = None
    if joined:
        if on_ray:
            from agent_envs.ray_serve import needs_token_mode

            if needs_token_mode(env):
                env["RAY_AUTH_MODE"] = "token"  # verl's ray.init joins the cluster with this machine's token
        given = {o.split("runtime_env.env_vars.", 1)[1].split("=", 1)[0] for o in overrides
                 if "ray_kwargs.ray_init.runtime_env.env_vars." in o}  # fmt: skip
        overrides = worker_env_overrides({k: v for k, v in env.items() if k not in given}) + overrides
        if worker_secrets(env):  # in a file only the workers read (worker_secrets), never in the runtime_env
            secrets_file = secrets_path(run_dir)
            overrides = hook_overrides(overrides, secrets_file)
    nnodes = env.get("AGENTRL_NNODES", "").strip()  # a Slurm job's node count (agent-grpo.sbatch)
    if nnodes and not any(o.split("=", 1)[0].lstrip("+") == "trainer.nnodes" for o in overrides):
        if not nnodes.isdigit() or int(nnodes) < 1:
            print(
                f"agent-train train: AGENTRL_NNODES must be a positive integer, not {nnodes!r}",
                file=sys.stderr,
            )
            return 2
        overrides.append(f"trainer.nnodes={int(nnodes)}")
    config = None
    try:  # relative dataset paths mean the caller's directory, not the run directory verl runs in
        config = composed_config(args.config, overrides, directory, env)
        overrides = caller_data_overrides(config, overrides, Path.cwd())
        for note in old_config_file_notes(config):
            print(f"agent-train train: {note}", file=sys.stderr)
    except Exception as error:  # verl reports a bad override with its own words below
        print(f"agent-train train: could not compose the config to resolve dataset paths ({type(error).__name__}: "
              f"{str(error).splitlines()[0] if str(error) else ''}); they are passed on as given", file=sys.stderr)  # fmt: skip
    command = train_command(args.config, overrides, directory, run_dir)
    log_path = run_dir / "logs" / "train.log"
    print("+ " + " ".join(shlex.quote(c) for c in command), file=sys.stderr)
    print(f"  logs: {log_path}   metrics: {env['VERL_FILE_LOGGER_PATH']}", file=sys.stderr)
    print(f"  config: {training_config_name(args.config)} of {directory} (its file over its base over verl's "
          f"ppo_trainer; `agent-train configs --show {args.config}` prints it): verl's task runner prints it resolved as it "
          f"starts ({log_path.name}), Hydra saves it in {run_dir / 'logs' / 'hydra'}/<time>/.hydra/config.yaml", file=sys.stderr)  # fmt: skip
    if secrets_file is not None:
        print(f"  secrets for the workers ({', '.join(worker_secrets(env))}): in {secrets_file} (mode 0600) "
              "while verl runs", file=sys.stderr)  # fmt: skip
    catalog_line = _training_catalog_line(env, overrides, _config_train_file(config), args.config)
    print(f"  {catalog_line}", file=sys.stderr)
    overlong = _report_overlong_prompts(config, run_dir) if config is not None else ""
    problems = batch_problems(config) if config is not None else []
    if problems:
        gpus = f"{config.trainer.nnodes} node(s) x {config.trainer.n_gpus_per_node} GPU(s)"
        print(f"agent-train train: the batch sizes do not fit {gpus}:\n  " + "\n  ".join(problems) + "\n  "
              "change data.train_batch_size, actor_rollout_ref.actor.ppo_mini_batch_size, "
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (AGENTRL_TRAIN_BATCH_SIZE, "
              "AGENTRL_PPO_MINI_BATCH_SIZE, AGENTRL_MICRO_BATCH_SIZE) or the GPUs (docs/multi-node.md)",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.dry_run:
        return 0
    if config is not None and config.trainer.resume_mode == "auto":
        repaired = repair_resume_point(Path(str(config.trainer.default_local_dir)))
        if repaired:
            print(f"agent-train train: {repaired}", file=sys.stderr)
    # (a config that does not compose: verl says why, below)
    finished = finished_run(args.config, overrides, directory, env, config) if config is not None else None
    if finished is not None:
        step, total, checkpoints = finished
        print(f"agent-train train: run {experiment!r} is already finished: its checkpoint of step {step} (of "
              f"{total}) is in {checkpoints}, so verl would resume there and train nothing.\n"
              f"  evaluate it:      make eval MODEL_PATH={checkpoints}\n"
              f"  a fresh run:      AGENTRL_EXPERIMENT={experiment}_2 (in .env or the environment), or move "
              f"{checkpoints} away\n"
              f"  train it further: raise trainer.total_epochs (TRAIN_EXTRA_ARGS=\"trainer.total_epochs=N\")",
              file=sys.stderr)  # fmt: skip
        return 0
    unreachable = head_unreachable(env) if on_ray or env.get("RAY_ADDRESS") else None
    if unreachable:
        print(f"agent-train train: error: {unreachable}; nothing was trained", file=sys.stderr)
        return 1
    if on_ray and deploy_env_on_cluster(env) != 0:
        print("agent-train train: the env is not serving on every node of the Ray cluster (see above); "
              "nothing was trained", file=sys.stderr)  # fmt: skip
        return 1
    kept = keep_earlier_metrics(Path(env["VERL_FILE_LOGGER_PATH"]))
    if kept is not None:
        print(f"  the earlier invocation's metrics: {kept}", file=sys.stderr)
    if secrets_file is not None:
        write_secrets(secrets_file, worker_secrets(env))
    try:
        # the secrets file goes as soon as the run is told to stop (a preemption's SIGTERM: the workers read it when
        # they started), not only when verl has exited: a SIGKILL after the grace period would skip the `finally`
        on_stop = (lambda: remove_secrets(secrets_file)) if secrets_file is not None else None
        header = "\n".join(filter(None, [catalog_line, device_note, overlong]))
        return _run_logged(command, env, run_dir, log_path, header, on_stop=on_stop)
    finally:
        if secrets_file is not None:
            remove_secrets(secrets_file)


def _report_overlong_prompts(config: Any, run_dir: Path) -> str:
    """Say which rows verl will drop for a first turn over ``data.max_prompt_length`` (its
    ``filter_overlong_prompts`` does that without a word), with the run's own tokenizer; also written into the
    run's log. An empty string when none is over, or when the tokenizer cannot be loaded here (then it says so)."""
    from .envs.webshop.data import overlong_first_turns

    data = config.data
    files = [f for key in ("train_files", "val_files") for f in
             ([data[key]] if isinstance(data[key], str) else list(data[key]))]  # fmt: skip
    limit, model = int(data.max_prompt_length), str(config.actor_rollout_ref.model.path)
    try:
        total, over = overlong_first_turns([f for f in files if Path(f).is_file()], model, limit)
    except (
        Exception
    ) as error:  # no tokenizer here (an offline hub id): verl will load it; only the report is lost
        print(
            f"agent-train train: first turns not measured ({type(error).__name__}: {error})", file=sys.stderr
        )
        return ""
    if not over:
        return ""
    what = ("verl's filter_overlong_prompts drops them" if data.get("filter_overlong_prompts", True)
            else "verl refuses them (filter_overlong_prompts is off)")  # fmt: skip
    lines = [f"agent-train train: {len(over)} of {total} rows have a first turn over data.max_prompt_length "
             f"({limit} tokens): {what}; raise data.max_prompt_length to keep them"]  # fmt: skip
    lines += [f"  {Path(o['file']).name} row {o['row']}: {o['env']} task {o['task']}, {o['tokens']} tokens"
              for o in over[:20]]  # fmt: skip
    if len(over) > 20:
        lines.append(f"  ... and {len(over) - 20} more")
    text = "\n".join(lines)
    print(text, file=sys.stderr)
    return text


def _run_logged(
    command: list[str],
    env: Mapping[str, str],
    run_dir: Path,
    log_path: Path,
    catalog_line: str,
    on_stop: Any = None,
) -> int:
    """Run ``main_ppo``, its output to this terminal and to ``train.log`` (after ``catalog_line``: the training data's
    catalog, and on CPU what was substituted); SIGTERM/SIGINT passed on to it."""
    # cwd: the run directory (writable by whoever runs this), never the image's home or the caller's directory.
    with open(log_path, "ab") as log, subprocess.Popen(command, env=env, cwd=run_dir, stdout=subprocess.PIPE,
                                                       stderr=subprocess.STDOUT) as process:  # fmt: skip
        log.write(f"agent-train: {catalog_line}\n".encode())

        # Pass SIGTERM/SIGINT on to main_ppo (which shuts Ray down) instead of dying and leaving it on the GPUs;
        # ``on_stop`` first (what must not outlive a stopped run, even if a SIGKILL follows).
        def forward(signum: int, _frame: object) -> None:
            if on_stop is not None:
                on_stop()
            process.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            assert process.stdout is not None
            for line in process.stdout:
                sys.stdout.buffer.write(line)
                sys.stdout.flush()
                log.write(line)
            return process.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _env_check(args: argparse.Namespace) -> int:
    from .env_check import run_env_check, summary_lines

    if args.episodes < 1:
        print("agent-train env-check: error: --episodes must be at least 1", file=sys.stderr)
        return 2
    report = run_env_check(os.environ, episodes=args.episodes, goal_set=args.goal_set, envs=args.envs)
    text = json.dumps(report)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    for line in summary_lines(report):
        print(f"agent-train env-check: {line}", file=sys.stderr)
    return 0 if report["ok"] else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent-train", description="verl GRPO on the served environments: data, checks, launch, eval"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("data", help="build a parquet dataset in verl's format (one row per goal)")
    p.add_argument("--catalog", type=Path, default=None, help="prepared catalog directory (WebShop)")
    p.add_argument(
        "--split", choices=["train", "eval", "test"], default=None, help="WebShop alone: the split"
    )
    p.add_argument("--out", type=Path, default=None, help="WebShop alone: output .parquet file")
    p.add_argument("--env", default=None,
                   help="any environment or a mix (webshop, textcraft, babyai, sciworld; comma-separated): writes "
                   "train/val/test.parquet into --out-dir, splits that never share a task, and prints their sizes")  # fmt: skip
    p.add_argument("--weights", default=None, help="with --env: training rows per environment in these "
                   "proportions (comma-separated, one per --env; default equal)")  # fmt: skip
    p.add_argument("--out-dir", type=Path, default=None, help="with --env: default data/verl/<env>_<env>...")
    p.add_argument("--train-rows", type=int, default=None,
                   help="with --env: training rows in all (default: as many as the scarcest environment allows)")  # fmt: skip
    p.add_argument("--val-rows", type=int, default=None, help="with --env: at most this many per environment")
    p.add_argument(
        "--test-rows", type=int, default=None, help="with --env: at most this many per environment"
    )
    p.add_argument("--env-url", default=None,
                   help="with --env: a service serving the environments whose resets make the rows of those "
                        "this machine cannot reset itself (SciWorld without Java or scienceworld; an environment "
                        "whose package is not installed, as in the trainer images); default $AGENTRL_URL; in "
                        "process where it can")  # fmt: skip
    p.add_argument("--limit", type=int, default=None, help="only the first N goals")
    p.add_argument("--goal-set", default=None, help="synthetic (default) or human")
    p.add_argument("--from-agentgym", type=Path, default=None,
                   help="AgentGym-RL webshop_train.json (item_id webshop_<N>, synthetic goals)")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--agent-loop", action="store_true",
                   help="rows for the agent loop (agent_name webshop_agent, with --env <env>_agent; the verl 0.9 "
                        "line, and 0.7.1 too) instead of the 0.7.1 interaction path (tool_agent)")  # fmt: skip
    p.add_argument("--interaction", action="store_true",
                   help="with --env: rows for verl 0.7.1's ToolAgentLoop + each environment's interaction "
                        "(agent_name tool_agent); default with --env: this on verl 0.7.x, --agent-loop on 0.9")  # fmt: skip
    p.set_defaults(func=_data)

    p = commands.add_parser(
        "envs", help="the environments the trainer knows: agent loop, rounds, reward, success"
    )
    p.set_defaults(func=_envs)

    p = commands.add_parser(
        "configs",
        help="the files derived from the registered environments (--write, --check), or a training config as it "
        "composes (--show NAME)",
        description="Each environment but WebShop has an entry <id>_agent in configs/agent_loop.yaml (its "
        "agent loop) and <id> in configs/interaction.yaml (its verl 0.7.1 interaction), generated between "
        "two marker lines from what it registers: its trainer spec (agent_trainer.envs; a plugin's through its "
        "registration's trainer=) and the balancer's timeouts of its registration (the client waits at least the "
        "balancer's retry window). Each environment whose trainer spec has a recipe (its TrainingRecipe: "
        "WebShop, TextCraft, BabyAI, SciWorld, Sokoban, a plugin's) has its four training configs written from it: "
        "<id>_grpo_test.yaml and _train.yaml in configs/ (verl 0.7.1) and configs/verl09/ (verl 0.9.1), each over "
        "its line's base. --write rewrites them all after an environment is registered or a recipe changed; "
        "--check (the default) exits 1 naming the stale files. --show NAME prints the training config NAME (test, full or "
        "<env>_grpo_test/_train) as Hydra composes it for main_ppo: the environment's file over its base "
        "(configs/base/grpo_{test,train}.yaml; configs/verl09/ on verl 0.9) over verl's ppo_trainer, with the "
        "overrides given; every hyper-parameter of that run.",
        epilog="examples: agent-train configs --write | agent-train configs --show textcraft_grpo_test | "
        "agent-train configs --show full --resolve trainer.total_epochs=2 | agent-train configs --show "
        "mixed_grpo_test --verl-line 0.9 --without-verl",
    )  # fmt: skip
    action = p.add_mutually_exclusive_group()
    action.add_argument(
        "--write",
        action="store_true",
        help="rewrite the generated entries and training configs from the registry",
    )
    action.add_argument("--check", action="store_true",
                        help="exit 1 when a generated entry or training config differs from the registry (the default action)")  # fmt: skip
    action.add_argument("--show", metavar="NAME", default=None,
                        help="print the training config NAME as Hydra composes it (YAML)")  # fmt: skip
    p.add_argument("--config-dir", type=Path, default=None,
                   help="the configs directory (default: $AGENTRL_CONFIG_DIR, else the checkout's configs/); with "
                   "--show: the line's training config directory itself")  # fmt: skip
    p.add_argument("--verl-line", choices=VERL_LINES, default=None,
                   help="with --show: the line whose configs (default: the installed verl's); the other line's "
                   "compose without verl's defaults")  # fmt: skip
    p.add_argument("--without-verl", action="store_true",
                   help="with --show: only what the project's files set (verl's ppo_trainer left out)")  # fmt: skip
    p.add_argument("--resolve", action="store_true",
                   help="with --show: interpolations resolved (${oc.env:...} from this environment)")  # fmt: skip
    p.add_argument("overrides", nargs="*", help="with --show: Hydra overrides, e.g. trainer.total_epochs=2")
    p.set_defaults(func=_configs)

    p = commands.add_parser("preflight", help="CPU checks of configs, data, env and verl's agent loop")
    p.add_argument("--config", default=None,
                   help="test or full (check only that run's config and roll out with it), or a config's own name "
                   "(textcraft_grpo_test, mixed_grpo_train: its environments are --env's default); default: check "
                   "both, roll out with test")  # fmt: skip
    p.add_argument("--catalog", type=Path, default=None, help="default: $WEBSHOP_CATALOG / data/catalog")
    p.add_argument("--out", type=Path, default=Path("outputs/preflight"))
    p.add_argument("--env-url", default=None,
                   help="reuse this service if it serves the same catalog (default: $AGENTRL_URL or :36003)")  # fmt: skip
    p.add_argument(
        "--fresh-cluster", action="store_true", help="always start (and stop) a cluster of its own"
    )
    p.add_argument("--env", default=None,
                   help="another environment or a mix (textcraft, babyai, textcraft,webshop): its configs "
                        "(<env>_grpo_test/_train, mixed_grpo_* for several), data, cluster and agent loop "
                        "(default: WebShop's preflight)")  # fmt: skip
    p.add_argument("--goal-set", default="synthetic")
    p.add_argument("--goals", type=int, default=4)
    p.add_argument("--rollouts", type=int, default=2)
    p.add_argument("--max-turns", type=int, default=8,
                   help="verl's max_assistant_turns for the CPU rollouts: allows max-turns - 1 env steps, and the "
                        "oracle's goals are picked with plans of every length up to that (default: %(default)s)")  # fmt: skip
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--config-dir", type=Path, default=None)
    p.add_argument("overrides", nargs="*",
                   help="the training run's Hydra overrides (TRAIN_EXTRA_ARGS), checked with the configs")  # fmt: skip
    p.set_defaults(func=_preflight)

    p = commands.add_parser(
        "rehearse",
        help="the test training run on CPU through verl's own trainer (tiny model, real env cluster): 2 steps, "
        "a checkpoint, an env outage, a resumed step 3, the merger",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("outputs/rehearsal"),
        help="writes OUT/verl<line>-<env>[+<env>]/summary.json",
    )
    p.add_argument("--catalog", type=Path, default=None, help="default: $WEBSHOP_CATALOG / data/catalog")
    p.add_argument("--goals", type=int, default=12, help="training goals (4 per step)")
    p.add_argument("--outage-s", type=float, default=60.0,
                   help="seconds every env replica is stopped during step 2's rollout (0: none)")  # fmt: skip
    p.add_argument("--env", choices=["http", "ray"], default="http",
                   help="http: a local cluster (replicas + nginx) at AGENTRL_URL; ray: the env as a Ray Serve app on "
                   "a Ray head of its own that verl joins, reached with AGENTRL_ENV=ray (default: http)")  # fmt: skip
    p.add_argument("--envs", default="webshop",
                   help="the environment(s) rehearsed, comma-separated: webshop (default), any registered one "
                   "(textcraft, babyai, sciworld, sokoban), or a mix in one run (textcraft,webshop); each run writes "
                   "OUT/verl<line>-<env>[+<env>]/ (make rehearse ENV=...)")  # fmt: skip
    p.add_argument("--train-further", action="store_true",
                   help="then train it further as the README says (trainer.total_epochs=2): a resume from the end of "
                   "the epoch must train step 4")  # fmt: skip
    p.add_argument("--model-dir", type=Path, default=None,
                   help="where the warm-started tiny model is kept and reused (default: OUT/tiny_model-<env>[+<env>])")  # fmt: skip
    p.add_argument("--fail-fast", action="store_true",
                   help="end the run at the first failed trainer-side check (loss mask, reward, update direction, "
                   "weight sync); the summary says which")  # fmt: skip
    p.set_defaults(func=_rehearse)

    p = commands.add_parser("train", help="launch verl's trainer with a training config "
                            "(configs/<env>_grpo_{test,train}.yaml; configs/verl09/ on verl 0.9.1)")  # fmt: skip
    p.add_argument("--config", default="test",
                   help="a training config's name: <env>_grpo_test or <env>_grpo_train (textcraft_grpo_test, "
                   "webshop_grpo_train, ...), mixed_grpo_test|train; test and full: WebShop's two runs")  # fmt: skip
    p.add_argument("--experiment", default=None, help="default: $AGENTRL_EXPERIMENT or the config's name")
    p.add_argument("--output-dir", default=None, help="default: $AGENTRL_OUTPUT_DIR or outputs")
    p.add_argument("--config-dir", type=Path, default=None)
    p.add_argument("--dry-run", action="store_true", help="print the command and exit")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. trainer.total_epochs=2")
    p.set_defaults(func=_train)

    p = commands.add_parser(
        "env-check",
        help="from every node of the running Ray cluster, play expert episodes of every served environment through "
        "the trainer's own clients (AGENTRL_ENV=ray: each node's Serve proxy); exit 1 if a node cannot",
    )  # fmt: skip
    p.add_argument("--episodes", type=int, default=8, help="expert episodes per node and environment (8)")
    p.add_argument("--envs", default=None, help="the environments to play, comma-separated (default: $AGENTRL_ENVS, "
                   "what serve-ray serves, else webshop)")  # fmt: skip
    p.add_argument("--goal-set", default="synthetic", help="WebShop's goal list (default: synthetic)")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    p.set_defaults(func=_env_check)

    p = commands.add_parser("tiny-model", help="build the tiny local model + tokenizer used by the preflight")
    p.add_argument("--catalog", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--force", action="store_true")
    p.set_defaults(func=_tiny_model)

    from .eval_cli import add_commands  # `eval` and `report` (evaluation package)

    add_commands(commands)
    return parser


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    """SIGTERM as an exception, so that ``finally`` blocks run (eval stops the sglang server it started)."""
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    return int(args.func(args))


def deprecated_main() -> int:
    """``webshop-train``: the command's old name, kept for one release."""
    from agent_envs.module_aliases import renamed_command

    return renamed_command("webshop-train", "agent-train", main)


if __name__ == "__main__":
    sys.exit(main())
