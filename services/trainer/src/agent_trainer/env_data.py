"""Training data for any environment and for a mix: ``agent-train data --env textcraft,babyai,sciworld,webshop``.

Writes ``train.parquet``, ``val.parquet`` and ``test.parquet`` (verl's format, one row per task) into one folder.
Each environment's tasks are split once, by a fixed rule (:func:`split_tasks`), so the three splits never share a
task; the split sizes are printed. A row carries its environment in ``data_source`` (verl groups validation metrics
by it), so one file trains several environments in one run, by either route:

- the agent loop (verl 0.7.1 and 0.9.1): ``agent_name`` = ``<env>_agent``, the environment's entry of
  configs/webshop_agent_loop.yaml;
- verl 0.7.1's interaction (``interaction=True``, ``agent-train data --env ... --interaction``, the default on
  the 0.7 line): ``agent_name`` = ``tool_agent``, and ``extra_info.interaction_kwargs`` = ``{name: <env>, task,
  goal, goal_set, split}`` picks the environment's entry of configs/webshop_interaction.yaml (``ToolAgentLoop``
  selects the interaction by ``name``). The prompt's first user turn is then what the model sees first: the
  environment's own reset text for the task (the interaction checks it against the service's at the first turn).

Every row carries ``interaction_kwargs`` and its environment and task in ``extra_info``, whichever route it names.

Mixing: the training rows of each environment are in proportion to ``--weights`` (default equal), as many as the
scarcest environment allows without repeating a task (or ``--train-rows``), and interleaved so that every prefix
keeps the proportions (``data.train_max_samples`` takes the first rows). Validation and test rows are each
environment's whole split (or its first ``--val-rows``/``--test-rows``), interleaved the same way, one environment
after the other.

The splits (task = the environment's own index, AgentGym's ``data_idx`` / ``item_id``):

- webshop: the goal-index ranges of ``agent-train data`` (test 0-499, val = "eval" 500-1499, train 1500-) of the
  goal set (default synthetic);
- textcraft: the 544 goals (sorted by crafting depth): test every 8th (``task % 8 == 0``, 68), val ``task % 16 ==
  4`` (34), train the other 442; every depth is in every split;
- babyai: tasks 0-1999 (level ``task % 40``, seed ``task // 40``): test seeds 0-4 (200 tasks, every level 5 times),
  val seed 5 (40, every level once), train seeds 6-49 (1760);
- sciworld: tasks 0-4638 (AgentGym's list: task type ``games.TASKS[k]``, variation ``v``), split by ScienceWorld's
  own train/dev/test variations (``get_variations_train/dev/test``; dev is val here): within each of the 23 task
  types its first half of the variations is train, the next quarter dev, the rest test (contiguous ranges,
  ``SCIWORLD_VARIATION_SPLITS``, checked against a JVM by the tests): train 2,312, val 1,156, test 1,171. A
  split's tasks come round-robin over the task types (one variation of each type, then the next), so any prefix
  (``--val-rows``, ``val_max_samples``, eval's ``MAX_SAMPLES``) covers every type.

Each environment's task pool, split rule and rows are its module's (``agent_trainer.envs.<env>``: the spec's
``task_count``/``split_of``/``split_order`` or ``split_rule``, and its row builder, ``envs.rows.RowBuilder`` or the
module's own: WebShop's from its catalog, SciWorld's from fresh JVMs); this module only mixes, orders and writes
them. SciWorld's rows each need a reset in a *fresh* JVM (``envs.sciworld.SciWorldRows``); where an environment's
core cannot be made here (the trainer image), ``env_url`` (``--env-url``, or ``$WEBSHOP_URL``) names a service
whose resets make the rows, each episode closed at once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from . import envs
from .envs.rows import SCHEMA, RowBuilder
from .envs.spec import SPLITS, DataError, DataOptions
from .envs.webshop import DEFAULT_GOAL_SET

METADATA_KEY = b"webshop.env_data"


def split_tasks(
    env_id: str, split: str, *, catalog: Any = None, goal_set: str = DEFAULT_GOAL_SET
) -> list[int]:
    """The tasks of ``split`` (train, val, test) of ``env_id``, in its split's order (see the module docstring);
    ``catalog`` and ``goal_set``: WebShop's data."""
    return envs.get(env_id).split_tasks(split, DataOptions(catalog=catalog, goal_set=goal_set))


def row_builder(
    env_id: str,
    catalog: Any = None,
    goal_set: str = DEFAULT_GOAL_SET,
    interaction: bool = False,
    progress: bool = True,
    env_url: str | None = None,
) -> RowBuilder:
    """``env_id``'s row builder (its spec's ``rows``, else ``RowBuilder``); ``interaction``: rows for verl 0.7.1's
    ``ToolAgentLoop`` + the environment's interaction (``tool_agent``) instead of its agent loop."""
    spec = envs.get(env_id)
    data = DataOptions(catalog=catalog, goal_set=goal_set, env_url=env_url, progress=progress)
    return (spec.rows or RowBuilder)(spec, data, interaction=interaction)


def weighted_order(counts: Mapping[str, int], weights: Mapping[str, float]) -> list[str]:
    """Environment ids, ``counts[e]`` times each, interleaved so that every prefix is as close as possible to the
    weights' proportions (the next slot goes to the environment furthest behind its share)."""
    taken = dict.fromkeys(counts, 0)
    order: list[str] = []
    for _ in range(sum(counts.values())):
        open_ = [e for e in counts if taken[e] < counts[e]]
        env = min(open_, key=lambda e: ((taken[e] + 1) / weights[e], list(counts).index(e)))
        taken[env] += 1
        order.append(env)
    return order


def train_counts(
    available: Mapping[str, int], weights: Mapping[str, float], total: int | None
) -> dict[str, int]:
    """Training rows per environment in proportion to ``weights``: ``total`` of them exactly (the largest remainders
    round up, the first environment first on a tie: 64 rows of three equal environments are 22/21/21, so a test
    config's 64 rows make its two steps of 32), or (None) as many as the scarcest environment allows without
    repeating a task."""
    weight_sum = sum(weights.values())
    if total is None:
        scale = min(available[e] / weights[e] for e in available)
        counts = {e: int(scale * weights[e] + 1e-9) for e in available}
    else:
        exact = {e: total * weights[e] / weight_sum for e in available}
        counts = {e: int(exact[e] + 1e-9) for e in available}
        order = sorted(available, key=lambda e: -(exact[e] - counts[e]))  # stable: ties keep the given order
        for env_id in order[: total - sum(counts.values())]:
            counts[env_id] += 1
        short = {e: (counts[e], available[e]) for e in counts if counts[e] > available[e]}
        if short:
            raise DataError(
                f"--train-rows {total} with these weights needs more training tasks than there are: "
                + ", ".join(f"{e} {need} > {have}" for e, (need, have) in short.items())
            )
    return counts


def _write(rows: Sequence[dict[str, Any]], path: Path, metadata: Mapping[str, Any]) -> None:
    table = pa.Table.from_pylist(
        list(rows), schema=SCHEMA.with_metadata({METADATA_KEY: json.dumps(metadata)})
    )
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)


def build_env_datasets(
    env_ids: Sequence[str],
    out_dir: Path | str,
    *,
    weights: Sequence[float] | None = None,
    catalog_dir: Path | str | None = None,
    goal_set: str = DEFAULT_GOAL_SET,
    train_rows: int | None = None,
    val_rows: int | None = None,
    test_rows: int | None = None,
    interaction: bool = False,
    progress: bool = True,
    env_url: str | None = None,
) -> dict[str, Any]:
    """Write ``out_dir/{train,val,test}.parquet`` for ``env_ids`` and return the summary (split sizes per env).

    ``interaction``: rows for verl 0.7.1's interaction route (``agent_name: tool_agent``), else for the agent loop
    (``<env>_agent``; both lines). ``progress``: a progress bar where resets are slow (SciWorld's). ``env_url``: a service
    whose resets make SciWorld's rows where this machine has no Java or scienceworld (in process otherwise)."""
    env_ids = list(env_ids)
    for env_id in env_ids:
        envs.get(env_id)
    weights = list(weights) if weights is not None else [1.0] * len(env_ids)
    if len(weights) != len(env_ids):
        raise DataError(f"--weights has {len(weights)} value(s) for {len(env_ids)} environment(s)")
    if any(w <= 0 for w in weights):
        raise DataError("--weights must all be positive")
    for name, value in (("--train-rows", train_rows), ("--val-rows", val_rows), ("--test-rows", test_rows)):
        if value is not None and value < 1:
            raise DataError(f"{name} must be at least 1")
    data = DataOptions(catalog=catalog_dir, goal_set=goal_set, env_url=env_url, progress=progress)
    by_env = dict(zip(env_ids, weights, strict=True))
    tasks = {e: {s: envs.get(e).split_tasks(s, data) for s in SPLITS} for e in env_ids}
    for env_id, splits in tasks.items():  # the rules make this so; a broken rule must not leak tasks
        seen: dict[int, str] = {}
        for split, ids in splits.items():
            for task in ids:
                if task in seen:
                    raise DataError(f"{env_id}: task {task} is in both {seen[task]} and {split}")
                seen[task] = split
    counts = train_counts({e: len(tasks[e]["train"]) for e in env_ids}, by_env, train_rows)
    limits = {"train": None, "val": val_rows, "test": test_rows}
    builders: dict[str, RowBuilder] = {}
    try:
        for env_id in env_ids:
            spec = envs.get(env_id)
            builders[env_id] = (spec.rows or RowBuilder)(spec, data, interaction=interaction)
        key = rows_key(env_ids, by_env, goal_set, counts, limits, builders)
        summary = reusable_rows(out_dir, key)
        if summary is None:
            summary = _write_splits(out_dir, env_ids, by_env, tasks, counts, builders, data, limits)
            summary["tasks"] = {e: {s: len(tasks[e][s]) for s in SPLITS} for e in env_ids}
            _save_key(out_dir, key, summary)
    finally:
        for builder in builders.values():
            builder.close()
    return summary


#: Next to the three files: what they were built from (``rows_key``) and their summary. A launch or a resume
#: that would build the same rows reuses them (SciWorld's full splits are 4,639 resets, each a JVM's).
ROWS_KEY_FILE = "rows.json"
#: The modules whose code writes the rows (prompts, first turns, the split rules): part of the key.
_ROW_MODULES = ("env_data", "data", "envs")


def _code_digest() -> str:
    """A digest of the source of :data:`_ROW_MODULES` (a new prompt or split rule means new rows)."""
    import hashlib

    here = Path(__file__).resolve().parent
    files = sorted(
        f for name in _ROW_MODULES for f in ([here / f"{name}.py"] if (here / f"{name}.py").is_file()
                                             else (here / name).glob("*.py"))
    )  # fmt: skip
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def rows_key(env_ids: Sequence[str], weights: Mapping[str, float], goal_set: str, counts: Mapping[str, int],
             limits: Mapping[str, int | None], builders: Mapping[str, RowBuilder]) -> dict[str, Any]:  # fmt: skip
    """What a set of rows depends on: the environments and their weights, each one's data (the catalog's or the
    core's fingerprint, as the service reports it), the goal set, the rows per split, the route, the code."""
    data = {env_id: builders[env_id].data_fingerprint() for env_id in env_ids}
    return {"envs": list(env_ids), "weights": dict(weights), "data": data, "goal_set": goal_set,
            "train": dict(counts), "limits": dict(limits),
            "agent_names": {e: b.agent_name for e, b in builders.items()}, "code": _code_digest()}  # fmt: skip


def reusable_rows(out_dir: Path | str, key: Mapping[str, Any]) -> dict[str, Any] | None:
    """The summary of rows already in ``out_dir`` that were built from ``key`` (all three files there), else None."""
    out = Path(out_dir)
    try:
        saved = json.loads((out / ROWS_KEY_FILE).read_text())
    except (OSError, ValueError):
        return None
    if saved.get("key") != json.loads(json.dumps(key)) or not all(
        (out / f"{s}.parquet").is_file() for s in SPLITS
    ):
        return None
    summary = dict(saved["summary"])
    summary["reused"] = (
        f"{out / ROWS_KEY_FILE}: the same environments, data, splits and code; built {saved['built']}"
    )
    return summary


def _save_key(out_dir: Path | str, key: Mapping[str, Any], summary: Mapping[str, Any]) -> None:
    import time

    path = Path(out_dir) / ROWS_KEY_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"key": key, "summary": summary,
                               "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=1))  # fmt: skip
    tmp.replace(path)


def _write_splits(
    out_dir: Path | str,
    env_ids: list[str],
    by_env: dict[str, float],
    tasks: Mapping[str, Mapping[str, list[int]]],
    counts: Mapping[str, int],
    builders: Mapping[str, RowBuilder],
    data: DataOptions,
    limits: Mapping[str, int | None],
) -> dict[str, Any]:
    """The three files of ``build_env_datasets`` (the builders' resets prefetched per split); their metadata names
    the catalog the rows were built from, when the run has one (WebShop's data)."""
    catalog = getattr(data.catalog, "fingerprint", None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"out_dir": str(out.resolve()), "envs": env_ids, "weights": by_env,
                               "agent_names": {e: b.agent_name for e, b in builders.items()},
                               "sources": {e: b.source for e, b in builders.items() if b.source is not None},
                               "files": {}, "sizes": {}}  # fmt: skip
    for split in SPLITS:
        if split == "train":
            chosen = {e: _spread(tasks[e]["train"], counts[e]) for e in env_ids}
            order = weighted_order(counts, by_env)
        else:
            chosen = {
                e: tasks[e][split][: limits[split]] if limits[split] else tasks[e][split] for e in env_ids
            }
            order = weighted_order({e: len(chosen[e]) for e in env_ids}, dict.fromkeys(env_ids, 1.0))
        for env_id in env_ids:
            builders[env_id].prefetch(chosen[env_id], split)
        position = dict.fromkeys(env_ids, 0)
        rows = []
        for index, env_id in enumerate(order):
            rows.append(builders[env_id].row(chosen[env_id][position[env_id]], split, index))
            position[env_id] += 1
        path = out / f"{split}.parquet"
        _write(rows, path, {"envs": env_ids, "weights": by_env, "split": split,
                            **({"catalog": catalog} if catalog is not None else {})})  # fmt: skip
        summary["files"][split] = str(path)
        summary["sizes"][split] = {e: len(chosen[e]) for e in env_ids}
    return summary


def _spread(ids: Sequence[int], count: int) -> list[int]:
    """``count`` of ``ids`` spread evenly over the list (every level, every depth), in index order."""
    if count >= len(ids):
        return list(ids)
    step = len(ids) / count
    return [ids[int(k * step)] for k in range(count)]


def sizes_table(summary: Mapping[str, Any]) -> str:
    """The rows per environment and split, and the tasks each split has (printed by ``agent-train data``)."""
    header = f"{'environment':<12}{'train':>8}{'val':>8}{'test':>8}   tasks in the splits (train/val/test)"
    lines = [header]
    for env_id in summary["envs"]:
        rows = [summary["sizes"][s][env_id] for s in SPLITS]
        tasks = "/".join(str(summary["tasks"][env_id][s]) for s in SPLITS)
        lines.append(f"{env_id:<12}{rows[0]:>8}{rows[1]:>8}{rows[2]:>8}   {tasks}")
    totals = [sum(summary["sizes"][s].values()) for s in SPLITS]
    lines.append(f"{'all':<12}{totals[0]:>8}{totals[1]:>8}{totals[2]:>8}")
    return "\n".join(lines)
