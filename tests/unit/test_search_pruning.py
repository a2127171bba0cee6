"""Dynamic pruning (MaxScore) returns exactly what exhaustive scoring returns: same documents, same float32 bits.

``BM25Index.prune_min_postings = 0`` sends every multi-term query down the pruned path, so that small corpora
exercise it; each test also checks that pruning really ran (scored fewer documents than match the query).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from agent_envs.envs.webshop.catalog.generate import generate_catalog
from agent_envs.envs.webshop.catalog.raw import index_text, iter_products
from agent_envs.envs.webshop.search import bm25, kernels
from agent_envs.envs.webshop.search.bm25 import BM25Index, build_index, lookup_code_terms

VOCABULARY = [f"w{i}" for i in range(400)]


class PruneCounter:
    """Counts queries the pruned path answered after scoring fewer documents than match them."""

    def __init__(self) -> None:
        self.pruned = self.queries = 0

    def record(self, index: BM25Index, query: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        docs, scores, scored = index.rank_counting(query, k)
        _, _, matching = index.rank_counting(query, k, prune=False)
        self.queries += 1
        self.pruned += scored < matching
        return docs, scores


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


def assert_identical(index: BM25Index, query: str, k: int, counter: PruneCounter | None = None) -> None:
    if counter is None:
        pruned_docs, pruned_scores = index.rank(query, k)
    else:
        pruned_docs, pruned_scores = counter.record(index, query, k)
    docs, scores = index.rank_exhaustive(query, k)
    assert pruned_docs.tolist() == docs.tolist(), (query, k)
    assert pruned_scores.tobytes() == scores.tobytes(), (query, k)


@pytest.mark.parametrize("seed", [1, 2])
def test_pruned_equals_exhaustive_on_random_queries(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    ids, texts = zipf_corpus(rng, 4000)
    build_index(ids, texts, tmp_path / "index")
    index = BM25Index.open(tmp_path / "index")
    index.prune_min_postings = 0
    counter = PruneCounter()
    weights = [1 / (i + 1) ** 0.6 for i in range(len(VOCABULARY))]
    for _ in range(1500):
        words = rng.choices(VOCABULARY, weights, k=rng.randint(2, 16))
        if rng.random() < 0.2:
            words += rng.choices(words, k=2)  # repeated terms: boosted clauses
        if rng.random() < 0.1:
            words.append("unknownword")
        assert_identical(index, " ".join(words), rng.choice([1, 3, 10, 50, 50, 200]), counter)
    assert counter.pruned > 1000  # pruning really ruled documents out (not a disguised exhaustive scoring)


def test_pruning_keeps_ties_in_document_order(tmp_path: Path) -> None:
    # 300 identical documents tie at the top; which 50 win is decided by id alone
    ids = [f"D{i:04d}" for i in range(900)]
    texts = ["red shirt cotton" if i % 3 == 0 else "blue shirt " + "filler " * (i % 7) for i in range(900)]
    random.Random(3).shuffle(ids)
    build_index(ids, texts, tmp_path / "index")
    index = BM25Index.open(tmp_path / "index")
    index.prune_min_postings = 0
    counter = PruneCounter()
    for query in ("red shirt cotton", "red shirt", "cotton blue", "shirt red red"):
        for k in (1, 50, 299, 300, 301):
            assert_identical(index, query, k, counter)
    assert (
        index.search("red shirt cotton", 50)
        == sorted(d for d, t in zip(ids, texts, strict=True) if "red" in t)[:50]
    )
    assert counter.pruned > 0


def test_pruned_equals_exhaustive_on_a_generated_catalog(tmp_path: Path) -> None:
    """Instruction-length queries (the agents' real searches) over the bundled generator's product texts."""
    generate_catalog(tmp_path / "raw", products=3000, seed=11, progress=False)
    products = list(iter_products(tmp_path / "raw"))
    build_index([p.asin for p in products], [index_text(p) for p in products], tmp_path / "index")
    index = BM25Index.open(tmp_path / "index")
    index.prune_min_postings = 0
    counter = PruneCounter()
    queries = [p.instruction_text for p in products if p.instruction_text]
    queries += [h["instruction"] for p in products for h in p.human_instructions]
    queries += [p.title for p in products[:300]] + [p.query for p in products[:300]]
    assert len(queries) > 1000
    for i, query in enumerate(queries):
        assert_identical(index, query, 50 if i % 5 else 10, counter)
    assert counter.pruned > len(queries) // 2


def test_pruned_path_is_the_default_for_large_queries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(5)
    ids, texts = zipf_corpus(rng, 3000)
    build_index(ids, texts, tmp_path / "index")
    index = BM25Index.open(tmp_path / "index")
    monkeypatch.setattr(index, "prune_min_postings", 1000)
    common, rare = "w0 w1 w2 w3", "w390 w391"  # far more than 1000 postings, and far fewer
    _, _, scored = index.rank_counting(common, 50)
    _, _, matching = index.rank_counting(common, 50, prune=False)
    assert scored < matching
    _, _, scored = index.rank_counting(rare, 50)
    _, _, matching = index.rank_counting(rare, 50, prune=False)
    assert scored == matching > 0  # rare terms: exhaustive scoring directly


def test_bounds_are_the_largest_term_scores(tmp_path: Path) -> None:
    ids, texts = zipf_corpus(random.Random(9), 500)
    build_index(ids, texts, tmp_path / "index")
    index = BM25Index.open(tmp_path / "index")
    for term in ("w0", "w5", "w100"):
        start, end = index.offsets[index.vocab[term]], index.offsets[index.vocab[term] + 1]
        weight = index.idf[index.vocab[term]]
        scores = weight - weight / np.asarray(index.denoms[start:end])
        assert index.bound(term) == float(scores.max())
        assert index.bound(f"{term} {term}") == float(
            (2 * weight - 2 * weight / index.denoms[start:end]).max()
        )


def test_slack_covers_float64_rounding() -> None:
    # (1 + n u) / (1 - 2 n u) with u = 2^-53 and n the most clauses pruned, below the slack with room for the
    # rounding of the product itself
    n, u = kernels.MAX_CLAUSES, 2.0**-53
    assert (1 + n * u) / (1 - 2 * n * u) * (1 + 2 * u) < kernels.BOUND_SLACK


def test_a_huge_k_returns_every_hit_on_both_paths(tmp_path: Path) -> None:
    build_index(
        ["a", "b", "c", "d"], ["red shirt", "red dress", "blue shirt", "green hat"], tmp_path / "index"
    )
    index = BM25Index.open(tmp_path / "index")
    index.prune_min_postings = 0
    assert_identical(index, "red shirt", 2**40)  # sized by the postings, not by k
    assert index.search("red shirt", 2**40) == ["a", "b", "c"]


def decoded_lookup_codes(index: BM25Index, term: str) -> np.ndarray:
    """``term``'s lookup code of every document (0: not in it)."""
    packed = index._lookup_codes[index._lookup_rows[index.vocab[term]]]
    return np.stack([packed & 15, packed >> 4], axis=1).ravel()[: len(index)]


def test_lookup_codes_give_the_stored_denominators(tmp_path: Path) -> None:
    ids, texts = zipf_corpus(random.Random(4), 3000)  # documents up to 400 words: frequencies above 14 too
    build_index(ids, texts, tmp_path / "index")
    index = BM25Index.open(tmp_path / "index")
    coded = [term for term in VOCABULARY if index._lookup_rows[index.vocab[term]] >= 0]
    assert "w0" in coded and "w399" not in coded  # the densest terms, not the rare ones
    escapes = 0
    for term in coded:
        codes = decoded_lookup_codes(index, term)
        start, end = index.offsets[index.vocab[term]], index.offsets[index.vocab[term] + 1]
        docs, denoms = index.docs[start:end], index.denoms[start:end]
        assert np.count_nonzero(codes) == end - start  # a code for every document with the term, 0 elsewhere
        table = index._denominators[:, index.norms[docs]]  # [code, posting]
        direct = codes[docs] != kernels.LOOKUP_ESCAPE
        assert (table[codes[docs][direct], np.flatnonzero(direct)] == denoms[direct]).all()
        # an escape only where no frequency 1..14 gives the stored denominator
        assert not (table[1:, ~direct] == denoms[~direct]).any()
        escapes += int(np.count_nonzero(~direct))
    assert escapes > 0


@pytest.mark.parametrize("codes", ["none", "escapes only"])
def test_pruned_equals_exhaustive_whatever_the_lookup_codes(tmp_path: Path, codes: str) -> None:
    """Lookups that fall back to the postings (escapes, or terms without codes) rank the same."""
    rng = random.Random(6)
    ids, texts = zipf_corpus(rng, 3000)
    build_index(ids, texts, tmp_path / "index")
    index = BM25Index.open(tmp_path / "index")
    index.prune_min_postings = 0
    if codes == "none":
        index._lookup_rows[:] = -1
    else:
        index._lookup_codes = np.array(index._lookup_codes)  # a writable copy of the index's file
        nonzero = index._lookup_codes != 0  # every code of a present term becomes an escape
        low, high = (index._lookup_codes & 15) != 0, (index._lookup_codes >> 4) != 0
        index._lookup_codes[nonzero] = np.where(low, 15, 0)[nonzero] | np.where(high, 0xF0, 0)[nonzero]
    counter = PruneCounter()
    weights = [1 / (i + 1) ** 0.6 for i in range(len(VOCABULARY))]
    for _ in range(300):
        assert_identical(index, " ".join(rng.choices(VOCABULARY, weights, k=rng.randint(2, 12))), 50, counter)
    assert counter.pruned > 200


def test_lookup_codes_go_to_the_densest_terms_within_the_budget() -> None:
    doc_freqs = np.array([5, 1000, 40, 900, 32, 31, 0])
    # 1,000 documents: terms in >= 31.25 of them; rows of 500 bytes, 4 x 2,008 postings' bytes buy 16
    assert lookup_code_terms(doc_freqs, 1000).tolist() == [1, 2, 3, 4]
    assert lookup_code_terms(doc_freqs, 10**6).tolist() == []  # no term in 1/32 of a million documents
    # 16,000 documents: terms in >= 500 of them (0, 1, 2); 4 x 2,200 postings' bytes buy one 8,000-byte row,
    # the densest term's
    assert lookup_code_terms(np.array([600, 500, 700, 400]), 16000).tolist() == [2]


def test_an_index_without_lookup_code_files_computes_the_same_codes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids, texts = zipf_corpus(random.Random(8), 1500)
    monkeypatch.setattr(bm25, "_LOOKUP_BUILD_CHUNK", 7)  # rows written from many small pieces of postings
    build_index(ids, texts, tmp_path / "index")
    written = BM25Index.open(tmp_path / "index")
    assert len(written._lookup_codes) > 0
    for name in ("lookup_terms.npy", "lookup_codes.npy"):  # as an index built before they existed
        (tmp_path / "index" / name).unlink()
    computed = BM25Index.open(tmp_path / "index")
    assert (computed._lookup_rows == written._lookup_rows).all()
    assert np.array_equal(computed._lookup_codes, written._lookup_codes)
    computed.prune_min_postings = 0
    assert_identical(computed, "w0 w1 w2 w7 w30", 50)


@pytest.mark.parametrize("prune_min_postings", [0, bm25._PRUNE_MIN_POSTINGS])
def test_top_positions_is_a_prefix_of_the_top_50_with_its_match_count(
    tmp_path: Path, prune_min_postings: int
) -> None:
    """What a results page asks for: the hits up to its last one, and the matches counted up to 50."""
    rng = random.Random(13)
    ids, texts = zipf_corpus(rng, 2000)
    build_index(ids, texts, tmp_path / "index")
    index = BM25Index.open(tmp_path / "index")
    index.prune_min_postings = prune_min_postings
    weights = [1 / (i + 1) ** 0.6 for i in range(len(VOCABULARY))]
    # common words (pruned and countable), rare ones (few matches), and many rare ones together: pruning is
    # allowed there but cannot count to 50, so the exhaustive path must answer
    queries = [" ".join(rng.choices(VOCABULARY, weights, k=rng.randint(1, 12))) for _ in range(300)]
    queries += ["w390", "w391 w392", " ".join(VOCABULARY[300:])]
    for query in queries:
        top50 = index.search_positions(query, 50)
        _, _, matching = index.rank_counting(query, 10**6, prune=False)
        for k in (1, 10, 20, 50):
            top, matches = index.top_positions(query, k, 50)
            assert top == top50[:k], (query, k)
            assert matches == min(matching, 50) == len(top50), (query, k)
        # counted further than the longest postings list goes: only exhaustive scoring can count that far
        assert index.top_positions(query, 10, 10**6) == (top50[:10], matching)
    assert index.top_positions("", 10, 50) == ([], 0)


def test_exhaustive_scoring_tells_seen_documents_by_their_sums_only_when_scores_are_positive(
    tmp_path: Path,
) -> None:
    """The shortcut (a document's sum is 0 until scored) is taken only when the index's smallest denominator
    makes every term score positive, and gives what the ``seen`` flags give."""
    rng = random.Random(17)
    ids, texts = zipf_corpus(rng, 1500)
    build_index(ids, texts, tmp_path / "index")
    index = BM25Index.open(tmp_path / "index")
    smallest = float(np.min(index.denoms))
    assert index._scores_positive is (smallest >= kernels.SCORES_POSITIVE_ABOVE) is True
    weights = [1 / (i + 1) ** 0.6 for i in range(len(VOCABULARY))]
    queries = [" ".join(rng.choices(VOCABULARY, weights, k=rng.randint(1, 12))) for _ in range(300)]
    with_sums = [index.rank_counting(q, 50, prune=False) for q in queries]
    index._scores_positive = False
    with_flags = [index.rank_counting(q, 50, prune=False) for q in queries]
    for (docs, scores, count), (flag_docs, flag_scores, flag_count) in zip(
        with_sums, with_flags, strict=True
    ):
        assert docs.tolist() == flag_docs.tolist() and scores.tobytes() == flag_scores.tobytes()
        assert count == flag_count
    assert not index._workspace.seen.any() and not index._workspace.sums.any()  # left clean both ways
    # a term score of 0 (1 + freq * cache[norm] rounded to 1 for an enormous document) is what the guard is for
    weight = np.float32(3.0)
    assert weight - weight / np.float32(1.0 + 2.0**-25) == 0
    assert weight - weight / np.float32(kernels.SCORES_POSITIVE_ABOVE) > 0
