"""Training data for any environment and for a mix: ``agent-train data --env textcraft,babyai,webshop``.

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
- sciworld: not yet (its rows would need a simulator per reset).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from . import envs
from .config import AGENT_NAME
from .data import DEFAULT_GOAL_SET, DataError, split_goal_ids
from .data import SCHEMA as WEBSHOP_SCHEMA

SPLITS = ("train", "val", "test")
#: WebShop's name of each split (its goal ranges, ``webshop_env.core.goals.SPLITS``).
WEBSHOP_SPLIT = {"train": "train", "val": "eval", "test": "test"}
TEXTCRAFT_TASKS = 544
BABYAI_LEVELS = 40
BABYAI_SEEDS = 50  # the pool: tasks 0 .. 40 * 50 - 1

# WebShop's row schema (data.SCHEMA) with the environment and its task in ``extra_info``, after ``index``, and the
# task in ``interaction_kwargs``, after ``name`` (what ``EnvInteraction.start_interaction`` reads).
_WEBSHOP_EXTRA = WEBSHOP_SCHEMA.field("extra_info").type
_WEBSHOP_KWARGS = _WEBSHOP_EXTRA.field("interaction_kwargs").type
_KWARGS = pa.field(
    "interaction_kwargs",
    pa.struct([_WEBSHOP_KWARGS.field(0), pa.field("task", pa.int64()),
               *(_WEBSHOP_KWARGS.field(k) for k in range(1, _WEBSHOP_KWARGS.num_fields))]),
)  # fmt: skip
SCHEMA = WEBSHOP_SCHEMA.set(
    WEBSHOP_SCHEMA.get_field_index("extra_info"),
    pa.field(
        "extra_info",
        pa.struct(
            [
                _WEBSHOP_EXTRA.field(0),
                pa.field("env", pa.string()),
                pa.field("task", pa.int64()),
                *(
                    _KWARGS
                    if _WEBSHOP_EXTRA.field(k).name == "interaction_kwargs"
                    else _WEBSHOP_EXTRA.field(k)
                    for k in range(1, _WEBSHOP_EXTRA.num_fields)
                ),
            ]
        ),
    ),
)
METADATA_KEY = b"webshop.env_data"


def _textcraft_split(task: int) -> str:
    if task % 8 == 0:
        return "test"
    return "val" if task % 16 == 4 else "train"


def _babyai_split(task: int) -> str:
    seed = task // BABYAI_LEVELS
    return "test" if seed < 5 else "val" if seed == 5 else "train"


#: Per environment (but WebShop): its task pool and which split a task belongs to.
RULES: dict[str, tuple[int, Callable[[int], str]]] = {
    "textcraft": (TEXTCRAFT_TASKS, _textcraft_split),
    "babyai": (BABYAI_LEVELS * BABYAI_SEEDS, _babyai_split),
}


def split_tasks(
    env_id: str, split: str, *, catalog: Any = None, goal_set: str = DEFAULT_GOAL_SET
) -> list[int]:
    """The tasks of ``split`` (train, val, test) of ``env_id``, in index order (see the module docstring)."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    if env_id == envs.WEBSHOP:
        if catalog is None:
            raise DataError("webshop needs --catalog (its goals come from the prepared catalog)")
        return split_goal_ids(catalog, WEBSHOP_SPLIT[split], goal_set)
    if env_id not in RULES:
        raise DataError(f"{env_id}: no dataset rule yet (the trainer can build data for webshop, "
                        f"{', '.join(RULES)})")  # fmt: skip
    pool, rule = RULES[env_id]
    return [task for task in range(pool) if rule(task) == split]


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
    """Training rows per environment in proportion to ``weights``: ``total`` of them, or (None) as many as the
    scarcest environment allows without repeating a task."""
    weight_sum = sum(weights.values())
    if total is None:
        scale = min(available[e] / weights[e] for e in available)
        counts = {e: int(scale * weights[e] + 1e-9) for e in available}
    else:
        counts = {e: round(total * weights[e] / weight_sum) for e in available}
        short = {e: (counts[e], available[e]) for e in counts if counts[e] > available[e]}
        if short:
            raise DataError(
                f"--train-rows {total} with these weights needs more training tasks than there are: "
                + ", ".join(f"{e} {need} > {have}" for e, (need, have) in short.items())
            )
    return counts


class RowBuilder:
    """One environment's rows: the first user turn from the environment's own reset (its core, in process).

    ``interaction``: rows for verl 0.7.1's ``ToolAgentLoop`` + the environment's interaction (``agent_name``
    ``tool_agent``) instead of its agent loop (``<env>_agent``).
    """

    def __init__(
        self, env_id: str, catalog: Any = None, goal_set: str = DEFAULT_GOAL_SET, interaction: bool = False
    ) -> None:
        self.spec = envs.get(env_id)
        self.goal_set = goal_set
        self.agent_name = AGENT_NAME if interaction else self.spec.agent_name
        if env_id == envs.WEBSHOP:
            from webshop_env.core.env import WebShopEnv

            self.webshop = WebShopEnv(catalog)
        else:
            from webshop_env.envs import registry

            try:
                self.core = registry.make(env_id)
            except ImportError as error:
                raise DataError(f"{env_id}: its environment package does not import here ({error}); "
                                f"pip install -e 'services/env[{env_id}]'") from None  # fmt: skip

    def row(self, task: int, split: str, index: int) -> dict[str, Any]:
        spec = self.spec
        if spec.env_id == envs.WEBSHOP:
            from .data import build_row

            row = build_row(self.webshop, task, self.goal_set, WEBSHOP_SPLIT[split], index, self.agent_name)
            row["extra_info"] |= {"env": spec.env_id, "task": task}
            row["extra_info"]["interaction_kwargs"]["task"] = task
            return row
        first = self.core.reset(task)
        opening = spec.first_message({"observation": first.observation, "info": dict(first.info)})
        instruction = _instruction(opening)
        return {
            "data_source": spec.data_source,
            "agent_name": self.agent_name,
            "prompt": [{"role": "system", "content": spec.system_prompt}, {"role": "user", "content": opening}],
            "ability": spec.ability,
            "reward_model": {"style": "environment", "ground_truth": str(first.info.get("goal") or instruction)},
            "extra_info": {"index": index, "env": spec.env_id, "task": task, "goal": task, "goal_set": None,
                           "split": split, "instruction": instruction,
                           "interaction_kwargs": {"name": spec.env_id, "task": task, "goal": task,
                                                  "goal_set": None, "split": split}},
        }  # fmt: skip


def _instruction(opening: str) -> str:
    """The line of the first observation that states the goal (``Goal: ...``, ``Your goal: ...``), else its first."""
    lines = [line.strip() for line in opening.splitlines() if line.strip()]
    for line in lines:
        if line.lower().startswith(("goal:", "your goal:", "your task")):
            return line
    return lines[0] if lines else ""


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
) -> dict[str, Any]:
    """Write ``out_dir/{train,val,test}.parquet`` for ``env_ids`` and return the summary (split sizes per env).

    ``interaction``: rows for verl 0.7.1's interaction route (``agent_name: tool_agent``), else for the agent loop
    (``<env>_agent``; both lines)."""
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
    catalog = None
    if envs.WEBSHOP in env_ids:
        if catalog_dir is None:
            raise DataError("webshop needs --catalog (its goals come from the prepared catalog)")
        from webshop_env.catalog.store import open_catalog

        catalog = open_catalog(catalog_dir)
    by_env = dict(zip(env_ids, weights, strict=True))
    tasks = {e: {s: split_tasks(e, s, catalog=catalog, goal_set=goal_set) for s in SPLITS} for e in env_ids}
    for env_id, splits in tasks.items():  # the rules make this so; a broken rule must not leak tasks
        seen: dict[int, str] = {}
        for split, ids in splits.items():
            for task in ids:
                if task in seen:
                    raise DataError(f"{env_id}: task {task} is in both {seen[task]} and {split}")
                seen[task] = split
    counts = train_counts({e: len(tasks[e]["train"]) for e in env_ids}, by_env, train_rows)
    builders = {e: RowBuilder(e, catalog, goal_set, interaction) for e in env_ids}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"out_dir": str(out.resolve()), "envs": env_ids, "weights": by_env,
                               "agent_names": {e: b.agent_name for e, b in builders.items()},
                               "files": {}, "sizes": {}}  # fmt: skip
    limits = {"train": None, "val": val_rows, "test": test_rows}
    for split in SPLITS:
        if split == "train":
            chosen = {e: _spread(tasks[e]["train"], counts[e]) for e in env_ids}
            order = weighted_order(counts, by_env)
        else:
            chosen = {
                e: tasks[e][split][: limits[split]] if limits[split] else tasks[e][split] for e in env_ids
            }
            order = weighted_order({e: len(chosen[e]) for e in env_ids}, dict.fromkeys(env_ids, 1.0))
        position = dict.fromkeys(env_ids, 0)
        rows = []
        for index, env_id in enumerate(order):
            rows.append(builders[env_id].row(chosen[env_id][position[env_id]], split, index))
            position[env_id] += 1
        path = out / f"{split}.parquet"
        _write(rows, path, {"envs": env_ids, "weights": by_env, "split": split,
                            **({"catalog": catalog.fingerprint} if catalog is not None else {})})  # fmt: skip
        summary["files"][split] = str(path)
        summary["sizes"][split] = {e: len(chosen[e]) for e in env_ids}
    summary["tasks"] = {e: {s: len(tasks[e][s]) for s in SPLITS} for e in env_ids}
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
