"""Metric definitions: score, success rate, intervals, breakdowns (pure functions, no cluster)."""

from __future__ import annotations

import pytest

from agent_trainer.evaluation.metrics import (
    bootstrap_mean_interval,
    reward_histogram,
    summarize,
    wilson_interval,
)


def record(goal: int, reward: float, steps: int, category: str = "beauty", **extra: object) -> dict:
    return {"goal": goal, "reward": reward, "steps": steps, "category": category, **extra}


def test_score_success_and_rates() -> None:
    records = [
        record(0, 1.0, 4, invalid_actions=1),
        record(1, 0.5, 6, category="home", unparsed_outputs=1, invalid_actions=1),
        record(2, 0.0, 15, category="home", truncated=True, ended_by="max_turns"),
        record(3, 1.0, 5),
    ]
    m = summarize(records)
    assert m["episodes"] == 4
    assert m["score"] == pytest.approx(62.5)
    assert m["success_rate"] == pytest.approx(0.5)
    assert m["successes"] == 2
    assert m["mean_steps"] == pytest.approx(7.5)
    assert m["invalid_action_rate"] == pytest.approx(2 / 30)
    assert m["unparsed_output_rate"] == pytest.approx(1 / 30)
    assert m["truncated_rate"] == pytest.approx(0.25)
    assert m["by_category"]["beauty"] == {
        "episodes": 2,
        "score": 100.0,
        "success_rate": 1.0,
        "mean_steps": 4.5,
    }
    assert m["by_category"]["home"]["score"] == pytest.approx(25.0)
    low, high = m["score_ci95"]
    assert 0 <= low <= m["score"] <= high <= 100
    low, high = m["success_rate_ci95"]
    assert 0 < low < 0.5 < high < 1


def test_success_means_reward_exactly_one() -> None:
    m = summarize([record(0, 0.999, 3), record(1, 1.0, 3)])
    assert m["successes"] == 1
    assert m["reward_histogram"]["counts"][-1] == 1
    assert m["reward_histogram"]["counts"][9] == 1


def test_missing_category_is_unknown_and_empty_input_is_safe() -> None:
    assert list(summarize([{"goal": 0, "reward": 0.0, "steps": 1}])["by_category"]) == ["unknown"]
    empty = summarize([])
    assert empty["episodes"] == 0 and empty["score"] == 0.0 and empty["success_rate_ci95"] == [0.0, 1.0]


def test_wilson_interval_known_values() -> None:
    low, high = wilson_interval(0, 50)
    assert low == pytest.approx(0.0, abs=1e-12) and high == pytest.approx(0.0714, abs=1e-3)
    low, high = wilson_interval(50, 50)
    assert high == 1.0 and low == pytest.approx(0.9286, abs=1e-3)
    low, high = wilson_interval(25, 50)
    assert (low, high) == pytest.approx((0.3664, 0.6336), abs=1e-3)


def test_bootstrap_is_seeded_and_degenerate_cases_are_points() -> None:
    values = [0.0, 0.2, 1.0, 1.0, 0.5, 0.7, 0.1]
    assert bootstrap_mean_interval(values, seed=3) == bootstrap_mean_interval(values, seed=3)
    low, high = bootstrap_mean_interval(values, seed=3)
    assert low < sum(values) / len(values) < high
    assert bootstrap_mean_interval([1.0] * 9) == (1.0, 1.0)
    assert bootstrap_mean_interval([]) == (0.0, 0.0)


def test_reward_histogram_bins() -> None:
    hist = reward_histogram([0.0, 0.05, 0.1, 0.95, 1.0, 1.0])
    assert hist["counts"] == [2, 1, 0, 0, 0, 0, 0, 0, 0, 1, 2]
    assert len(hist["labels"]) == 11 and hist["labels"][-1] == "1.0"
