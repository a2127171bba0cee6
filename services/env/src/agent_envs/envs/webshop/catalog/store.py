"""The prepared catalog: one read-only directory that replicas open in seconds and share via the page cache.

Layout (``FORMAT_VERSION`` 1)::

    manifest.json              counts, fingerprint, noun extractor, seeds, sources
    products.jsonl             one JSON record per product, sorted by ASIN (the search index's doc order)
    products.offsets.npy       int64 byte offsets into products.jsonl (n + 1 entries)
    asins.npy                  sorted fixed-width ASINs, for binary-search lookups
    goals/<set>.jsonl          goal records in the original's (shuffled) order
    goals/<set>.offsets.npy
    index/                     the BM25 index (``..search.bm25``)

Everything is memory-mapped; records are decoded on demand and kept in small LRU caches.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ..core.model import GoalRecord, ProductRecord, Ranking
from ..search.bm25 import BM25Index

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


class CatalogError(RuntimeError):
    """The prepared catalog is missing, incomplete or of another format; the message says how to fix it."""


class RecordStore:
    """JSON records in one file, addressed by position through an offsets array."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offsets = np.load(str(path) + ".offsets.npy", mmap_mode="r")
        size = path.stat().st_size
        self._data = np.memmap(path, dtype=np.uint8, mode="r") if size else np.zeros(0, dtype=np.uint8)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def get(self, index: int) -> dict[str, Any]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        start, end = int(self._offsets[index]), int(self._offsets[index + 1])
        return orjson.loads(self._data[start:end].tobytes())

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for index in range(len(self)):
            yield self.get(index)


class RecordWriter:
    """Appends JSON records and writes the offsets array on close."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = open(path, "wb")  # noqa: SIM115 - closed in close()
        self._offsets = [0]

    def append(self, record: dict[str, Any] | bytes) -> None:
        data = record if isinstance(record, bytes) else orjson.dumps(record)
        self._handle.write(data + b"\n")
        self._offsets.append(self._offsets[-1] + len(data) + 1)

    def close(self) -> int:
        self._handle.close()
        np.save(str(self.path) + ".offsets.npy", np.asarray(self._offsets, dtype=np.int64))
        return len(self._offsets) - 1

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PreparedCatalog:
    """Opens a prepared catalog directory (see the module docstring). Implements ``core.model.Catalog``."""

    def __init__(self, root: Path, product_cache: int = 8192) -> None:
        self.root = Path(root)
        manifest_path = self.root / MANIFEST
        if not manifest_path.exists():
            raise CatalogError(
                f"{self.root} is not a prepared catalog (no {MANIFEST}); build one with "
                "`agent-envs catalog prepare --raw RAW_DIR --out DIR` or `make data`"
            )
        self.manifest: dict[str, Any] = orjson.loads(manifest_path.read_bytes())
        if self.manifest.get("format_version") != FORMAT_VERSION:
            raise CatalogError(
                f"{self.root} has catalog format {self.manifest.get('format_version')}, this version reads "
                f"{FORMAT_VERSION}: prepare it again"
            )
        self.fingerprint: str = self.manifest["fingerprint"]
        self._products = RecordStore(self.root / "products.jsonl")
        self._asins = np.load(self.root / "asins.npy", mmap_mode="r")
        self._goals = {
            name: RecordStore(self.root / "goals" / f"{name}.jsonl") for name in self.manifest["goal_sets"]
        }
        self.index = BM25Index.open(self.root / "index")
        self.product = lru_cache(maxsize=product_cache)(self._load_product)  # type: ignore[method-assign]
        self._goal_cached = lru_cache(maxsize=product_cache)(self._load_goal)

    # --- Catalog protocol -----------------------------------------------------------------------------------
    def product(self, index: int) -> ProductRecord:  # replaced by a cached bound function in __init__
        return self._load_product(index)

    def _load_product(self, index: int) -> ProductRecord:
        return ProductRecord.from_record(index, self._products.get(index))

    def product_index(self, asin: str) -> int | None:
        key = asin.encode("ascii", "replace")
        position = int(np.searchsorted(self._asins, key))
        if position < len(self._asins) and self._asins[position] == key:
            return position
        return None

    def search(self, query: str, k: int, count_up_to: int) -> Ranking:
        """Not cached here: the simulator caches the pages it builds from a search (``WebShopEnv``)."""
        return Ranking(*self.index.top_positions(query, k, count_up_to))

    def goal(self, goal_set: str, index: int) -> GoalRecord:
        return self._goal_cached(goal_set, index)

    def _load_goal(self, goal_set: str, index: int) -> GoalRecord:
        return GoalRecord.from_record(index, goal_set, self._goal_store(goal_set).get(index))

    def goal_count(self, goal_set: str) -> int:
        return len(self._goal_store(goal_set))

    # --- extras -----------------------------------------------------------------------------------------------
    @property
    def goal_sets(self) -> list[str]:
        return list(self._goals)

    @property
    def product_count(self) -> int:
        return len(self._products)

    def _goal_store(self, goal_set: str) -> RecordStore:
        store = self._goals.get(goal_set)
        if store is None:
            from ..core.env import UnknownGoal

            raise UnknownGoal(
                f"this catalog has no {goal_set!r} goals; it has: {', '.join(self._goals) or 'none'}"
            )
        return store


def open_catalog(root: Path | str) -> PreparedCatalog:
    return PreparedCatalog(Path(root))
