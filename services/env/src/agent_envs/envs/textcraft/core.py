"""TextCraft (Prasad et al., ADaPT; AgentGym's ``agentenv-textcraft``) as a pure core: craft a Minecraft item
from the commands the reset text lists, with ``get N item``, ``craft N item using N item, ...`` and
``inventory``.

The episode state is ``{"task": t, "inv": [[item, count], ...]}`` (the inventory in insertion order, item ids
without ``minecraft:``): it travels in the client's signed token. Everything AgentGym's server answers is
reproduced string for string (docs/environments/textcraft.md); the limits below are the only additions.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..contract import JSON, BadState, EnvError, StateTravel, Transition, UnknownTask
from .recipes import PREFIX, Ingredient, Recipe, RecipeBook, display, load, package_version
from .table import check_table, read_table

STATE_VERSION = 1
MAX_ACTION_CHARS = 10_000  # the recordings send up to 5,000 characters
MAX_COUNT_DIGITS = 30  # an inventory count above 10**30 - 1 is refused (the recordings reach 10**20 + 3)
MAX_INVENTORY_ITEMS = 64  # distinct items held at once (30 rounds can add at most 30)
PY_INT_DIGITS = 4300  # CPython's int(str) limit: the original answers its ValueError past it
SAFE_INT = 2**53  # counts at or above it are stored as decimal strings (JSON readers that use doubles)

CRAFT = re.compile(r"craft (.*) using (.*)")
GET = re.compile(r"get ([0-9]+) (.*)")
INVENTORY = re.compile(r"inventory")
COUNTED = re.compile(r"([0-9]+) (.*)")


class ActionRefused(EnvError):
    """An action this service refuses where the original would not: too long, or an inventory past the limits."""


class _Exit(Exception):
    """A step's answer, raised from inside the parser (the original returns early with these texts)."""

    def __init__(self, observation: str) -> None:
        self.observation = observation


def _count(digits: str) -> int:
    """``int(digits)`` as the original's Python 3.11 evaluates it, including its digit limit's error text."""
    if len(digits) > PY_INT_DIGITS:
        raise EnvError(
            f"Exceeds the limit ({PY_INT_DIGITS} digits) for integer string conversion: value has {len(digits)} "
            "digits; use sys.set_int_max_str_digits() to increase the limit"
        )
    return int(digits)


@dataclass(frozen=True)
class _Stack:
    """What a craft command names: an item id, or a tag (``item`` None), and a count."""

    item: str | None
    tag: str | None
    count: int

    def __repr__(self) -> str:  # the original's dataclass repr, which its error text prints
        return (
            f"ItemTagWithCount(item_tag=ItemTag(tag={self.tag!r}, item_id={self.item!r}), count={self.count})"
        )


class TextCraft:
    """The 544 TextCraft goals (AgentGym's ``data_idx % 544``), immutable and shared by every episode."""

    env_id: ClassVar[str] = "textcraft"
    state_travel: ClassVar[StateTravel] = "token"

    def __init__(self, book: RecipeBook | None = None, texts: Sequence[str] | None = None) -> None:
        self.book = book or load()
        self.texts: tuple[str, ...] = tuple(
            texts if texts is not None else check_table(read_table(), self.book)
        )
        if len(self.texts) != len(self.book.goals):
            raise ValueError("one reset text per goal")
        self.holdable = frozenset(self.book.base_items | set(self.book.by_item))  # what an inventory may hold
        self._fingerprint = hashlib.sha256(
            "\0".join(
                [f"textcraft-core/{STATE_VERSION}", package_version(), self.book.digest, *self.texts]
                + [str(v) for v in (MAX_ACTION_CHARS, MAX_COUNT_DIGITS, MAX_INVENTORY_ITEMS)]
            ).encode()
        ).hexdigest()

    # ---- the contract -------------------------------------------------------------------------------------
    def task_count(self) -> int:
        return len(self.book.goals)

    def fingerprint(self) -> str:
        return self._fingerprint

    def goal(self, task: int) -> str:
        self._check_task(task)
        return self.book.goals[task]

    def reset(self, task: int) -> Transition:
        self._check_task(task)
        return Transition(
            self.texts[task], 0.0, False, {"task": task, "inv": []}, {"goal": self.book.goals[task]}
        )

    def step(self, state: JSON, action: str) -> Transition:
        task, inventory = self._decode(state)
        if not isinstance(action, str):
            raise EnvError(f"an action is a string, got {type(action).__name__}")
        if len(action) > MAX_ACTION_CHARS:
            raise ActionRefused(f"action too long: {len(action)} characters (at most {MAX_ACTION_CHARS})")
        goal = self.book.goals[task]
        reward = 0.0
        try:
            if match := CRAFT.match(action):
                crafted, observation = self._craft(inventory, match.group(1), match.group(2))
                reward = 1.0 if crafted == goal else 0.0
            elif match := GET.match(action):  # no reward: a goal is always crafted, never got
                observation = self._get(inventory, match.group(1), match.group(2))
            elif INVENTORY.match(action):
                observation = self._inventory_text(inventory)
            else:
                observation = f"Could not execute {action}"
        except _Exit as answer:
            observation, reward = answer.observation, 0.0
        return Transition(observation, reward, reward == 1.0, self._encode(task, inventory), {})

    def expert(self, task: int) -> list[str]:
        """A shortest-depth plan: every base item got once up front, then the crafts, inputs before outputs."""
        self._check_task(task)
        gets: dict[str, int] = {}
        crafts: list[str] = []
        free: dict[str, int] = {}  # units made and not yet promised to a craft

        def make(item: str, n: int) -> None:
            take = min(free.get(item, 0), n)
            free[item] = free.get(item, 0) - take
            n -= take
            if n <= 0:
                return
            if item not in self.book.by_item:
                gets[item] = gets.get(item, 0) + n
                return
            recipe = min(self.book.by_item[item], key=self.book.recipe_depth)  # the first of the shallowest
            times = math.ceil(n / recipe.count)
            names = self._concrete(recipe)
            for ingredient, name in zip(recipe.inputs, names, strict=True):
                make(name, ingredient.count * times)
            using = ", ".join(
                f"{i.count} {display(name)}" for i, name in zip(recipe.inputs, names, strict=True)
            )
            crafts.extend([f"craft {recipe.count} {display(item)} using {using}"] * times)
            free[item] = free.get(item, 0) + times * recipe.count - n

        make(self.book.goals[task], 1)
        return [f"get {n} {display(item)}" for item, n in gets.items()] + crafts

    # ---- actions ------------------------------------------------------------------------------------------
    def _stack(self, name: str, count: int) -> _Stack:
        full = PREFIX + name.replace(" ", "_")
        return _Stack(None, full, count) if full in self.book.tags else _Stack(full, None, count)

    def _craft(self, inventory: dict[str, int], target: str, using: str) -> tuple[str | None, str]:
        match = COUNTED.match(target)
        output = self._stack(match.group(2), _count(match.group(1))) if match else self._stack(target, 1)
        given: list[_Stack] = []
        for part in using.split(","):
            part = part.strip()
            if not (match := COUNTED.match(part)):
                raise _Exit(f"Wrong item format: {part}")
            given.append(self._stack(match.group(2), _count(match.group(1))))
        for stack in given:
            if stack.item is None or stack.item not in inventory or inventory[stack.item] < stack.count:
                raise _Exit(f"Could not find enough items to craft {output.item}")
        recipe = next((r for r in self.book.by_item.get(output.item or "", ()) if self._fits(r, given)), None)
        if recipe is None:
            raise _Exit(f"Could not find a valid recipe for {output!r}")
        for stack in given:
            assert stack.item is not None
            inventory[stack.item] -= stack.count
            if inventory[stack.item] == 0:
                del inventory[stack.item]
        self._add(inventory, recipe.output, recipe.count)
        return recipe.output, f"Crafted {recipe.count} {recipe.output}"

    def _fits(self, recipe: Recipe, given: list[_Stack]) -> bool:
        """The given stacks are the recipe's ingredients one to one: same counts, an item standing for a tag
        ingredient when it is a member of that tag, nothing missing and nothing extra."""
        if len(given) != len(recipe.inputs):
            return False
        unused = list(recipe.inputs)
        for stack in given:
            for ingredient in unused:
                if ingredient.count == stack.count and self._stands_for(stack, ingredient):
                    unused.remove(ingredient)
                    break
            else:
                return False
        return True

    def _stands_for(self, stack: _Stack, ingredient: Ingredient) -> bool:
        if ingredient.tag:
            return stack.item is not None and self.book.item_tag.get(stack.item) == ingredient.name
        return stack.item == ingredient.name

    def _get(self, inventory: dict[str, int], digits: str, name: str) -> str:
        count = _count(digits)
        item = PREFIX + name.replace(" ", "_")
        if item not in self.book.base_items:  # craftable, a tag, or unknown
            return f"Could not find {name}"
        self._add(inventory, item, count)
        return f"Got {count} {name}"

    @staticmethod
    def _add(inventory: dict[str, int], item: str, count: int) -> None:
        total = inventory.get(item, 0) + count
        if len(str(total)) > MAX_COUNT_DIGITS:
            raise ActionRefused(f"inventory count too large: at most {MAX_COUNT_DIGITS} digits per item")
        if item not in inventory and len(inventory) >= MAX_INVENTORY_ITEMS:
            raise ActionRefused(f"inventory full: at most {MAX_INVENTORY_ITEMS} distinct items")
        inventory[item] = total

    @staticmethod
    def _inventory_text(inventory: dict[str, int]) -> str:
        if not inventory:
            return "Inventory: You are not carrying anything."
        return "Inventory: " + "".join(f"[{display(item)}] ({count}) " for item, count in inventory.items())

    def _concrete(self, recipe: Recipe) -> list[str]:
        """An item to use for each ingredient: a tag's shallowest member, one the recipe does not name already."""
        named = {i.name for i in recipe.inputs if not i.tag}
        out: list[str] = []
        for ingredient in recipe.inputs:
            if not ingredient.tag:
                out.append(ingredient.name)
                continue
            members = [m for m in self.book.tag_members[ingredient.name] if m not in named and m not in out]
            out.append(min(members, key=self.book.depth.__getitem__))
        return out

    # ---- state --------------------------------------------------------------------------------------------
    def _check_task(self, task: Any) -> None:
        if isinstance(task, bool) or not isinstance(task, int) or not 0 <= task < len(self.book.goals):
            raise UnknownTask(f"TextCraft has tasks 0..{len(self.book.goals) - 1}, got {task!r}")

    @staticmethod
    def _encode(task: int, inventory: dict[str, int]) -> JSON:
        return {
            "task": task,
            "inv": [
                [item.removeprefix(PREFIX), n if n < SAFE_INT else str(n)] for item, n in inventory.items()
            ],
        }

    def _decode(self, state: JSON) -> tuple[int, dict[str, int]]:
        """A state this core wrote, checked field by field (a hand-made or foreign one is a ``BadState``)."""
        if not isinstance(state, dict) or set(state) != {"task", "inv"}:
            raise BadState("not a TextCraft state: want {'task': int, 'inv': [[item, count], ...]}")
        task, items = state["task"], state["inv"]
        if isinstance(task, bool) or not isinstance(task, int) or not 0 <= task < len(self.book.goals):
            raise BadState(f"TextCraft state: task {task!r} is not one of 0..{len(self.book.goals) - 1}")
        if not isinstance(items, list) or len(items) > MAX_INVENTORY_ITEMS:
            raise BadState(
                f"TextCraft state: the inventory is a list of at most {MAX_INVENTORY_ITEMS} entries"
            )
        inventory: dict[str, int] = {}
        for entry in items:
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
                raise BadState(f"TextCraft state: inventory entry {entry!r} is not [item, count]")
            item, count = PREFIX + entry[0], entry[1]
            if item not in self.holdable or item in inventory:
                raise BadState(f"TextCraft state: {entry[0]!r} cannot be held (or is listed twice)")
            if (
                isinstance(count, str)
                and count.isascii()
                and count.isdigit()
                and len(count) <= MAX_COUNT_DIGITS
            ):
                count = int(count)
            if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count < 10**MAX_COUNT_DIGITS:
                raise BadState(f"TextCraft state: count {entry[1]!r} of {entry[0]!r} is not a count")
            inventory[item] = count
        return task, inventory


def make() -> TextCraft:
    """The core, built once per process (about 0.1 s: recipes and the reset-text table)."""
    return TextCraft()
