"""The original WebShop purchase reward, term for term.

    reward = (attribute matches + option matches + [price <= price_upper])
             / (len(goal attributes) + len(goal options) + 1)  * r_type

r_type is 1.0, 0.5, 0.1 or 0.0 from query equality, breadcrumb overlap and the overlap of the title nouns
(see ``type_reward``). Attribute and option matches use ``token_set_ratio > 85``. ``goal_options`` is a dict
for synthetic goals (its ``(name, value)`` items are matched, a quirk the original has) and a list for human
goals. The breakdown has the keys of the original's ``verbose_info``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .colors import normalize_color
from .fuzz import token_set_ratio

FUZZY_THRESHOLD = 85
EMPTY_TITLE_SCORE = 0.2


@dataclass(frozen=True)
class RewardProduct:
    """What the reward reads of a product."""

    title: str
    bullet_points: Sequence[str]
    description: str
    attributes: Sequence[str]
    query: str
    product_category: str
    title_nouns: Sequence[str]


@dataclass(frozen=True)
class RewardGoal:
    """What the reward reads of a goal."""

    attributes: Sequence[str]
    goal_options: dict[str, str] | list[str]
    price_upper: float
    query: str
    product_category: str
    title_nouns: Sequence[str]  # nouns of the goal product's title


def type_reward(purchased: RewardProduct, goal: RewardGoal) -> dict[str, Any]:
    query_match = purchased.query == goal.query
    purchased_path = {part.strip() for part in purchased.product_category.split("›")}
    goal_path = {part.strip() for part in goal.product_category.split("›")}
    category_match = len(purchased_path & goal_path) >= 2
    goal_nouns = list(goal.title_nouns)
    if goal_nouns:
        title_score = len(set(purchased.title_nouns) & set(goal_nouns)) / len(goal_nouns)
    else:
        title_score = EMPTY_TITLE_SCORE
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {
        "r_type": r_type,
        "query_match": query_match,
        "category_match": category_match,
        "title_score": title_score,
    }


def attribute_reward(purchased: RewardProduct, goal_attributes: Sequence[str]) -> tuple[float, int]:
    title = purchased.title.lower()
    bullets = " ".join(purchased.bullet_points).lower()
    description = purchased.description.lower()
    matches = 0
    for goal_attribute in goal_attributes:
        if any(token_set_ratio(p, goal_attribute) > FUZZY_THRESHOLD for p in purchased.attributes) or (
            goal_attribute in title or goal_attribute in bullets or goal_attribute in description
        ):
            matches += 1
    return matches / len(goal_attributes), matches


def option_reward(purchased_options: Iterable[Any], goal_options: Iterable[Any]) -> tuple[float | None, int]:
    purchased = [normalize_color(option) for option in purchased_options]
    wanted = [normalize_color(option) for option in goal_options]
    matches = 0
    for goal_option in wanted:
        if any(token_set_ratio(option, goal_option) > FUZZY_THRESHOLD for option in purchased):
            matches += 1
    return (matches / len(wanted) if wanted else None), matches


def compute_reward(
    purchased: RewardProduct, goal: RewardGoal, price: float, options: dict[str, str]
) -> tuple[float, dict[str, Any]]:
    """Reward of buying ``purchased`` at ``price`` with ``options``; returns (reward, breakdown)."""
    type_info = type_reward(purchased, goal)
    r_price = price <= goal.price_upper
    r_att, attribute_matches = attribute_reward(purchased, goal.attributes)
    goal_options = goal.goal_options.items() if isinstance(goal.goal_options, dict) else goal.goal_options
    r_option, option_matches = option_reward(list(options.values()), goal_options)
    denominator = len(goal.attributes) + len(goal.goal_options) + 1
    reward = (attribute_matches + option_matches + r_price) / denominator
    reward *= type_info["r_type"]
    info: dict[str, Any] = {
        "r_type": type_info["r_type"],
        "r_att": r_att,
        "w_att": len(goal.attributes) / denominator,
        "query_match": type_info["query_match"],
        "category_match": type_info["category_match"],
        "title_score": type_info["title_score"],
    }
    if r_option is not None:
        info["r_option"] = r_option
        info["w_option"] = len(goal.goal_options) / denominator
    info["r_price"] = r_price
    info["w_price"] = 1 / denominator
    return reward, info
