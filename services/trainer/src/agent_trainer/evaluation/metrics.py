"""Summary statistics of an evaluation: score, success rate, their confidence intervals, breakdowns.

Pure functions over the episode records that ``runner`` writes to ``trajectories.jsonl`` (one dict per
finished episode), so a report can always be recomputed from the trajectories alone.

Definitions (the WebShop paper's): ``score`` = mean final reward × 100; ``success_rate`` = fraction of
episodes with reward == 1. Other environments' records carry ``success`` as their spec judged it
(``agent_trainer.envs``: TextCraft's craft of the goal, BabyAI's level solved with a reward below 1), which
then counts instead of the WebShop rule; ``summarize_mix`` puts several environments' summaries side by side. Intervals are 95 %: Wilson's for the success rate (well-behaved at 0 and 1,
where the normal approximation collapses to a zero-width interval) and a seeded percentile bootstrap for
the score (rewards are bounded and skewed, so a t-interval would mislead on small samples).
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..envs.webshop import is_success

Z95 = 1.959963984540054
BOOTSTRAP_RESAMPLES = 2000
REWARD_BINS = 10  # [0, 0.1), ..., [0.9, 1.0), plus an exact-1.0 bin (success) kept apart
UNKNOWN_CATEGORY = "unknown"


def wilson_interval(successes: int, total: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; (0, 1) when there is no data."""
    if total <= 0:
        return 0.0, 1.0
    p = successes / total
    denominator = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denominator
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_mean_interval(
    values: Sequence[float], seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES, level: float = 0.95
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean (seeded: the same data always gives the same interval)."""
    n = len(values)
    if n == 0:
        return 0.0, 0.0
    if n == 1 or min(values) == max(values):
        return float(values[0]), float(values[0])
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(resamples))
    alpha = (1 - level) / 2
    low = means[max(0, math.floor(alpha * resamples))]
    high = means[min(resamples - 1, math.ceil((1 - alpha) * resamples) - 1)]
    return float(low), float(high)


def reward_histogram(rewards: Iterable[float], bins: int = REWARD_BINS) -> dict[str, list[Any]]:
    """Counts per reward bin: ``bins`` equal bins over [0, 1) and one bin for exactly 1.0 (a success)."""
    counts = [0] * (bins + 1)
    for reward in rewards:
        if is_success(reward):
            counts[bins] += 1
        else:
            counts[min(bins - 1, max(0, int(reward * bins)))] += 1
    labels = [f"{i / bins:.1f}–{(i + 1) / bins:.1f}" for i in range(bins)] + ["1.0"]
    return {"labels": labels, "counts": counts}


def steps_histogram(steps: Iterable[int]) -> dict[str, list[Any]]:
    """Episodes per number of steps, for every length from 0 to the longest seen."""
    counter = Counter(int(s) for s in steps)
    longest = max(counter, default=0)
    return {
        "labels": [str(i) for i in range(longest + 1)],
        "counts": [counter.get(i, 0) for i in range(longest + 1)],
    }


def solved(record: Mapping[str, Any]) -> bool:
    """The episode's success: its own ``success`` (its environment's rule), else WebShop's (reward == 1)."""
    if "success" in record:
        return bool(record["success"])
    return is_success(float(record["reward"]))


def _group(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    rewards = [float(r["reward"]) for r in records]
    n = len(rewards)
    successes = sum(1 for r in records if solved(r))
    return {
        "episodes": n,
        "score": 100.0 * sum(rewards) / n if n else 0.0,
        "success_rate": successes / n if n else 0.0,
        "mean_steps": sum(int(r["steps"]) for r in records) / n if n else 0.0,
    }


def summarize(records: Sequence[Mapping[str, Any]], bootstrap_seed: int = 0) -> dict[str, Any]:
    """The metrics of finished episodes (records as ``runner`` writes them)."""
    rewards = [float(r["reward"]) for r in records]
    n = len(records)
    successes = sum(1 for r in records if solved(r))
    total_steps = sum(int(r["steps"]) for r in records)
    invalid = sum(int(r.get("invalid_actions", 0)) for r in records)
    unparsed = sum(int(r.get("unparsed_outputs", 0)) for r in records)
    score_low, score_high = bootstrap_mean_interval(rewards, seed=bootstrap_seed)
    success_low, success_high = wilson_interval(successes, n)
    by_category: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for record in records:
        by_category[str(record.get("category") or UNKNOWN_CATEGORY)].append(record)
    ended_by = Counter(str(r.get("ended_by", "unknown")) for r in records)
    return {
        **_group(records),
        "score_ci95": [100.0 * score_low, 100.0 * score_high],
        "success_rate_ci95": [success_low, success_high],
        "successes": successes,
        "mean_reward": sum(rewards) / n if n else 0.0,
        "total_steps": total_steps,
        "invalid_action_rate": invalid / total_steps if total_steps else 0.0,
        "unparsed_output_rate": unparsed / total_steps if total_steps else 0.0,
        "truncated_rate": sum(1 for r in records if r.get("truncated")) / n if n else 0.0,
        "ended_by": dict(sorted(ended_by.items())),
        "by_category": {name: _group(group) for name, group in sorted(by_category.items())},
        "reward_histogram": reward_histogram(rewards),
        "steps_histogram": steps_histogram(int(r["steps"]) for r in records),
    }


#: What a mixed evaluation's per-environment table shows of each environment's ``summarize``.
MIX_KEYS = ("episodes", "score", "score_ci95", "success_rate", "success_rate_ci95", "successes", "mean_reward",
            "mean_steps", "invalid_action_rate", "unparsed_output_rate", "truncated_rate")  # fmt: skip


def summarize_mix(per_env: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Several environments' summaries side by side (``by_env``), and their episodes pooled (``overall``:
    episodes, successes, success rate with its Wilson interval; rewards are not pooled, their scales differ)."""
    episodes = sum(int(m["episodes"]) for m in per_env.values())
    successes = sum(int(m["successes"]) for m in per_env.values())
    low, high = wilson_interval(successes, episodes)
    return {
        "envs": list(per_env),
        "by_env": {env: {k: m[k] for k in MIX_KEYS if k in m} for env, m in per_env.items()},
        "overall": {"episodes": episodes, "successes": successes,
                    "success_rate": successes / episodes if episodes else 0.0,
                    "success_rate_ci95": [low, high]},
    }  # fmt: skip
