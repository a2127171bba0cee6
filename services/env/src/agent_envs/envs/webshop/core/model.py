"""The data the simulator reads, and the catalog contract it reads it through.

The simulator never touches files: it asks a ``Catalog`` (implemented by ``..catalog.store``) for
products, goals and search results. Tests can hand it any object with these methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from .reward import RewardGoal, RewardProduct


@dataclass(frozen=True)
class ProductRecord:
    """A product as pages and the reward see it (after the original's cleaning)."""

    index: int
    asin: str
    title: str
    description: str
    bullet_points: tuple[str, ...]
    price_text: str  # shown on pages: "$24.49" or "$24.49 to $39.99"
    price: float  # the point price the reward compares with the goal's ceiling
    options: dict[str, tuple[str, ...]]  # group -> values, in data order
    attributes: tuple[str, ...]
    category: str
    query: str
    product_category: str
    title_nouns: tuple[str, ...]

    @classmethod
    def from_record(cls, index: int, record: dict[str, Any]) -> ProductRecord:
        return cls(
            index=index,
            asin=record["asin"],
            title=record["title"],
            description=record["description"],
            bullet_points=tuple(record["bullet_points"]),
            price_text=record["price_text"],
            price=record["price"],
            options={name: tuple(values) for name, values in record["options"]},
            attributes=tuple(record["attributes"]),
            category=record["category"],
            query=record["query"],
            product_category=record["product_category"],
            title_nouns=tuple(record["title_nouns"]),
        )

    def for_reward(self) -> RewardProduct:
        return RewardProduct(
            title=self.title,
            bullet_points=self.bullet_points,
            description=self.description,
            attributes=self.attributes,
            query=self.query,
            product_category=self.product_category,
            title_nouns=self.title_nouns,
        )


@dataclass(frozen=True)
class GoalRecord:
    """A goal: the product to buy (with options), its attributes and price ceiling, and the instruction."""

    index: int
    goal_set: str
    asin: str
    product_index: int
    instruction_text: str
    attributes: tuple[str, ...]
    goal_options: dict[str, str] | list[str]
    price_upper: float
    query: str
    category: str
    product_category: str
    name: str
    weight: float

    @classmethod
    def from_record(cls, index: int, goal_set: str, record: dict[str, Any]) -> GoalRecord:
        return cls(
            index=index,
            goal_set=goal_set,
            asin=record["asin"],
            product_index=record["product_index"],
            instruction_text=record["instruction_text"],
            attributes=tuple(record["attributes"]),
            goal_options=record["goal_options"],
            price_upper=record["price_upper"],
            query=record["query"],
            category=record["category"],
            product_category=record["product_category"],
            name=record["name"],
            weight=record["weight"],
        )

    def for_reward(self, goal_product: ProductRecord) -> RewardGoal:
        return RewardGoal(
            attributes=self.attributes,
            goal_options=self.goal_options,
            price_upper=self.price_upper,
            query=self.query,
            product_category=self.product_category,
            title_nouns=goal_product.title_nouns,
        )


class Ranking(NamedTuple):
    """A search's answer: product indices, best first, and how many products match (up to a cap)."""

    top: list[int]
    matches: int


class Catalog(Protocol):
    """What the simulator needs from a prepared catalog."""

    fingerprint: str

    def product(self, index: int) -> ProductRecord: ...

    def product_index(self, asin: str) -> int | None: ...

    def search(self, query: str, k: int, count_up_to: int) -> Ranking:
        """The ``k`` best products for ``query`` and how many match, counted up to ``count_up_to``."""
        ...

    def goal(self, goal_set: str, index: int) -> GoalRecord: ...

    def goal_count(self, goal_set: str) -> int: ...
