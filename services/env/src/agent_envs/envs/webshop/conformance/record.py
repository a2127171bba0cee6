"""``conformance record``: play the episode plan in a text environment and write traces plus its pins.

The output is the fixture format (tests/fixtures/conformance/README.md): ``raw/`` (a copy of the raw files),
and per goal set ``goals.json``, ``product_prices.json``, ``title_nouns.json``, ``traces.jsonl`` and
``meta.json``; plus ``summary.json`` for the whole recording.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..catalog.raw import ATTRIBUTE_FILES, HUMAN_FILE, PRODUCT_FILES, find_raw_file
from .adapter import TextEnvAdapter
from .episodes import EPISODE_KINDS, iter_episodes, plan_episodes

GOAL_SET_DIRS = {"synthetic": "synthetic-goals", "human": "human-goals"}
DEFAULT_EPISODES = {"synthetic": 90, "human": 30}


def _plain(value: Any) -> Any:
    """numpy scalars and the like (which an environment may hand back) as plain JSON values."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _dump(value: Any, indent: int | None = 0) -> str:
    """The fixtures' JSON layout (``json.dumps`` with ``indent=0``: one value per line, ASCII only)."""
    return json.dumps(value, indent=indent, default=_plain)


def record(
    env: TextEnvAdapter,
    raw_dir: Path,
    out_dir: Path,
    *,
    episodes: dict[str, int] | None = None,
    seed: int = 0,
    meta: dict[str, Any] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Record the plan for every goal set ``env`` has; returns the summary (also written as summary.json)."""
    started = time.monotonic()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _copy_raw(Path(raw_dir), out_dir / "raw")
    episodes = episodes or DEFAULT_EPISODES
    goal_sets = [s for s in env.goal_sets() if episodes.get(s, 0) > 0]
    goals = {s: env.goals(s) for s in goal_sets}
    prices = env.product_prices()
    nouns = env.title_nouns()
    plan = plan_episodes({s: len(goals[s]) for s in goal_sets}, episodes, seed)
    per_set: dict[str, dict[str, Any]] = {
        s: {
            "episodes": 0,
            "steps": 0,
            "purchases": 0,
            "full_reward": 0,
            "kinds": dict.fromkeys(EPISODE_KINDS, 0),
        }
        for s in goal_sets
    }
    handles = {}
    for goal_set in goal_sets:
        folder = out_dir / GOAL_SET_DIRS[goal_set]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "goals.json").write_text(_dump(goals[goal_set]))
        (folder / "product_prices.json").write_text(_dump(prices))
        (folder / "title_nouns.json").write_text(_dump(nouns))
        handles[goal_set] = (folder / "traces.jsonl").open("w", encoding="utf-8")
    try:
        bar = tqdm(total=len(plan), desc="recording", unit=" episodes", disable=not progress)
        for planned, steps in iter_episodes(env, plan, goals, seed):
            handles[planned.goal_set].write(_dump({"goal": planned.goal, "steps": steps}, indent=None) + "\n")
            counts = per_set[planned.goal_set]
            counts["episodes"] += 1
            counts["steps"] += len(steps)
            counts["kinds"][planned.kind] += 1
            purchase = [s for s in steps[1:] if "verbose_info" in s]
            counts["purchases"] += len(purchase)
            counts["full_reward"] += sum(1 for s in purchase if s["reward"] == 1.0)
            bar.update(1)
        bar.close()
    finally:
        for handle in handles.values():
            handle.close()
    for goal_set in goal_sets:
        set_meta = {
            "episodes": per_set[goal_set]["episodes"],
            "goals": len(goals[goal_set]),
            "human_goals": goal_set == "human",
            "products": len(prices),
            "source": env.name,
            "plan": f"agent-envs conformance record, seed {seed}",
            **(meta or {}),
        }
        (out_dir / GOAL_SET_DIRS[goal_set] / "meta.json").write_text(_dump(set_meta, indent=1))
    summary = {
        "source": env.name,
        "out": str(out_dir),
        "seed": seed,
        "products": len(prices),
        "goal_sets": per_set,
        "seconds": round(time.monotonic() - started, 2),
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _copy_raw(raw_dir: Path, target: Path) -> None:
    if raw_dir.resolve() == target.resolve():
        return
    target.mkdir(parents=True, exist_ok=True)
    for candidates in (PRODUCT_FILES, ATTRIBUTE_FILES, (HUMAN_FILE,)):
        source = find_raw_file(raw_dir, candidates)
        if source is not None:
            shutil.copyfile(source, target / source.name)
