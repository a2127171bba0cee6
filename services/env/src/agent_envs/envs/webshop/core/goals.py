"""Goal lists: synthetic goals (one per product option combination) and human goals, in the original order.

Goals are built in product-file order and then shuffled with ``random.Random(233)``, exactly as the original
does, so goal ``i`` here is goal ``i`` there. Price ceilings: the original draws them from Python's *unseeded*
global RNG; here they come from a seeded ``random.Random`` (or are pinned from a reference run), so every
replica and every run agrees.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

GOAL_SHUFFLE_SEED = 233
PRICE_RANGE = [10.0 * i for i in range(1, 100)]  # 10.0, 20.0, ..., 990.0
NO_PRICE_LIMIT = 1000000
GOAL_SETS = ("synthetic", "human")

# Standard splits by goal index (human goals; applied to synthetic goals too).
SPLITS: dict[str, tuple[int, int | None]] = {
    "test": (0, 500),
    "eval": (500, 1500),
    "train": (1500, None),
}


@dataclass
class Goal:
    """One goal as the original holds it, plus the parts its instruction text is made of."""

    asin: str
    category: str
    query: str
    name: str
    product_category: str
    instruction_text: str
    attributes: list[str]
    price_upper: float
    goal_options: dict[str, str] | list[str]
    weight: float
    # how instruction_text was made, so a pinned price ceiling can rebuild it
    base_text: str = ""
    option_text: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        return {
            "asin": self.asin,
            "category": self.category,
            "query": self.query,
            "name": self.name,
            "product_category": self.product_category,
            "instruction_text": self.instruction_text,
            "attributes": self.attributes,
            "price_upper": self.price_upper,
            "goal_options": self.goal_options,
            "weight": self.weight,
        }

    def set_price_upper(self, price_upper: float) -> None:
        self.price_upper = price_upper
        self.instruction_text = self.base_text + self.option_text + price_text(price_upper)


def draw_price_upper(price: float, rng: random.Random) -> float:
    """The original's ceiling: the larger of two of the first four multiples of 10 above the price."""
    candidates = [p for p in PRICE_RANGE if p > price][:4]
    if len(candidates) < 2:
        return NO_PRICE_LIMIT
    return max(rng.sample(candidates, 2))


def price_text(price_upper: float) -> str:
    if price_upper == NO_PRICE_LIMIT:
        return ""
    return f", and price lower than {price_upper:.2f} dollars"


def synthetic_goals(products: Iterable[Any], prices: dict[str, float], rng: random.Random) -> list[Goal]:
    """One goal per combination of a product's option values (option groups sorted by name)."""
    goals: list[Goal] = []
    for product in products:
        if product.instruction_text is None or not product.instruction_attributes:
            continue  # the original crashes on empty attribute lists; such goals are skipped
        price_upper = draw_price_upper(prices[product.asin], rng)
        names = sorted(product.options)
        for combination in itertools.product(*(product.options[name] for name in names)):
            goal_options = dict(zip(names, combination, strict=True))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = " with " + option_text if option_text else ""
            goals.append(
                Goal(
                    asin=product.asin,
                    category=product.category,
                    query=product.query,
                    name=product.title,
                    product_category=product.product_category,
                    instruction_text=product.instruction_text + option_text + price_text(price_upper),
                    attributes=list(product.instruction_attributes),
                    price_upper=price_upper,
                    goal_options=goal_options,
                    weight=0.0,
                    base_text=product.instruction_text,
                    option_text=option_text,
                )
            )
    counts = Counter(attribute for goal in goals for attribute in goal.attributes)
    for goal in goals:
        goal.weight = sum(1.0 / counts[a] for a in goal.attributes) / len(goal.attributes)
    return goals


def human_goals(products: Iterable[Any], prices: dict[str, float], rng: random.Random) -> list[Goal]:
    """One goal per human instruction that names at least one attribute; a ceiling drawn per instruction."""
    goals: list[Goal] = []
    for product in products:
        for instruction in product.human_instructions:
            attributes = list(instruction.get("instruction_attributes") or [])
            if not attributes:
                continue
            price_upper = draw_price_upper(prices[product.asin], rng)
            base = str(instruction.get("instruction", "")).strip(".")
            goals.append(
                Goal(
                    asin=product.asin,
                    category=product.category,
                    query=product.query,
                    name=product.title,
                    product_category=product.product_category,
                    instruction_text=base + price_text(price_upper),
                    attributes=attributes,
                    price_upper=price_upper,
                    goal_options=list(instruction.get("instruction_options") or []),
                    weight=1,
                    base_text=base,
                )
            )
    return goals


GOAL_BUILDERS: dict[str, Callable[[Iterable[Any], dict[str, float], random.Random], list[Goal]]] = {
    "synthetic": synthetic_goals,
    "human": human_goals,
}


def shuffle_goals(goals: list[Goal]) -> list[Goal]:
    """The original's fixed shuffle: ``random.seed(233); random.shuffle(goals)``."""
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    return goals


def split_range(split: str, total: int) -> range:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    start, stop = SPLITS[split]
    stop = total if stop is None else min(stop, total)
    return range(min(start, total), stop)


def split_of(goal_index: int) -> str:
    for name, (start, stop) in SPLITS.items():
        if goal_index >= start and (stop is None or goal_index < stop):
            return name
    raise ValueError(f"goal index {goal_index} is negative")
