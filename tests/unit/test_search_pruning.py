"""Dynamic pruning (MaxScore) returns exactly what exhaustive scoring returns: same documents, same float32 bits.

``BM25Index.prune_min_postings = 0`` sends every multi-term query down the pruned path, so that small corpora
exercise it; each test also checks that pruning really ran (ruled documents out) rather than falling back.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from webshop_env.catalog.generate import generate_catalog
from webshop_env.catalog.raw import index_text, iter_products
from webshop_env.search import bm25
from webshop_env.search.bm25 import BM25Index, build_index

VOCABULARY = [f"w{i}" for i in range(400)]


class PruneCounter:
    """Counts pruned answers and fallbacks to exhaustive scoring of ``BM25Index._rank_pruned``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pruned = self.fallbacks = 0
        original = BM25Index._rank_pruned

        def counting(index: BM25Index, clauses: list, k: int):  # type: ignore[no-untyped-def]
            ranked = original(index, clauses, k)
            if ranked is None:
                self.fallbacks += 1
            else:
                self.pruned += 1
            return ranked

        monkeypatch.setattr(BM25Index, "_rank_pruned", counting)
        self.without_lead = 0
        without_lead = BM25Index._rank_without_lead

        def counting_without_lead(index: BM25Index, *args):  # type: ignore[no-untyped-def]
            self.without_lead += 1
            return without_lead(index, *args)

        monkeypatch.setattr(BM25Index, "_rank_without_lead", counting_without_lead)


def zipf_corpus(rng: random.Random, size: int) -> tuple[list[str], list[str]]:
    """Documents of Zipf-distributed words (a few very common, most rare), short and long, with stop words."""
    weights = [1 / (i + 1) for i in range(len(VOCABULARY))]
    ids = sorted({"".join(rng.choice("ABCDEFGHJK0123456789") for _ in range(6)) for _ in range(size)})
    rng.shuffle(ids)
    texts = []
    for _ in ids:
        length = rng.choice([rng.randint(0, 12), rng.randint(10, 80), rng.randint(80, 400)])
        texts.append(" ".join(rng.choices(VOCABULARY, weights, k=length) + ["the"] * rng.randint(0, 2)))
    return ids, texts


def assert_identical(index: BM25Index, query: str, k: int) -> None:
    pruned_docs, pruned_scores = index.rank(query, k)
    docs, scores = index.rank_exhaustive(query, k)
    assert pruned_docs.tolist() == docs.tolist(), (query, k)
    assert pruned_scores.tobytes() == scores.tobytes(), (query, k)


@pytest.mark.parametrize("seed", [1, 2])
def test_pruned_equals_exhaustive_on_random_queries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    rng = random.Random(seed)
    ids, texts = zipf_corpus(rng, 4000)
    build_index(ids, texts, tmp_path / "index")
    index = BM25Index.open(tmp_path / "index")
    index.prune_min_postings = 0
    counter = PruneCounter(monkeypatch)
    weights = [1 / (i + 1) ** 0.6 for i in range(len(VOCABULARY))]
    for _ in range(1500):
        words = rng.choices(VOCABULARY, weights, k=rng.randint(2, 16))
        if rng.random() < 0.2:
            words += rng.choices(words, k=2)  # repeated terms: boosted clauses
        if rng.random() < 0.1:
            words.append("unknownword")
        assert_identical(index, " ".join(words), rng.choice([1, 3, 10, 50, 50, 200]))
    assert counter.pruned > 1000  # the pruned path answered, it did not fall back to exhaustive scoring
    assert counter.without_lead > 100  # both cases: answers with and without the lead term


def test_pruning_keeps_ties_in_document_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 300 identical documents tie at the top; which 50 win is decided by id alone
    ids = [f"D{i:04d}" for i in range(900)]
    texts = ["red shirt cotton" if i % 3 == 0 else "blue shirt " + "filler " * (i % 7) for i in range(900)]
    random.Random(3).shuffle(ids)
    build_index(ids, texts, tmp_path / "index")
    index = BM25Index.open(tmp_path / "index")
    index.prune_min_postings = 0
    counter = PruneCounter(monkeypatch)
    for query in ("red shirt cotton", "red shirt", "cotton blue", "shirt red red"):
        for k in (1, 50, 299, 300, 301):
            assert_identical(index, query, k)
    assert (
        index.search("red shirt cotton", 50)
        == sorted(d for d, t in zip(ids, texts, strict=True) if "red" in t)[:50]
    )
    assert counter.pruned > 0


def test_pruned_equals_exhaustive_on_a_generated_catalog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Instruction-length queries (the agents' real searches) over the bundled generator's product texts."""
    generate_catalog(tmp_path / "raw", products=3000, seed=11, progress=False)
    products = list(iter_products(tmp_path / "raw"))
    build_index([p.asin for p in products], [index_text(p) for p in products], tmp_path / "index")
    index = BM25Index.open(tmp_path / "index")
    index.prune_min_postings = 0
    counter = PruneCounter(monkeypatch)
    queries = [p.instruction_text for p in products if p.instruction_text]
    queries += [h["instruction"] for p in products for h in p.human_instructions]
    queries += [p.title for p in products[:300]] + [p.query for p in products[:300]]
    assert len(queries) > 1000
    for i, query in enumerate(queries):
        assert_identical(index, query, 50 if i % 5 else 10)
    assert counter.pruned > len(queries) // 2


def test_pruned_path_is_the_default_for_large_queries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(5)
    ids, texts = zipf_corpus(rng, 3000)
    build_index(ids, texts, tmp_path / "index")
    index = BM25Index.open(tmp_path / "index")
    counter = PruneCounter(monkeypatch)
    monkeypatch.setattr(index, "prune_min_postings", 1000)
    assert_identical(index, "w0 w1 w2 w3", 50)  # common terms: far more than 1000 postings
    assert counter.pruned + counter.fallbacks == 1
    index.rank("w390 w391", 50)  # rare terms: exhaustive scoring directly
    assert counter.pruned + counter.fallbacks == 1


def test_bounds_are_the_largest_term_scores(tmp_path: Path) -> None:
    ids, texts = zipf_corpus(random.Random(9), 500)
    build_index(ids, texts, tmp_path / "index")
    index = BM25Index.open(tmp_path / "index")
    for term in ("w0", "w5", "w100"):
        clause = index._clauses(term)[0]
        start, end, weight = clause
        scores = weight - weight / np.asarray(index.denoms[start:end])
        assert index._bound(clause) == float(scores.max())


def test_slack_covers_float64_rounding() -> None:
    # (1 + n u) / (1 - 2 n u) with u = 2^-53 and n the most clauses pruned, below the slack with room for the
    # rounding of the product itself
    n, u = bm25._MAX_PRUNED_CLAUSES, 2.0**-53
    assert (1 + n * u) / (1 - 2 * n * u) * (1 + 2 * u) < bm25._BOUND_SLACK
