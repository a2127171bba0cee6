"""Replay the episodes recorded from the original WebShop and require identical output at every step.

The traces (tests/fixtures/conformance/original-seed3, see its README) were recorded from the original with its
real Lucene search and spaCy; the catalog is prepared with that run's prices, price ceilings and title nouns.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_envs.envs.webshop.conformance.adapter import goal_as_original
from agent_envs.envs.webshop.core.env import WebShopEnv

CONFORMANCE = Path(__file__).parents[1] / "fixtures" / "conformance" / "original-seed3"

GOAL_SETS = {"synthetic": "synthetic-goals", "human": "human-goals"}


def load_episodes(goal_set: str) -> list[dict]:
    path = CONFORMANCE / GOAL_SETS[goal_set] / "traces.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


EPISODES = [
    (goal_set, i, episode) for goal_set in GOAL_SETS for i, episode in enumerate(load_episodes(goal_set))
]


@pytest.mark.parametrize("goal_set", list(GOAL_SETS))
def test_goal_list_matches_original_order(conformance_catalog, goal_set: str) -> None:
    reference = json.loads((CONFORMANCE / GOAL_SETS[goal_set] / "goals.json").read_text())
    assert conformance_catalog.goal_count(goal_set) == len(reference)
    for index, expected in enumerate(reference):
        actual = goal_as_original(conformance_catalog.goal(goal_set, index))
        assert actual == expected, f"{goal_set} goal {index}"


@pytest.mark.parametrize(
    ("goal_set", "episode"),
    [(goal_set, episode) for goal_set, _, episode in EPISODES],
    ids=[f"{goal_set}-{i}-goal{episode['goal']}" for goal_set, i, episode in EPISODES],
)
def test_episode_replays_identically(conformance_catalog, goal_set: str, episode: dict) -> None:
    env = WebShopEnv(conformance_catalog)
    first, *rest = episode["steps"]
    step = env.reset(episode["goal"], goal_set=goal_set)
    assert step.observation == first["observation"]
    assert step.available_actions == first["available_actions"]
    for number, expected in enumerate(rest, start=1):
        where = f"step {number} action {expected['action']!r}"
        step = env.step(step.state, expected["action"])
        assert step.observation == expected["observation"], where
        assert step.available_actions == expected["available_actions"], where
        assert step.reward == expected["reward"], where
        assert step.done == expected["done"], where
        if "verbose_info" in expected:
            assert step.info["reward_info"] == expected["verbose_info"], where
        else:
            assert "reward_info" not in step.info, where
        if step.done:
            assert number == len(rest), "the recording goes on after a purchase"


def _difflib_ratio(a: str, b: str) -> int:
    """thefuzz 0.19's ratio without python-Levenshtein: difflib's SequenceMatcher."""
    import difflib

    if a == b:
        return 100
    if not a or not b:
        return 0
    return round(100 * difflib.SequenceMatcher(None, a, b).ratio())


def test_both_fuzzy_backends_score_the_recorded_episodes_alike(conformance_catalog, monkeypatch) -> None:
    """docs/deviations.md #9: the difflib backend gives the same rewards on every recorded purchase."""
    from agent_envs.envs.webshop.core import fuzz

    fuzz._token_set_ratio_processed.cache_clear()
    monkeypatch.setattr(fuzz, "ratio", _difflib_ratio)
    try:
        env = WebShopEnv(conformance_catalog)
        purchases = 0
        for goal_set, _, episode in EPISODES:
            step = env.reset(episode["goal"], goal_set=goal_set)
            for expected in episode["steps"][1:]:
                step = env.step(step.state, expected["action"])
                if "verbose_info" in expected:
                    purchases += 1
                    assert step.reward == expected["reward"]
                    assert step.info["reward_info"] == expected["verbose_info"]
        assert purchases > 0
    finally:
        fuzz._token_set_ratio_processed.cache_clear()
