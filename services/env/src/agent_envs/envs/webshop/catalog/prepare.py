"""Raw WebShop files -> the prepared, read-only catalog directory (see ``store.py`` for the layout).

Steps: stream and clean the raw products; draw each product's point price (seeded, or pinned from a reference
run); extract title nouns once (spaCy or the fallback, or pinned); write the product records sorted by ASIN;
build the BM25 index; build the goal lists in the original's order with seeded (or pinned) price ceilings;
write the manifest with a fingerprint of everything. The output directory is replaced atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from tqdm import tqdm

from ..core.goals import GOAL_BUILDERS, GOAL_SETS, Goal, shuffle_goals
from ..core.nouns import NounExtractor, default_noun_extractor
from ..search.bm25 import build_index
from .raw import Product, RawDataError, index_text, iter_products
from .store import FORMAT_VERSION, MANIFEST, RecordWriter

DEFAULT_PRICE_SEED = 1234
DEFAULT_CEILING_SEED = 233
# Synthetic goals are one per option combination: millions on a full-size catalog. "auto" builds them only up
# to this many products (the original's synthetic setups use the 1,000-product catalog); name them to force.
AUTO_SYNTHETIC_MAX_PRODUCTS = 100_000


@dataclass
class Pins:
    """Numbers taken from a reference run of the original instead of being drawn here."""

    prices: dict[str, float] | None = None  # asin -> point price
    title_nouns: dict[str, list[str]] | None = None  # asin -> nouns
    goals: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # goal set -> goals (price_upper)

    @classmethod
    def from_files(
        cls,
        prices: Path | None = None,
        title_nouns: Path | None = None,
        goals: dict[str, Path] | None = None,
    ) -> Pins:
        return cls(
            prices=_read_json(prices) if prices else None,
            title_nouns=_read_json(title_nouns) if title_nouns else None,
            goals={name: _read_json(path) for name, path in (goals or {}).items()},
        )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise RawDataError(f"cannot read pinned numbers from {path}: {error}") from None


@dataclass
class GoalMaterial:
    """The few fields of a product that goal building needs (kept in memory instead of whole products)."""

    asin: str
    title: str
    category: str
    query: str
    product_category: str
    options: dict[str, list[str]]
    instruction_text: str | None
    instruction_attributes: list[str] | None
    human_instructions: list[dict[str, Any]]


def prepare_catalog(
    raw_dir: Path,
    out_dir: Path,
    *,
    num_products: int | None = None,
    goal_sets: tuple[str, ...] | str = "auto",
    price_seed: int = DEFAULT_PRICE_SEED,
    ceiling_seed: int = DEFAULT_CEILING_SEED,
    pins: Pins | None = None,
    noun_extractor: NounExtractor | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Build the prepared catalog from ``raw_dir`` into ``out_dir``; returns the manifest."""
    started = time.monotonic()
    pins = pins or Pins()
    raw_dir, out_dir = Path(raw_dir), Path(out_dir)
    work = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    extractor = noun_extractor or (None if pins.title_nouns is not None else default_noun_extractor())
    price_rng = random.Random(price_seed)
    auto = goal_sets == "auto"
    goal_sets = GOAL_SETS if auto else tuple(goal_sets)
    unknown = set(goal_sets) - set(GOAL_SETS)
    if unknown:
        raise RawDataError(f"unknown goal set(s) {sorted(unknown)}; expected {', '.join(GOAL_SETS)} or auto")
    wants_synthetic, wants_human = "synthetic" in goal_sets, "human" in goal_sets

    # 1. stream products: unsorted records + goal material + index text
    unsorted = work / "products.unsorted.jsonl"
    asins: list[str] = []
    materials: list[GoalMaterial] = []
    prices: dict[str, float] = {}
    bar = tqdm(desc="products", unit=" products", disable=not progress)
    batch: list[Product] = []
    with RecordWriter(unsorted) as writer, open(work / "index_text.txt", "w", encoding="utf-8") as texts:

        def flush() -> None:
            nonlocal wants_synthetic
            nouns = _title_nouns(batch, pins, extractor)
            for product, product_nouns in zip(batch, nouns, strict=True):
                price = _point_price(product, pins, price_rng)
                writer.append(_product_record(product, price, product_nouns))
                texts.write(index_text(product).replace("\n", " ") + "\n")
                asins.append(product.asin)
                if (wants_synthetic and product.instruction_text is not None) or (
                    wants_human and product.human_instructions
                ):
                    materials.append(_material(product))
                    prices[product.asin] = price  # only goals need them here (the records hold all)
            bar.update(len(batch))
            batch.clear()
            if auto and wants_synthetic and len(asins) > AUTO_SYNTHETIC_MAX_PRODUCTS:
                wants_synthetic = False  # too many products for one goal per option combination
                materials[:] = [m for m in materials if m.human_instructions]

        for product in iter_products(raw_dir, num_products=num_products):
            batch.append(product)
            if len(batch) >= 1024:
                flush()
        flush()
    bar.close()
    if not asins:
        raise RawDataError(f"{raw_dir}: no products left after cleaning")

    # 2. products sorted by ASIN (= the index's document order)
    order = sorted(range(len(asins)), key=asins.__getitem__)
    goal_asins = {material.asin for material in materials}  # positions are needed for goal products only
    position_of = {asins[i]: rank for rank, i in enumerate(order) if asins[i] in goal_asins}
    unsorted_offsets = np.load(str(unsorted) + ".offsets.npy")
    with open(unsorted, "rb") as source, RecordWriter(work / "products.jsonl") as writer:
        for i in tqdm(order, desc="sorting", unit=" products", disable=not progress):
            start, end = int(unsorted_offsets[i]), int(unsorted_offsets[i + 1])
            # read, not memory-mapped: a map of the whole file would count every page in the peak RSS
            writer.append(os.pread(source.fileno(), end - start - 1, start))
    sorted_asins = [asins[i] for i in order]
    np.save(work / "asins.npy", np.array([a.encode("ascii", "replace") for a in sorted_asins], dtype="S10"))
    unsorted.unlink()
    Path(str(unsorted) + ".offsets.npy").unlink()

    # 3. search index
    with open(work / "index_text.txt", encoding="utf-8") as handle:
        build_index(asins, (line.rstrip("\n") for line in handle), work / "index", progress=progress)
    (work / "index_text.txt").unlink()

    # 4. goals
    goal_counts: dict[str, int] = {}
    for goal_set in [s for s in goal_sets if s != "synthetic" or wants_synthetic]:
        goals = GOAL_BUILDERS[goal_set](materials, prices, random.Random(ceiling_seed))
        goals = shuffle_goals(goals)
        if goal_set in pins.goals:
            _apply_pinned_goals(goals, pins.goals[goal_set], goal_set)
        if not goals:
            continue
        with RecordWriter(work / "goals" / f"{goal_set}.jsonl") as writer:
            for goal in goals:
                writer.append({**goal.to_record(), "product_index": position_of[goal.asin]})
        goal_counts[goal_set] = len(goals)

    # 5. manifest
    manifest = {
        "format_version": FORMAT_VERSION,
        "products": len(asins),
        "goal_sets": goal_counts,
        "noun_extractor": "pinned" if pins.title_nouns is not None else extractor.name,  # type: ignore[union-attr]
        "prices": "pinned" if pins.prices is not None else f"seeded:{price_seed}",
        "price_ceilings": {
            s: ("pinned" if s in pins.goals else f"seeded:{ceiling_seed}") for s in goal_counts
        },
        "num_products": num_products,
        "source": {p.name: p.stat().st_size for p in sorted(raw_dir.glob("*.json"))},
        "created_unix": int(time.time()),
    }
    manifest["fingerprint"] = _fingerprint(work, manifest)
    manifest["prepare_seconds"] = round(time.monotonic() - started, 2)
    (work / MANIFEST).write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    _replace_dir(work, out_dir)
    return manifest


def _material(product: Product) -> GoalMaterial:
    return GoalMaterial(
        asin=product.asin,
        title=product.title,
        category=product.category,
        query=product.query,
        product_category=product.product_category,
        options=product.options,
        instruction_text=product.instruction_text,
        instruction_attributes=product.instruction_attributes,
        human_instructions=product.human_instructions,
    )


def _title_nouns(batch: list[Product], pins: Pins, extractor: NounExtractor | None) -> list[list[str]]:
    if pins.title_nouns is not None:
        missing = [p.asin for p in batch if p.asin not in pins.title_nouns]
        if missing:
            raise RawDataError(f"pinned title nouns lack {len(missing)} products, e.g. {missing[:3]}")
        return [pins.title_nouns[p.asin] for p in batch]
    assert extractor is not None
    return list(extractor.nouns(p.title for p in batch))


def _point_price(product: Product, pins: Pins, rng: random.Random) -> float:
    """The price the reward uses: the listed one, or for a range a uniform draw (seeded; the original's isn't)."""
    if pins.prices is not None:
        if product.asin not in pins.prices:
            raise RawDataError(f"pinned prices lack product {product.asin}")
        return float(pins.prices[product.asin])
    if len(product.pricing) >= 2:
        return rng.uniform(product.pricing[0], product.pricing[1])
    return product.pricing[0]


def _product_record(product: Product, price: float, nouns: list[str]) -> dict[str, Any]:
    return {
        "asin": product.asin,
        "title": product.title,
        "description": product.description,
        "bullet_points": product.bullet_points,
        "price_text": product.price_text,
        "price": price,
        "options": list(product.options.items()),
        "attributes": product.attributes,
        "category": product.category,
        "query": product.query,
        "product_category": product.product_category,
        "title_nouns": nouns,
    }


def _apply_pinned_goals(goals: list[Goal], pinned: list[dict[str, Any]], goal_set: str) -> None:
    """Take the price ceilings of a reference run; the goal lists must agree goal for goal."""
    if len(pinned) != len(goals):
        raise RawDataError(f"pinned {goal_set} goals: {len(pinned)} goals, this catalog makes {len(goals)}")
    for index, (goal, reference) in enumerate(zip(goals, pinned, strict=True)):
        if reference.get("asin") != goal.asin or reference.get("goal_options") != goal.goal_options:
            raise RawDataError(
                f"pinned {goal_set} goal {index} is {reference.get('asin')} {reference.get('goal_options')}, "
                f"this catalog has {goal.asin} {goal.goal_options}: not the same raw data"
            )
        goal.set_price_upper(reference["price_upper"])


def _fingerprint(work: Path, manifest: dict[str, Any]) -> str:
    digest = hashlib.sha256()
    digest.update(orjson.dumps({k: manifest[k] for k in ("format_version", "products", "goal_sets")}))
    for path in sorted(work.rglob("*")):
        if path.is_file() and path.name != MANIFEST:
            digest.update(str(path.relative_to(work)).encode())
            with open(path, "rb") as handle:
                for chunk in iter(lambda h=handle: h.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()[:16]


def _replace_dir(work: Path, out_dir: Path) -> None:
    old = out_dir.with_name(out_dir.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out_dir.exists():
        os.replace(out_dir, old)
    os.replace(work, out_dir)
    shutil.rmtree(old, ignore_errors=True)
