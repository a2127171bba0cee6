"""The custom reward function: episode reward, success, steps and invalid actions from turn scores."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

pytest.importorskip(
    "verl", reason="the trainer package needs verl: pip install -c constraints.txt -e services/trainer"
)

from agent_trainer.episode import TurnScore
from agent_trainer.reward import METRIC_KEYS, compute_score, episode_summary


def turns(*specs: tuple[float, bool, bool]) -> list[TurnScore]:
    """(value, invalid, done) -> TurnScore; a final turn is a purchase paying the value."""
    return [TurnScore(v, invalid=i, done=d, env_reward=v if d else 0.0, purchased=d) for v, i, d in specs]


def test_successful_episode() -> None:
    result = compute_score(
        "webshop",
        "...",
        "B0X",
        {"turn_scores": turns((0, False, False), (0, False, False), (1.0, False, True))},
    )
    assert result == {"score": 1.0, "env_reward": 1.0, "success": 1.0, "purchased": 1.0, "steps": 3.0,
                      "invalid_actions": 0.0, "invalid_rate": 0.0}  # fmt: skip


def test_partial_reward_is_not_success() -> None:
    result = compute_score("webshop", "", "", {"turn_scores": turns((0, True, False), (0.5, False, True))})
    assert result["score"] == 0.5 and result["env_reward"] == 0.5
    assert result["success"] == 0.0 and result["purchased"] == 1.0
    assert result["steps"] == 2.0 and result["invalid_actions"] == 1.0 and result["invalid_rate"] == 0.5


def test_no_purchase_scores_zero() -> None:
    result = compute_score("webshop", "", "", {"turn_scores": turns((0, True, False), (0, True, False))})
    assert result["score"] == 0.0 and result["purchased"] == 0.0 and result["invalid_actions"] == 2.0


def test_penalty_lowers_the_score_but_not_the_env_reward() -> None:
    scores = [TurnScore(-0.1, invalid=True), TurnScore(1.0, done=True, env_reward=1.0, purchased=True)]
    result = compute_score(extra_info={"turn_scores": scores})
    assert result["score"] == pytest.approx(0.9)
    assert result["env_reward"] == 1.0 and result["success"] == 1.0


@pytest.mark.parametrize(
    "last",
    [
        TurnScore(0.0, done=True),  # truncated by the server's step limit: a step, no purchase
        TurnScore(0.0, done=True, stepped=False),  # the server refused the step, or the episode expired
    ],
)
def test_endings_without_a_purchase_are_not_purchases(last: TurnScore) -> None:
    result = compute_score(extra_info={"turn_scores": [TurnScore(0.0), last]})
    assert result["purchased"] == 0.0 and result["env_reward"] == 0.0 and result["success"] == 0.0
    assert result["steps"] == (2.0 if last.stepped else 1.0)


def test_every_call_returns_the_same_keys_even_without_turns() -> None:
    for extra in (None, {}, {"turn_scores": []}, {"turn_scores": None}):
        result = compute_score("webshop", "", "", extra)
        assert tuple(result) == METRIC_KEYS
        assert result["score"] == 0.0 and result["steps"] == 0.0


def test_plain_floats_still_give_the_reward() -> None:
    result = episode_summary([0.0, 0.0, 0.75])
    assert result["env_reward"] == 0.75 and result["purchased"] == 1.0 and result["steps"] == 3.0
    assert result["invalid_actions"] == 0.0  # unknown without TurnScore


def test_turn_scores_survive_pickling_and_numpy_object_arrays() -> None:
    """verl ships extra_fields to the reward worker through Ray (pickle), inside numpy object arrays."""
    original = turns((0, True, False), (1.0, False, True))
    shipped = pickle.loads(pickle.dumps(np.array([{"turn_scores": original}], dtype=object)))[0]
    restored = shipped["turn_scores"]
    assert [float(s) for s in restored] == [0.0, 1.0]
    assert [s.invalid for s in restored] == [True, False] and restored[-1].done and restored[-1].purchased
    result = compute_score(extra_info={"turn_scores": np.array(restored, dtype=object)})
    assert result["success"] == 1.0 and result["invalid_actions"] == 1.0


def test_turn_score_is_a_float() -> None:
    score = TurnScore(0.25, invalid=True)
    assert isinstance(score, float) and score + 1 == 1.25 and "invalid=True" in repr(score)
