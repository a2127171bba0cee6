"""Training data for any environment and for a mix: ``agent-train data --env textcraft,babyai,sciworld,webshop``.

Writes ``train.parquet``, ``val.parquet`` and ``test.parquet`` (verl's format, one row per task) into one folder.
Each environment's tasks are split once, by a fixed rule (:func:`split_tasks`), so the three splits never share a
task; the split sizes are printed. A row carries its environment in ``data_source`` (verl groups validation metrics
by it), so one file trains several environments in one run, by either route:

- the agent loop (verl 0.7.1 and 0.9.1): ``agent_name`` = ``<env>_agent``, the environment's entry of
  configs/agent_loop.yaml;
- verl 0.7.1's interaction (``interaction=True``, ``agent-train data --env ... --interaction``, the default on
  the 0.7 line): ``agent_name`` = ``tool_agent``, and ``extra_info.interaction_kwargs`` = ``{name: <env>, task,
  goal, goal_set, split}`` picks the environment's entry of configs/interaction.yaml (``ToolAgentLoop``
  selects the interaction by ``name``). The prompt's first user turn is then what the model sees first: the
  environment's own reset text for the task (the interaction checks it against the service's at the first turn).

Every row carries ``interaction_kwargs`` and its environment and task in ``extra_info``, whichever route it names.

Mixing: the training rows of each environment are in proportion to ``--weights`` (default equal), as many as the
scarcest environment allows without repeating a task (or ``--train-rows``), and interleaved so that every prefix
keeps the proportions (``data.train_max_samples`` takes the first rows). Validation and test rows are each
environment's whole split (or its first ``--val-rows``/``--test-rows``), interleaved the same way, one environment
after the other.

The splits (task = the environment's own index, AgentGym's ``data_idx`` / ``item_id``), each environment's
``task_count``, ``split_of`` and ``task_order`` in its trainer module (``agent_trainer.envs.<env>``):

- webshop (and any environment whose spec ``needs_catalog``): the goal-index ranges of ``agent-train data`` (test
  0-499, val = "eval" 500-1499, train 1500-) of the prepared catalog's goal set (default synthetic), each row the
  catalog's first page of its goal;
- textcraft: the 544 goals (sorted by crafting depth): test every 8th (``task % 8 == 0``, 68), val ``task % 16 ==
  4`` (34), train the other 442; every depth is in every split;
- babyai: tasks 0-1999 (level ``task % 40``, seed ``task // 40``): test seeds 0-4 (200 tasks, every level 5 times),
  val seed 5 (40, every level once), train seeds 6-49 (1760);
- sciworld: tasks 0-4638 (AgentGym's list: task type ``games.TASKS[k]``, variation ``v``), split by ScienceWorld's
  own train/dev/test variations (``get_variations_train/dev/test``; dev is val here): within each of the 23 task
  types its first half of the variations is train, the next quarter dev, the rest test (contiguous ranges,
  ``envs.sciworld.VARIATION_SPLITS``, checked against a JVM by the tests): train 2,312, val 1,156, test 1,171. A
  split's tasks come round-robin over the task types (one variation of each type, then the next), so any prefix
  (``--val-rows``, ``val_max_samples``, eval's ``MAX_SAMPLES``) covers every type.

SciWorld's rows each need a reset in a *fresh* JVM: the service resets in a fresh JVM, and a second load in one JVM
can list the room's objects in another order (5 of 40 reset texts differed when measured), which the interaction
would refuse at the first turn. So one core and its warm pool (its spec's ``data_core``: spare JVMs started in
the background) serve the whole build, ``SCIWORLD_DATA_WORKERS`` resets at a time (default half the CPUs, at most
8), each in a JVM of its own that is closed at once; a progress bar counts them. That needs Java 17 and the
``scienceworld`` package where the data is built; without them (the trainer image), ``env_url`` (``--env-url``, or
``$AGENTRL_URL``) names a service serving SciWorld whose resets make the rows, each episode closed at once.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from . import envs
from .config import AGENT_NAME
from .envs.webshop.data import DEFAULT_GOAL_SET, DataError, split_goal_ids
from .envs.webshop.data import SCHEMA as WEBSHOP_SCHEMA

SPLITS = ("train", "val", "test")
#: The catalog's name of each split (its goal ranges, ``agent_envs.envs.webshop.core.goals.SPLITS``).
CATALOG_SPLIT = {"train": "train", "val": "eval", "test": "test"}
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


def required_catalog(env_id: str, catalog: Any) -> Any:
    """``catalog``, which ``env_id`` needs (its spec ``needs_catalog``); raises ``DataError`` when there is none."""
    if catalog is None:
        raise DataError(f"{env_id} needs --catalog (its goals come from the prepared catalog)")
    return catalog


def split_tasks(
    env_id: str, split: str, *, catalog: Any = None, goal_set: str = DEFAULT_GOAL_SET
) -> list[int]:
    """The tasks of ``split`` (train, val, test) of ``env_id``, in index order (SciWorld: round-robin over its
    task types), see the module docstring."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    spec = envs.specs().get(env_id)
    if spec is not None and spec.needs_catalog:
        return split_goal_ids(required_catalog(env_id, catalog), CATALOG_SPLIT[split], goal_set)
    if spec is None or spec.task_count is None or spec.split_of is None:
        known = [e for e, s in envs.specs().items() if s.needs_catalog or (s.task_count and s.split_of)]
        raise DataError(f"{env_id}: no dataset rule (the trainer can build data for {', '.join(known)}: environments "
                        "whose trainer spec has task_count and split_of, or needs_catalog)")  # fmt: skip
    tasks = [task for task in range(spec.task_count) if spec.split_of(task) == split]
    return spec.task_order(tasks) if spec.task_order is not None else tasks


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


class RowBuilder:
    """One environment's rows: the first user turn from the environment's own reset (its core, in process), or,
    for an environment whose spec ``needs_catalog`` (WebShop), the catalog's first page of the goal
    (``data.build_row``: the rows ``agent-train data --catalog`` writes, with the environment and task added).

    ``interaction``: rows for verl 0.7.1's ``ToolAgentLoop`` + the environment's interaction (``agent_name``
    ``tool_agent``) instead of its agent loop (``<env>_agent``). An environment that holds a simulator per episode
    (SciWorld: a JVM) resets ``prefetch``'s tasks several at a time, each episode closed at once, in process, or
    through the service at ``env_url`` where this machine has no simulator (no Java or scienceworld: the trainer
    image); so does any environment whose package does not import here (the trainer images install the env
    package without the environments' extras) when ``env_url`` is given. ``close`` stops the simulators it
    started.
    """

    def __init__(
        self,
        env_id: str,
        catalog: Any = None,
        goal_set: str = DEFAULT_GOAL_SET,
        interaction: bool = False,
        progress: bool = True,
        env_url: str | None = None,
    ) -> None:
        self.spec = envs.get(env_id)
        self.goal_set = goal_set
        self.agent_name = AGENT_NAME if interaction else self.spec.agent_name
        self.progress = progress
        self.workers = 1
        self.core: Any = None
        self.env_url: str | None = None  # set: the resets are the service's (``source`` says which)
        self._first: dict[
            int, dict[str, Any]
        ] = {}  # task -> its reset {observation, info} (prefetched, used once)
        self.catalog: Any = None  # set: the rows are the catalog's (``needs_catalog``)
        self.catalog_env: Any = None  # the simulator on that catalog, whose reset is a goal's first page
        if self.spec.needs_catalog:
            from agent_envs.envs.webshop.core.env import WebShopEnv

            self.catalog = required_catalog(env_id, catalog)
            self.catalog_env = WebShopEnv(self.catalog)
        elif self.spec.data_core is not None:
            self._own_core(env_url)
        else:
            from agent_envs.envs import registry

            try:  # may fail on its package (ImportError), its data (TextCraft's RecipeDataMissing), ...
                self.core = registry.make(env_id)
            except Exception as error:
                if not env_url:  # the trainer images install the env package without its environments' extras
                    raise DataError(f"{env_id}: its core cannot be made here ({type(error).__name__}: {error}); "
                                    f"pip install -e 'services/env[{env_id}]', or give --env-url (or "
                                    "$AGENTRL_URL): a service whose resets then make the rows") from None  # fmt: skip
                self.env_url = env_url.rstrip("/")

    @property
    def source(self) -> str | None:
        """Where the first turns come from: ``in process`` or the service's URL; None for the catalog's rows
        (``--catalog`` names their source already)."""
        if self.catalog is not None:
            return None
        return self.env_url or "in process"

    def data_fingerprint(self) -> str:
        """The environment's data as the service names it (``<env>:<core fingerprint>``): the catalog's or the
        core's here, else the service's (``GET /<env>/v1/info``)."""
        if self.catalog is not None:
            return f"{self.spec.env_id}:{self.catalog.fingerprint}"
        if self.core is not None:
            return f"{self.spec.env_id}:{self.core.fingerprint()}"
        from agent_envs.client.envs import EnvClient
        from agent_envs.client.native import ServiceError

        async def info() -> dict[str, Any]:
            async with EnvClient(self.env_url or "", self.spec.env_id, timeout=30.0) as client:
                return await client.info()

        try:
            return str(asyncio.run(info())["fingerprint"])
        except (ServiceError, OSError, KeyError) as error:
            raise DataError(
                f"{self.spec.env_id}: {self.env_url} does not say which data it serves: {error}"
            ) from None

    def _own_core(self, env_url: str | None) -> None:
        """The environment's own data core (``spec.data_core``, SciWorld's: a fresh JVM per reset from a warm pool),
        ``<ENV>_DATA_WORKERS`` resets at a time, where it can run here, else the service at ``env_url``."""
        name = f"{self.spec.env_id.upper()}_DATA_WORKERS"
        given = os.environ.get(name, "").strip()
        if given and not given.isdigit():
            raise DataError(f"{name} must be a whole number, not {given!r}")
        self.workers = int(given) if given else max(1, min(8, (os.cpu_count() or 2) // 2))
        if self.workers < 1:
            raise DataError(f"{name} must be at least 1")
        try:
            self.core = self.spec.data_core(self.workers)
        except envs.CoreUnavailable as missing:
            if not env_url:
                raise DataError(f"{self.spec.env_id}: {missing}; or give --env-url (or $AGENTRL_URL): a service "
                                f"that serves {self.spec.env_id}, whose resets then make the rows") from None  # fmt: skip
            self.env_url = env_url.rstrip("/")

    def prefetch(self, tasks: Sequence[int], split: str) -> None:
        """Reset ``tasks`` now, ``workers`` at a time, with a progress bar (SciWorld: each reset is a JVM's);
        ``row`` then uses these resets. Other environments reset in ``row`` (a few milliseconds each)."""
        if not self.spec.holds_simulator and not self.env_url:
            return
        todo = [task for task in dict.fromkeys(tasks) if task not in self._first]
        if not todo:
            return
        bar = tqdm(
            total=len(todo),
            desc=f"{self.spec.env_id} resets ({split}, {self.source})",
            unit="task",
            disable=not self.progress or len(todo) < 2,
        )  # fmt: skip  (one row's reset: no bar)
        with bar:
            if self.env_url:
                asyncio.run(self._fetch(todo, bar))
                return
            with ThreadPoolExecutor(self.workers, thread_name_prefix=f"{self.spec.env_id}-data") as pool:
                futures = {pool.submit(self._reset, task): task for task in todo}
                try:
                    for future in as_completed(futures):
                        self._first[futures[future]] = future.result()
                        bar.update()
                except BaseException:
                    for future in futures:
                        future.cancel()
                    raise

    async def _fetch(self, tasks: Sequence[int], bar: Any) -> None:
        """The service's resets of ``tasks``, ``workers`` at a time, each episode closed at once."""
        from agent_envs.client.envs import EnvClient
        from agent_envs.client.native import ServiceError

        limit = asyncio.Semaphore(self.workers)

        async def one(task: int) -> None:
            async with limit:
                result = await client.reset(task)
                await client.close(result["state"])
            self._first[task] = {"observation": result["observation"], "info": dict(result.get("info") or {})}
            bar.update()

        async with EnvClient(self.env_url or "", self.spec.env_id, timeout=120.0) as client:
            try:
                await asyncio.gather(*(one(task) for task in tasks))
            except (ServiceError, OSError) as error:
                raise DataError(f"{self.spec.env_id}: a reset at {self.env_url} failed: {error}") from None

    def _reset(self, task: int) -> dict[str, Any]:
        """The core's reset of ``task`` as {observation, info}; an episode that holds a simulator is closed at
        once (its JVM freed)."""
        from agent_envs.envs.contract import EnvError

        if self.env_url:
            self.prefetch([task], "row")
            return self._first.pop(task)
        try:
            first = self.core.reset(task)
            if self.spec.holds_simulator:
                self.core.close(first.state)
        except EnvError as error:
            raise DataError(f"{self.spec.env_id}: the reset of task {task} failed: {error}") from None
        return {"observation": first.observation, "info": dict(first.info)}

    def close(self) -> None:
        """Stop the simulators this builder started (SciWorld's JVMs); the builder resets no more."""
        if self.spec.holds_simulator and self.core is not None:
            self.core.shutdown()

    def row(self, task: int, split: str, index: int) -> dict[str, Any]:
        spec = self.spec
        if self.catalog_env is not None:
            from .envs.webshop.data import build_row

            row = build_row(
                self.catalog_env, task, self.goal_set, CATALOG_SPLIT[split], index, self.agent_name
            )
            # the catalog's row, named for this environment (WebShop's names are the ones it has already)
            row |= {"data_source": spec.data_source, "ability": spec.ability}
            row["extra_info"] |= {"env": spec.env_id, "task": task}
            row["extra_info"]["interaction_kwargs"] |= {"name": spec.env_id, "task": task}
            return row
        first = self._first.pop(task, None) or self._reset(task)
        opening = spec.first_message(first)
        instruction = _instruction(opening)
        return {
            "data_source": spec.data_source,
            "agent_name": self.agent_name,
            "prompt": [{"role": "system", "content": spec.system_prompt}, {"role": "user", "content": opening}],
            "ability": spec.ability,
            "reward_model": {"style": "environment", "ground_truth": str(first["info"].get("goal") or instruction)},
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
    catalog = None
    needing = [e for e in env_ids if envs.get(e).needs_catalog]
    if needing:
        from agent_envs.envs.webshop.catalog.store import open_catalog

        catalog = open_catalog(required_catalog(needing[0], catalog_dir))
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
    limits = {"train": None, "val": val_rows, "test": test_rows}
    builders: dict[str, RowBuilder] = {}
    try:
        for env_id in env_ids:
            builders[env_id] = RowBuilder(env_id, catalog, goal_set, interaction, progress, env_url)
        key = rows_key(env_ids, by_env, goal_set, counts, limits, builders)
        summary = reusable_rows(out_dir, key)
        if summary is None:
            summary = _write_splits(out_dir, env_ids, by_env, tasks, counts, builders, catalog, limits)
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
_ROW_MODULES = ("env_data", "data", "prompts", "envs")


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
    catalog: Any,
    limits: Mapping[str, int | None],
) -> dict[str, Any]:
    """The three files of ``build_env_datasets`` (the builders' resets prefetched per split)."""
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
                            **({"catalog": catalog.fingerprint} if catalog is not None else {})})  # fmt: skip
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
