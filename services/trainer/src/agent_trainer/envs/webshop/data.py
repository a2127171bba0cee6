"""Training data in verl's format: one parquet row per goal.

Each row carries what verl 0.7.1's ``RLHFDataset`` and ``ToolAgentLoop`` read:

- ``data_source`` (``"webshop"``), ``ability``, ``agent_name: tool_agent`` (without it, and without
  ``rollout.agent.default_agent_loop: tool_agent``, verl silently runs single-turn);
- ``prompt``: the system prompt (action grammar, worked example) and the first user turn (instruction, start
  page, available actions), built by ``prompts.initial_messages`` from the simulator itself;
- ``reward_model``: ``style`` and ``ground_truth`` (the target ASIN; verl's reward manager raises KeyError
  without ``ground_truth``);
- ``extra_info``: ``index`` (verl reads it from here), ``goal``, ``goal_set``, ``split``, ``instruction`` and
  ``interaction_kwargs`` = ``{name: "webshop", goal, goal_set, split}`` (``start_interaction``'s arguments).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from agent_envs.envs.webshop.catalog.fidelity import describe_fidelity, fidelity_limits
from agent_envs.envs.webshop.catalog.store import PreparedCatalog, open_catalog
from agent_envs.envs.webshop.core.env import WebShopEnv
from agent_envs.envs.webshop.core.goals import SPLITS, split_range

from ...config import AGENT_LOOP_NAME, AGENT_NAME, DATA_SOURCE, INTERACTION_NAME
from . import prompts

ABILITY = "agent/webshop"
AGENT_NAMES = (AGENT_NAME, AGENT_LOOP_NAME)  # the 0.7.1 interaction path, the agent loop
DEFAULT_GOAL_SET = "synthetic"
AGENTGYM_GOAL_SET = "synthetic"  # AgentGym's webshop_<N> ids index the synthetic goals (its session ids)

_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("agent_name", pa.string()),
        ("prompt", pa.list_(_MESSAGE)),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        (
            "extra_info",
            pa.struct(
                [
                    ("index", pa.int64()),
                    ("goal", pa.int64()),
                    ("goal_set", pa.string()),
                    ("split", pa.string()),
                    ("instruction", pa.string()),
                    (
                        "interaction_kwargs",
                        pa.struct(
                            [
                                ("name", pa.string()),
                                ("goal", pa.int64()),
                                ("goal_set", pa.string()),
                                ("split", pa.string()),
                            ]
                        ),  # fmt: skip
                    ),
                ]
            ),
        ),
    ]
)


class DataError(ValueError):
    """Bad input for the dataset builder (the message says what to fix)."""


def load_agentgym_ids(path: Path | str) -> list[int]:
    """Goal indices from AgentGym-RL's ``webshop_train.json``: ``[{"item_id": "webshop_<N>", ...}, ...]``."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise DataError(f"{path}: cannot read it ({error})") from None
    except json.JSONDecodeError as error:
        raise DataError(f"{path}: not valid JSON ({error}); expected AgentGym's webshop_train.json") from None
    if not isinstance(data, list):
        raise DataError(
            f'{path}: expected a JSON list of {{"item_id": "webshop_<N>"}}, got {type(data).__name__}'
        )
    ids: list[int] = []
    for position, item in enumerate(data):
        item_id = item.get("item_id") if isinstance(item, dict) else None
        if not isinstance(item_id, str):
            raise DataError(f'{path}: entry {position} has no string "item_id" (got {item!r:.80})')
        name, _, number = item_id.rpartition("_")
        if name != "webshop" or not number.isdigit():
            raise DataError(f'{path}: entry {position} has item_id {item_id!r}; expected "webshop_<N>"')
        ids.append(int(number))
    if not ids:
        raise DataError(f"{path}: the list is empty")
    return ids


def split_goal_ids(catalog: PreparedCatalog, split: str, goal_set: str) -> list[int]:
    """Goal indices of ``split`` in ``goal_set`` (human-goal splits: test 0-499, eval 500-1499, train 1500+)."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    if goal_set not in catalog.goal_sets:
        raise DataError(f"the catalog has no {goal_set!r} goals; it has {', '.join(catalog.goal_sets)}")
    total = catalog.goal_count(goal_set)
    ids = list(split_range(split, total))
    if not ids:
        raise DataError(
            f"the {split} split of the {goal_set} goals is empty: this catalog has {total} {goal_set} goals and "
            f"the {split} split starts at goal {SPLITS[split][0]}; use another --goal-set or a larger catalog"
        )
    return ids


def build_row(
    env: WebShopEnv, goal: int, goal_set: str, split: str | None, index: int, agent_name: str = AGENT_NAME
) -> dict[str, Any]:
    """One dataset row for goal ``goal`` (its first page comes from the simulator itself).

    ``agent_name`` picks verl's agent loop for the row: ``tool_agent`` (0.7.1 interaction path) or
    ``webshop_agent`` (the WebShop agent loop, which resets through the service and rebuilds the first turn).
    """
    first = env.reset(goal, goal_set=goal_set)
    record = env.goal(goal_set, goal)
    return {
        "data_source": DATA_SOURCE,
        "agent_name": agent_name,
        "prompt": prompts.initial_messages(first.instruction, first.observation, first.available_actions),
        "ability": ABILITY,
        "reward_model": {"style": "interaction", "ground_truth": record.asin},
        "extra_info": {
            "index": index,
            "goal": goal,
            "goal_set": goal_set,
            "split": split,
            "instruction": first.instruction,
            "interaction_kwargs": {
                "name": INTERACTION_NAME,
                "goal": goal,
                "goal_set": goal_set,
                "split": split,
            },
        },
    }


def build_rows(
    catalog: PreparedCatalog,
    goal_ids: Sequence[int],
    goal_set: str,
    split: str | None,
    progress: bool = True,
    agent_name: str = AGENT_NAME,
) -> list[dict[str, Any]]:
    """Rows for ``goal_ids``; ``split`` (or None) is what the env will check each goal against at reset."""
    env = WebShopEnv(catalog)
    total = catalog.goal_count(goal_set)
    bad = [g for g in goal_ids if not 0 <= g < total]
    if bad:
        raise DataError(
            f"{len(bad)} goal id(s) are outside the catalog's {total} {goal_set} goals (0..{total - 1}), "
            f"e.g. {bad[:5]}; is this the catalog the ids were made for?"
        )
    iterator: Iterable[int] = tqdm(
        goal_ids, desc=f"rows ({split or 'agentgym'})", unit="goal", disable=not progress
    )
    return [build_row(env, goal, goal_set, split, index, agent_name) for index, goal in enumerate(iterator)]


# Parquet key-value metadata: the catalog the rows were built from (fingerprint and reward fidelity), which
# `agent-train train` writes at the top of train.log.
CATALOG_METADATA_KEY = b"webshop.catalog"


def write_parquet(
    rows: Sequence[dict[str, Any]], out: Path | str, catalog: dict[str, Any] | None = None
) -> Path:
    """Write the rows atomically; ``catalog`` (fingerprint, fidelity) goes into the file's metadata."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    schema = SCHEMA.with_metadata({CATALOG_METADATA_KEY: json.dumps(catalog)}) if catalog else SCHEMA
    table = pa.Table.from_pylist(list(rows), schema=schema)
    tmp = out.with_name(out.name + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(out)
    return out


def build_dataset(
    catalog_dir: Path | str,
    split: str,
    out: Path | str,
    *,
    limit: int | None = None,
    goal_set: str | None = None,
    agentgym_file: Path | str | None = None,
    goal_ids: Sequence[int] | None = None,
    progress: bool = True,
    agent_name: str = AGENT_NAME,
) -> dict[str, Any]:
    """Build ``out`` and return a summary (rows, goal set, split, catalog fingerprint)."""
    if Path(out).suffix != ".parquet":
        raise DataError(f"--out {out}: must end with .parquet (verl's dataset reads parquet by file suffix)")
    catalog = open_catalog(catalog_dir)
    if agentgym_file is not None:
        goal_set = goal_set or AGENTGYM_GOAL_SET
        ids = load_agentgym_ids(agentgym_file)
        row_split: str | None = None  # AgentGym ids follow their own lists, not the index-range splits
    else:
        goal_set = goal_set or DEFAULT_GOAL_SET
        ids = list(goal_ids) if goal_ids is not None else split_goal_ids(catalog, split, goal_set)
        row_split = split
    if goal_set not in catalog.goal_sets:
        raise DataError(f"the catalog has no {goal_set!r} goals; it has {', '.join(catalog.goal_sets)}")
    if limit is not None:
        if limit < 1:
            raise DataError("--limit must be at least 1")
        ids = ids[:limit]
    if agent_name not in AGENT_NAMES:
        raise DataError(f"unknown agent loop {agent_name!r}; expected one of {', '.join(AGENT_NAMES)}")
    rows = build_rows(catalog, ids, goal_set, row_split, progress=progress, agent_name=agent_name)
    fidelity = fidelity_limits(catalog.manifest)
    path = write_parquet(rows, out, {"fingerprint": catalog.fingerprint, "fidelity": fidelity})
    return {
        "out": str(path),
        "rows": len(rows),
        "goal_set": goal_set,
        "split": split,
        "catalog": str(Path(catalog_dir).resolve()),
        "fingerprint": catalog.fingerprint,
        "fidelity": fidelity,
    }


def dataset_catalog_line(path: Path | str) -> str | None:
    """ "catalog FINGERPRINT: <reward definition>" from a parquet's metadata; None without it (or no file)."""
    try:
        metadata = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowInvalid):
        return None
    if CATALOG_METADATA_KEY not in metadata:
        return None
    catalog = json.loads(metadata[CATALOG_METADATA_KEY])
    return f"catalog {catalog['fingerprint']} of {path}: {describe_fidelity(catalog['fidelity'])}"


def overlong_first_turns(
    files: Sequence[str | Path], model_path: str, limit: int
) -> tuple[int, list[dict[str, Any]]]:
    """``(rows, over)``: how many rows ``files`` hold, and those whose first turn (the row's prompt in the model's
    chat template with the generation prompt, as verl's ``filter_overlong_prompts`` measures it) has more than
    ``limit`` tokens: ``{"file", "row", "env", "task", "tokens"}`` each. Why: verl drops such rows without a word
    (and on 0.9.1 a row that got through would lose the start of its prompt, system message included)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    total, over = 0, []
    for file in files:
        for index, row in enumerate(
            pq.read_table(file, columns=["prompt", "extra_info", "data_source"]).to_pylist()
        ):
            total += 1
            ids = tokenizer.apply_chat_template(
                list(row["prompt"]), add_generation_prompt=True, tokenize=True
            )
            count = len(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
            if count > limit:
                extra = row.get("extra_info") or {}
                over.append({"file": str(file), "row": index, "env": extra.get("env") or row.get("data_source"),
                             "task": extra.get("task", extra.get("goal")), "tokens": count})  # fmt: skip
    return total, over
