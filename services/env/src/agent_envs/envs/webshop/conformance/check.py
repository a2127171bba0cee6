"""``conformance check``: replay recorded traces against a prepared catalog and compare every step.

Each step is compared on five aspects: the observation (and, when it differs, whether it differs only in
price numbers: ``price_text_only``), the clickables (``available_actions``), the reward and done flag, and
the reward breakdown on purchases. A step is ``equal`` when nothing differs. Replay goes on after a
difference (the recorded actions are fixed), so one early difference can make later steps differ too: the
first differences are the ones to read.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..core.env import EnvError, WebShopEnv
from .adapter import goal_as_original
from .record import GOAL_SET_DIRS

ASPECTS = ("observation", "price_text_only", "clickables", "reward", "reward_breakdown")
_PRICE = re.compile(r"\$\d[\d.,]*|\b\d+\.\d+(?= dollars)")


def traces_goal_sets(traces_dir: Path) -> dict[str, Path]:
    """The goal-set folders present in a trace directory (fixture layout)."""
    found = {
        s: traces_dir / d for s, d in GOAL_SET_DIRS.items() if (traces_dir / d / "traces.jsonl").exists()
    }
    if not found:
        raise FileNotFoundError(f"no {'/ or '.join(GOAL_SET_DIRS.values())}/traces.jsonl under {traces_dir}")
    return found


def prepare_for_traces(
    traces_dir: Path,
    out_dir: Path,
    *,
    unpin: frozenset[str] = frozenset(),
    num_products: int | None = 1000,
    noun_extractor: Any = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Prepare ``traces_dir/raw`` with the recording's pins, except those named in ``unpin``.

    ``unpin`` may hold ``nouns`` (title nouns from this project's extractor instead of the recorded ones)
    and ``prices`` (seeded point prices and goal price ceilings instead of the recorded ones): this measures
    what the default ``make data`` path gets wrong against the original.
    """
    from ..catalog.prepare import Pins, prepare_catalog

    unknown = set(unpin) - {"nouns", "prices"}
    if unknown:
        raise ValueError(f"cannot unpin {sorted(unknown)}; choose from nouns, prices")
    folders = traces_goal_sets(traces_dir)
    first = next(iter(folders.values()))
    pins = Pins.from_files(
        prices=None if "prices" in unpin else first / "product_prices.json",
        title_nouns=None if "nouns" in unpin else first / "title_nouns.json",
        goals={} if "prices" in unpin else {s: d / "goals.json" for s, d in folders.items()},
    )
    return prepare_catalog(
        traces_dir / "raw",
        out_dir,
        num_products=num_products,
        goal_sets=tuple(folders),
        pins=pins,
        noun_extractor=noun_extractor,
        progress=progress,
    )


@dataclass
class GoalSetReport:
    episodes: int = 0
    steps: int = 0
    equal: int = 0
    purchases: int = 0
    purchases_equal: int = 0
    goals_differ: int = 0
    differ: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ASPECTS, 0))

    def as_dict(self) -> dict[str, Any]:
        return {
            "episodes": self.episodes,
            "steps": self.steps,
            "equal": self.equal,
            "equal_pct": _pct(self.equal, self.steps),
            "differ": self.differ,
            "purchases": self.purchases,
            "purchases_equal": self.purchases_equal,
            "goals_differ": self.goals_differ,
        }


def _pct(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 3) if whole else 100.0


def _without_prices(text: str) -> str:
    return _PRICE.sub("<price>", text)


def compare_step(
    expected: dict[str, Any],
    observation: str,
    available: Any,
    reward: float,
    done: bool,
    breakdown: dict[str, Any] | None,
) -> list[str]:
    """The aspects in which one replayed step differs from the recorded one (empty: equal)."""
    aspects: list[str] = []
    if observation != expected["observation"]:
        same_but_prices = _without_prices(observation) == _without_prices(expected["observation"])
        aspects.append("price_text_only" if same_but_prices else "observation")
    if available != expected["available_actions"]:
        aspects.append("clickables")
    if "action" in expected:
        if reward != expected["reward"] or done != expected["done"]:
            aspects.append("reward")
        if breakdown != expected.get("verbose_info"):
            aspects.append("reward_breakdown")
    return aspects


def check_traces(
    traces_dir: Path, catalog_dir: Path, *, max_differences: int = 10, progress: bool = True
) -> dict[str, Any]:
    """Replay every trace under ``traces_dir`` on ``catalog_dir``; returns the summary."""
    from ..catalog.store import open_catalog

    started = time.monotonic()
    catalog = open_catalog(catalog_dir)
    env = WebShopEnv(catalog)
    folders = traces_goal_sets(Path(traces_dir))
    reports = {s: GoalSetReport() for s in folders}
    differences: list[dict[str, Any]] = []
    episodes = {
        s: [json.loads(line) for line in (d / "traces.jsonl").read_text().splitlines() if line.strip()]
        for s, d in folders.items()
    }

    def note(
        goal_set: str,
        episode: int,
        goal: int,
        step: int,
        action: str | None,
        aspects: list[str],
        expected: dict[str, Any],
        actual: dict[str, Any],
    ) -> None:
        if len(differences) < max_differences:
            differences.append(
                {
                    "goal_set": goal_set,
                    "episode": episode,
                    "goal": goal,
                    "step": step,
                    "action": action,
                    "aspects": aspects,
                    **_first_difference(expected, actual),
                }
            )

    for goal_set, folder in folders.items():
        report = reports[goal_set]
        recorded_goals = (
            json.loads((folder / "goals.json").read_text()) if (folder / "goals.json").exists() else []
        )
        if goal_set not in catalog.goal_sets:
            raise EnvError(f"the catalog has no {goal_set} goals; prepare it from the traces' raw files")
        for index, goal in enumerate(recorded_goals):
            if (
                index >= catalog.goal_count(goal_set)
                or goal_as_original(catalog.goal(goal_set, index)) != goal
            ):
                report.goals_differ += 1
    total = sum(len(e) for e in episodes.values())
    bar = tqdm(total=total, desc="checking", unit=" episodes", disable=not progress)
    for goal_set, recorded in episodes.items():
        report = reports[goal_set]
        for number, episode in enumerate(recorded):
            report.episodes += 1
            first, *rest = episode["steps"]
            step = env.reset(episode["goal"], goal_set=goal_set)
            aspects = compare_step(first, step.observation, step.available_actions, 0.0, False, None)
            report.steps += 1
            _count(report, aspects)
            if aspects:
                note(goal_set, number, episode["goal"], 0, None, aspects, first, _as_trace(step))
            for index, expected in enumerate(rest, start=1):
                report.steps += 1
                if "verbose_info" in expected:
                    report.purchases += 1
                try:
                    step = env.step(step.state, expected["action"])
                except EnvError as error:  # e.g. the episode already ended here
                    report.differ["reward"] += 1
                    note(
                        goal_set,
                        number,
                        episode["goal"],
                        index,
                        expected["action"],
                        ["reward"],
                        {"done": False},
                        {"error": str(error)},
                    )
                    break
                breakdown = step.info.get("reward_info")
                aspects = compare_step(
                    expected, step.observation, step.available_actions, step.reward, step.done, breakdown
                )
                _count(report, aspects)
                if "verbose_info" in expected and not aspects:
                    report.purchases_equal += 1
                if aspects:
                    note(
                        goal_set,
                        number,
                        episode["goal"],
                        index,
                        expected["action"],
                        aspects,
                        expected,
                        _as_trace(step, expected["action"]),
                    )
            bar.update(1)
    bar.close()
    steps = sum(r.steps for r in reports.values())
    equal = sum(r.equal for r in reports.values())
    return {
        "traces": str(traces_dir),
        "catalog": str(catalog_dir),
        "catalog_pins": {k: catalog.manifest.get(k) for k in ("prices", "price_ceilings", "noun_extractor")},
        "steps": steps,
        "equal": equal,
        "equal_pct": _pct(equal, steps),
        "purchases": sum(r.purchases for r in reports.values()),
        "purchases_equal": sum(r.purchases_equal for r in reports.values()),
        "goals_differ": sum(r.goals_differ for r in reports.values()),
        "goal_sets": {s: r.as_dict() for s, r in reports.items()},
        "first_differences": differences,
        "seconds": round(time.monotonic() - started, 2),
    }


def _count(report: GoalSetReport, aspects: list[str]) -> None:
    if not aspects:
        report.equal += 1
    for aspect in aspects:
        report.differ[aspect] += 1


def _as_trace(step: Any, action: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"observation": step.observation, "available_actions": step.available_actions}
    if action is not None:
        data.update(action=action, reward=step.reward, done=step.done)
        if "reward_info" in step.info:
            data["verbose_info"] = step.info["reward_info"]
    return data


def _first_difference(expected: dict[str, Any], actual: dict[str, Any]) -> dict[str, Any]:
    """The first differing field, with the observations cut to where they start to differ."""
    for key in ("observation", "available_actions", "reward", "done", "verbose_info", "error"):
        want, got = expected.get(key), actual.get(key)
        if want == got:
            continue
        if isinstance(want, str) and isinstance(got, str):
            at = next(
                (i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b),
                min(len(want), len(got)),
            )
            start = max(0, at - 60)
            return {"field": key, "at": at, "expected": want[start : at + 80], "actual": got[start : at + 80]}
        return {"field": key, "expected": want, "actual": got}
    return {"field": None}


def format_report(summary: dict[str, Any]) -> str:
    """A short human-readable table of the summary, with the first differences."""
    lines = [f"traces {summary['traces']}  catalog {summary['catalog']}  pins {summary['catalog_pins']}"]
    header = f"{'goal set':<10} {'episodes':>8} {'steps':>7} {'equal':>8}  " + " ".join(
        f"{a:>16}" for a in ASPECTS
    )
    lines.append(header)
    for goal_set, report in summary["goal_sets"].items():
        lines.append(
            f"{goal_set:<10} {report['episodes']:>8} {report['steps']:>7} {report['equal_pct']:>7.3f}%  "
            + " ".join(f"{report['differ'][a]:>16}" for a in ASPECTS)
        )
    lines.append(
        f"total: {summary['equal']}/{summary['steps']} steps equal ({summary['equal_pct']:.3f}%), "
        f"{summary['purchases_equal']}/{summary['purchases']} purchases identical, "
        f"{summary['goals_differ']} goals differ from the recorded goal lists"
    )
    for diff in summary["first_differences"]:
        lines.append(
            f"- {diff['goal_set']} episode {diff['episode']} (goal {diff['goal']}) step {diff['step']} "
            f"{diff['action']!r}: {', '.join(diff['aspects'])}; {diff.get('field')}"
            + (f" at char {diff['at']}" if "at" in diff else "")
        )
        lines.append(f"    recorded: {diff.get('expected')!r}")
        lines.append(f"    replayed: {diff.get('actual')!r}")
    return "\n".join(lines)
