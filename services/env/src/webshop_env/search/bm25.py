"""A BM25 index that ranks exactly as the original's pyserini 0.17 ``LuceneSearcher`` (Lucene 8) does.

Scoring copies Lucene 8's ``BM25Similarity`` (k1=0.9, b=0.4) operation for operation in float32:

* idf = float32(ln(1 + (docCount - df + 0.5) / (df + 0.5))), computed in double;
* a query term occurring c times is one clause boosted by c (Anserini's bag-of-words query): weight = c * idf;
* document lengths (tokens after stop-word removal) are stored in one byte (``SmallFloat.intToByte4``), so long
  documents share lengths; cache[norm] = 1 / (k1 * ((1 - b) + b * length(norm) / avgdl));
* term score = weight - weight / (1 + freq * cache[norm]); a document's score is the double sum of its
  clauses' scores cast to float32;
* hits sort by score, then by document id (Anserini breaks ties on the ``id`` field), top 50.

Documents are numbered in ascending id order, so the tie-break is "lower number first". Each posting stores its
document number and the float32 denominator ``1 + freq * cache[norm]``, so a search is one vectorised
``weight - weight / denominator`` per query term and a scatter-add.

Files of an index directory (arrays are memory-mapped on open):
  meta.json            format version, parameters, collection statistics
  vocab.txt            the terms, one per line; line i is term i
  term_offsets.npy     int64[V+1]: term i's postings are [offsets[i], offsets[i+1])
  postings_docs.npy    int32[P]: document numbers
  postings_denoms.npy  float32[P]: 1 + freq * cache[norm(doc)]
  idf.npy              float32[V]
  norms.npy            uint8[N]: the encoded document lengths
  doc_ids.npy          bytes[N]: document ids (UTF-8) in ascending order
"""

from __future__ import annotations

import json
import tempfile
import threading
from collections.abc import Iterable
from functools import lru_cache
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from .analyzer import normalize_token, tokenize

__all__ = [
    "K1",
    "B",
    "BM25Index",
    "bm25_cache",
    "build_index",
    "byte4_to_int",
    "int4_to_long",
    "int_to_byte4",
    "long_to_int4",
    "norm_bytes",
]

FORMAT_VERSION = 1
K1 = 0.9  # pyserini's LuceneSearcher defaults
B = 0.4
DEFAULT_TOP_K = 50

_CHUNK_DOCS = 8192  # documents per batch while building
_TOKEN_CACHE_LIMIT = 4_000_000  # raw token -> term id entries kept while building
_SORT_POSTINGS_MIN_DF = 64  # postings lists at least this long are sorted by document (memory locality)
_DENSE_RATIO = 8  # a multi-term query sums over all documents once its postings reach 1/8 of them
_PRUNE_MIN_POSTINGS = 400_000  # fewer postings: exhaustive scoring (a few ms at most) is faster (measured)
_THRESHOLD_PER_K = 4  # documents scored exactly (per result wanted) to find the entry threshold theta
_DENSE_LOOKUP_RATIO = 4  # a lookup spreads the postings when they are at most this many per document wanted
_THRESHOLD_EVERY = 3  # theta is raised after every this many clauses looked up for the lead's documents
_MAX_PRUNED_CLAUSES = 1 << 16  # the slack below covers float64 rounding of sums of up to this many terms
_BOUND_SLACK = 1.0 + 2.0**-28  # > (1 + n 2^-53) / (1 - 2n 2^-53) for n <= 2^16, plus the product's rounding


# Query tokens repeat across searches (instructions share most words): their analysis (Porter stemming in
# Python) is cached. normalize_token is a pure function of the token.
_query_term = lru_cache(maxsize=1 << 16)(normalize_token)


# --- Lucene's SmallFloat (document length in one byte) --------------------------------------------------------
def long_to_int4(value: int) -> int:
    """SmallFloat.longToInt4: keep the 4 most significant bits of ``value`` (a float with a 3-bit mantissa)."""
    if value < 0:
        raise ValueError("only non-negative values can be encoded")
    bits = value.bit_length()
    if bits < 4:
        return value  # subnormal
    shift = bits - 4
    encoded = (value >> shift) & 0x07  # the leading 1 is implicit
    return encoded | ((shift + 1) << 3)


def int4_to_long(encoded: int) -> int:
    """SmallFloat.int4ToLong: the inverse of ``long_to_int4`` (the low bits that were dropped read as 0)."""
    bits = encoded & 0x07
    shift = (encoded >> 3) - 1
    return bits if shift == -1 else (bits | 0x08) << shift


NUM_FREE_VALUES = 255 - long_to_int4(2**31 - 1)  # = 24: lengths below this are stored exactly


def int_to_byte4(value: int) -> int:
    """SmallFloat.intToByte4 as an unsigned byte: exact below 24, 4 significant bits above."""
    if value < 0:
        raise ValueError("only non-negative values can be encoded")
    if value < NUM_FREE_VALUES:
        return value
    return NUM_FREE_VALUES + long_to_int4(value - NUM_FREE_VALUES)


def byte4_to_int(encoded: int) -> int:
    """SmallFloat.byte4ToInt for an unsigned byte."""
    if encoded < NUM_FREE_VALUES:
        return encoded
    return NUM_FREE_VALUES + int4_to_long(encoded - NUM_FREE_VALUES)


# BM25Similarity.LENGTH_TABLE: the document length each norm byte stands for.
LENGTH_TABLE = np.array([byte4_to_int(i) for i in range(256)], dtype=np.float32)
_DECODED_LENGTHS = np.array([byte4_to_int(i) for i in range(256)], dtype=np.int64)


def norm_bytes(lengths: np.ndarray) -> np.ndarray:
    """``int_to_byte4`` over an array: the largest byte whose decoded length does not exceed each length."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return (np.searchsorted(_DECODED_LENGTHS, lengths, side="right") - 1).astype(np.uint8)


def bm25_cache(avgdl: np.float32, k1: float = K1, b: float = B) -> np.ndarray:
    """Lucene 8's per-norm cache, 1 / (k1 * ((1 - b) + b * dl / avgdl)), every operation in float32."""
    k1_, b_, avgdl_ = np.float32(k1), np.float32(b), np.float32(avgdl)
    return np.float32(1) / (k1_ * ((np.float32(1) - b_) + b_ * LENGTH_TABLE / avgdl_))


def idf_values(doc_freqs: np.ndarray, doc_count: int) -> np.ndarray:
    """BM25Similarity.idf: (float) Math.log(1 + (docCount - df + 0.5) / (df + 0.5))."""
    df = np.asarray(doc_freqs, dtype=np.float64)
    return np.log(1.0 + (doc_count - df + 0.5) / (df + 0.5)).astype(np.float32)


# --- building -------------------------------------------------------------------------------------------------
class _TermIds(dict):  # type: ignore[type-arg]
    """Raw token -> term id (-1 for a stop word); a miss runs the analysis chain and extends the vocabulary.

    Being a dict subclass with ``__missing__``, ``map(ids.__getitem__, tokens)`` runs in C for known tokens.
    """

    def __init__(self, vocab: dict[str, int]) -> None:
        super().__init__()
        self.vocab = vocab

    def __missing__(self, token: str) -> int:
        term = normalize_token(token)
        if term is None:
            term_id = -1
        else:
            term_id = self.vocab.get(term, -1)
            if term_id < 0:
                term_id = self.vocab[term] = len(self.vocab)
        if len(self) >= _TOKEN_CACHE_LIMIT:
            self.clear()
        self[token] = term_id
        return term_id


class _Builder:
    """Tokenises documents in batches and spills each batch's (term, doc, freq) postings to a scratch file."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.vocab: dict[str, int] = {}
        self.term_ids = _TermIds(self.vocab)
        self.doc_ids: list[str] = []
        self.lengths: list[np.ndarray] = []
        self.doc_freqs = np.zeros(0, dtype=np.int64)
        self.chunks: list[Path] = []
        self._terms: list[int] = []
        self._counts: list[int] = []

    def add(self, doc_id: str, text: str) -> None:
        tokens = tokenize(text)
        self._terms.extend(map(self.term_ids.__getitem__, tokens))
        self._counts.append(len(tokens))
        self.doc_ids.append(doc_id)
        if len(self._counts) >= _CHUNK_DOCS:
            self.flush()

    def flush(self) -> None:
        if not self._counts:
            return
        first = len(self.doc_ids) - len(self._counts)
        terms = np.array(self._terms, dtype=np.int64)
        docs = np.repeat(np.arange(first, len(self.doc_ids), dtype=np.int64), self._counts)
        kept = terms >= 0  # stop words leave no term and do not count in the length
        terms, docs = terms[kept], docs[kept]
        self.lengths.append(np.bincount(docs - first, minlength=len(self._counts)).astype(np.int64))
        pairs, freqs = np.unique((docs << 32) | terms, return_counts=True)
        chunk_terms = (pairs & 0xFFFFFFFF).astype(np.int32)
        chunk = np.stack([chunk_terms, (pairs >> 32).astype(np.int32), freqs.astype(np.int32)])
        path = self.scratch / f"chunk{len(self.chunks):06d}.npy"
        np.save(path, chunk)
        self.chunks.append(path)
        counts = np.bincount(chunk_terms, minlength=len(self.vocab))
        counts[: len(self.doc_freqs)] += self.doc_freqs
        self.doc_freqs = counts
        self._terms, self._counts = [], []


def build_index(
    doc_ids: Iterable[str],
    texts: Iterable[str],
    out_dir: Path,
    progress: bool = False,
    *,
    k1: float = K1,
    b: float = B,
) -> None:
    """Analyse ``texts`` (one per id in ``doc_ids``, same order) and write a BM25 index to ``out_dir``.

    Memory stays at a batch of documents plus the vocabulary: each batch's postings go to a scratch file, and a
    second pass places them term by term straight into the memory-mapped output arrays.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "meta.json").unlink(missing_ok=True)  # written last: an index without it is incomplete
    total = len(doc_ids) if hasattr(doc_ids, "__len__") else None
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".build-") as scratch:
        builder = _Builder(Path(scratch))
        for doc_id, text in tqdm(
            zip(doc_ids, texts, strict=True), total=total, desc="index", unit=" docs", disable=not progress
        ):
            builder.add(doc_id, text)
        builder.flush()
        _write_index(builder, out_dir, progress, k1, b)


def _write_index(builder: _Builder, out_dir: Path, progress: bool, k1: float, b: float) -> None:
    ids = builder.doc_ids
    num_docs = len(ids)
    order = sorted(range(num_docs), key=ids.__getitem__)
    sorted_ids = [ids[i] for i in order]
    for previous, current in pairwise(sorted_ids):
        if previous == current:
            raise ValueError(f"duplicate document id {current!r}")
    number = np.empty(num_docs, dtype=np.int32)  # input position -> document number (ascending id order)
    number[np.array(order, dtype=np.int64)] = np.arange(num_docs, dtype=np.int32)

    lengths = np.concatenate(builder.lengths) if builder.lengths else np.zeros(0, dtype=np.int64)
    norms = norm_bytes(lengths)  # input order
    doc_count = int(np.count_nonzero(lengths))  # docs that have the field, as Lucene counts them
    sum_total_term_freq = int(lengths.sum())
    avgdl = np.float32(sum_total_term_freq / doc_count) if doc_count else np.float32(1)
    cache = bm25_cache(avgdl, k1, b)

    doc_freqs = builder.doc_freqs
    num_terms = len(builder.vocab)
    offsets = np.zeros(num_terms + 1, dtype=np.int64)
    np.cumsum(doc_freqs, out=offsets[1:])
    num_postings = int(offsets[-1])

    docs_out = np.lib.format.open_memmap(out_dir / "postings_docs.npy", "w+", np.int32, (num_postings,))
    denoms_out = np.lib.format.open_memmap(out_dir / "postings_denoms.npy", "w+", np.float32, (num_postings,))
    cursor = offsets[:-1].copy()
    for path in tqdm(builder.chunks, desc="postings", unit=" batches", disable=not progress):
        terms, docs, freqs = np.load(path)
        by_term = np.argsort(terms, kind="stable")
        terms, docs, freqs = terms[by_term], docs[by_term], freqs[by_term]
        unique_terms, starts, counts = np.unique(terms, return_index=True, return_counts=True)
        slots = cursor[terms] + (np.arange(len(terms)) - np.repeat(starts, counts))
        cursor[unique_terms] += counts
        docs_out[slots] = number[docs]
        denoms_out[slots] = np.float32(1) + freqs.astype(np.float32) * cache[norms[docs]]
        path.unlink()
    for term in np.flatnonzero(doc_freqs >= _SORT_POSTINGS_MIN_DF):
        start, end = offsets[term], offsets[term + 1]
        by_doc = np.argsort(docs_out[start:end])
        docs_out[start:end] = docs_out[start:end][by_doc]
        denoms_out[start:end] = denoms_out[start:end][by_doc]
    docs_out.flush()
    denoms_out.flush()
    del docs_out, denoms_out

    np.save(out_dir / "term_offsets.npy", offsets)
    np.save(out_dir / "idf.npy", idf_values(doc_freqs, doc_count))
    np.save(out_dir / "norms.npy", norms[np.array(order, dtype=np.int64)])
    encoded = [doc_id.encode("utf-8") for doc_id in sorted_ids]
    width = max((len(e) for e in encoded), default=1) or 1
    np.save(out_dir / "doc_ids.npy", np.array(encoded, dtype=f"S{width}"))
    terms_by_id = list(builder.vocab)  # dicts keep insertion order = term id order
    if any("\n" in term for term in terms_by_id):
        raise ValueError("a term contains a newline")  # the tokenizer never produces one
    (out_dir / "vocab.txt").write_text("\n".join(terms_by_id), encoding="utf-8")
    meta = {
        "format_version": FORMAT_VERSION,
        "similarity": "Lucene 8 BM25Similarity",
        "analyzer": "Anserini DefaultEnglishAnalyzer (porter)",
        "k1": k1,
        "b": b,
        "num_docs": num_docs,
        "doc_count": doc_count,
        "sum_total_term_freq": sum_total_term_freq,
        "avgdl": float(avgdl),
        "num_terms": num_terms,
        "num_postings": num_postings,
    }
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")


# --- searching ------------------------------------------------------------------------------------------------
class _Workspace(threading.local):
    """Per-thread work arrays, reused across searches.

    Fresh arrays of 100k+ elements cost page faults on every search (about 5x the arithmetic), so the hot path
    writes into these instead. ``sums`` is all zeros between searches.
    """

    def __init__(self, num_docs: int) -> None:
        self.num_docs = num_docs
        self.arrays: dict[str, np.ndarray] = {}

    def get(self, name: str, size: int, dtype: Any) -> np.ndarray:
        """A view of ``size`` elements of the named array (contents undefined), grown when too small."""
        array = self.arrays.get(name)
        if array is None or len(array) < size:
            array = self.arrays[name] = np.empty(
                max(size, int(len(array) * 1.5) if array is not None else 0), dtype
            )
        return array[:size]

    @property
    def dense32(self) -> np.ndarray:
        """A float32 per document, all zeros between uses."""
        array = self.arrays.get("dense32")
        if array is None:
            array = self.arrays["dense32"] = np.zeros(self.num_docs, dtype=np.float32)
        return array

    @property
    def sums(self) -> np.ndarray:
        array = self.arrays.get("sums")
        if array is None:
            array = self.arrays["sums"] = np.zeros(self.num_docs, dtype=np.float64)
        return array


class BM25Index:
    """A memory-mapped index written by ``build_index``; ``search`` returns document ids in rank order."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        meta_path = self.directory / "meta.json"
        if not meta_path.exists():
            raise FileNotFoundError(f"{self.directory} holds no search index (no meta.json)")
        self.meta: dict[str, Any] = json.loads(meta_path.read_text(encoding="utf-8"))
        if self.meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{self.directory}: index format {self.meta.get('format_version')}, expected {FORMAT_VERSION}"
            )
        self.num_docs: int = self.meta["num_docs"]
        self.offsets = self._load("term_offsets.npy")
        self.docs = self._load("postings_docs.npy")
        self.denoms = self._load("postings_denoms.npy")
        self.idf = self._load("idf.npy")
        self.norms = self._load("norms.npy")
        self.doc_ids = self._load("doc_ids.npy")
        text = (self.directory / "vocab.txt").read_text(encoding="utf-8")
        terms = text.split("\n") if self.meta["num_terms"] else []
        self.vocab: dict[str, int] = dict(zip(terms, range(len(terms)), strict=True))
        self._workspace = _Workspace(self.num_docs)
        # Queries with at least this many postings take the pruned path (tests set 0 to force it everywhere).
        self.prune_min_postings = _PRUNE_MIN_POSTINGS
        self._max_denoms: dict[int, np.float32] = {}  # postings start -> the term's largest denominator

    @classmethod
    def open(cls, directory: Path) -> BM25Index:
        return cls(directory)

    def _load(self, name: str) -> np.ndarray:
        # a plain ndarray view of the memory map: slicing an np.memmap costs microseconds per slice (its
        # __array_finalize__), and a search slices every query term's postings several times
        return np.load(self.directory / name, mmap_mode="r").view(np.ndarray)

    def __len__(self) -> int:
        return self.num_docs

    def doc_id(self, position: int) -> str:
        return bytes(self.doc_ids[position]).decode("utf-8")

    def search(self, query: str, k: int = DEFAULT_TOP_K) -> list[str]:
        """The ids of the top ``k`` documents for ``query``, best first."""
        positions, _ = self.rank(query, k)
        return [bytes(raw).decode("utf-8") for raw in self.doc_ids[positions]]

    def search_positions(self, query: str, k: int = DEFAULT_TOP_K) -> list[int]:
        """Like ``search`` but document numbers (positions in ascending id order)."""
        positions, _ = self.rank(query, k)
        return positions.tolist()

    def rank(self, query: str, k: int = DEFAULT_TOP_K) -> tuple[np.ndarray, np.ndarray]:
        """Document numbers and float32 scores of the top ``k`` hits for ``query``.

        Large queries take the pruned path (``_rank_pruned``), which returns exactly what exhaustive scoring
        (``rank_exhaustive``) returns, only faster.
        """
        clauses = self._clauses(query)
        if not clauses or k <= 0:
            return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)
        if len(clauses) >= 2 and sum(end - start for start, end, _ in clauses) >= self.prune_min_postings:
            ranked = self._rank_pruned(clauses, k)
            if ranked is not None:
                return ranked
        return self._rank_clauses(clauses, k)

    def rank_exhaustive(self, query: str, k: int = DEFAULT_TOP_K) -> tuple[np.ndarray, np.ndarray]:
        """``rank`` scoring every posting of every query term (the reference the pruned path must equal)."""
        clauses = self._clauses(query)
        if not clauses or k <= 0:
            return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)
        return self._rank_clauses(clauses, k)

    def _rank_clauses(
        self, clauses: list[tuple[int, int, np.float32]], k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Exhaustive scoring: every posting of every clause is scored and summed."""
        workspace = self._workspace
        if len(clauses) == 1:
            start, end, weight = clauses[0]
            scores = _term_scores(
                weight, self.denoms[start:end], workspace.get("scores32", end - start, np.float32)
            )
            return _top_k(np.asarray(self.docs[start:end]), scores, k)
        try:
            every = self._accumulate(clauses, workspace)
            if len(every) * _DENSE_RATIO >= self.num_docs:
                return self._dense_top_k(workspace, k)
            return self._sparse_top_k(every, workspace, k)
        except BaseException:
            workspace.sums.fill(0.0)  # leave no partial sums behind for the next search
            raise

    def _clauses(self, query: str) -> list[tuple[int, int, np.float32]]:
        """(postings start, end, weight) per distinct query term in the index; c occurrences boost it by c."""
        counts: dict[str, int] = {}
        for token in tokenize(query):
            term = _query_term(token)
            if term is not None:
                counts[term] = counts.get(term, 0) + 1
        found = [
            (term_id, count)
            for term, count in counts.items()
            if (term_id := self.vocab.get(term)) is not None
        ]
        if not found:
            return []
        # one vector operation each instead of numpy scalar arithmetic per term (same float32 products)
        ids = np.fromiter((term_id for term_id, _ in found), np.intp, len(found))
        weights = np.fromiter((count for _, count in found), np.float32, len(found)) * self.idf[ids]
        return list(zip(self.offsets[ids].tolist(), self.offsets[ids + 1].tolist(), weights, strict=True))

    # --- dynamic pruning (MaxScore) ---------------------------------------------------------------------------
    #
    # Exactness. A clause's term score w - w/d is computed in float32 and is non-decreasing in the denominator d
    # (IEEE division and subtraction round monotonically), so the score at the term's largest denominator is the
    # largest float32 score the clause can give any document: its bound. A document's score is the float64
    # sum, in clause order, of its clauses' float32 scores, cast to float32. Any other order of that sum, with
    # bounds standing in for some scores, differs from the exact real sum by a relative 2^-53 per addition;
    # multiplied by ``_BOUND_SLACK`` it is an upper bound of the document's float64 sum. A document is dropped
    # only when that bound is <= the float32 just below ``theta``, where theta is the exact score of the k-th
    # best of some k documents already scored exactly: its float32 score is then < theta, so at least k
    # documents rank above it. Candidates that survive are scored exactly (every clause, in clause order), and
    # ties break by document number, as in the exhaustive path.

    def _bound(self, clause: tuple[int, int, np.float32]) -> float:
        """The largest float32 score ``clause`` gives any document (its term score at the largest denominator)."""
        start, end, weight = clause
        largest = self._max_denoms.get(start)
        if largest is None:
            largest = self._max_denoms[start] = np.float32(np.max(self.denoms[start:end]))
        return float(_term_scores(weight, np.array([largest], np.float32), np.empty(1, np.float32))[0])

    def _find(self, clause: tuple[int, int, np.float32], docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For the sorted document numbers ``docs``: which have the clause's term, and their postings' slots."""
        start, end, _ = clause
        postings = np.asarray(self.docs[start:end])
        order = None
        if end - start < _SORT_POSTINGS_MIN_DF:  # short lists are stored unsorted
            order = np.argsort(postings, kind="stable")
            postings = postings[order]
        # needles of the postings' own dtype: otherwise numpy converts the whole postings list on every call
        slots = np.searchsorted(postings, docs.astype(postings.dtype, copy=False))
        np.minimum(slots, len(postings) - 1, out=slots)
        found = postings[slots] == docs
        slots = slots[found]
        if order is not None:
            slots = order[slots]
        return found, slots

    def _contains(self, clause: tuple[int, int, np.float32], docs: np.ndarray) -> np.ndarray:
        """Which of the sorted documents ``docs`` have the clause's term."""
        return self._find(clause, docs)[0]

    def _clause_scores(self, clause: tuple[int, int, np.float32], docs: np.ndarray) -> np.ndarray:
        """float32 scores of ``clause`` for the sorted document numbers ``docs`` (0 where the term is absent).

        Few documents against a long postings list: binary searches. Otherwise it is cheaper to spread the
        term's scores over a dense per-document array, read the documents' entries and clear it again.
        """
        start, end, weight = clause
        if end - start <= _DENSE_LOOKUP_RATIO * len(docs):
            dense = self._workspace.dense32
            postings = np.asarray(self.docs[start:end])
            try:
                dense[postings] = _term_scores(
                    weight, self.denoms[start:end], self._workspace.get("scores32", end - start, np.float32)
                )
                return dense[docs]
            finally:
                dense[postings] = 0.0
        found, slots = self._find(clause, docs)
        scores = np.zeros(len(docs), np.float32)
        if len(slots):
            denoms = np.asarray(self.denoms[clause[0] : clause[1]])[slots]
            scores[found] = _term_scores(clause[2], denoms, np.empty(len(slots), np.float32))
        return scores

    def _exact_scores(self, clauses: list[tuple[int, int, np.float32]], docs: np.ndarray) -> np.ndarray:
        """float32 scores of the sorted documents ``docs``, summed in float64 in clause order (as exhaustive)."""
        sums = np.zeros(len(docs), np.float64)
        for clause in clauses:
            sums += self._clause_scores(clause, docs)  # adding 0.0 for an absent term changes nothing
        return sums.astype(np.float32)

    def _threshold(
        self, clauses: list[tuple[int, int, np.float32]], touched: np.ndarray, partial: np.ndarray, k: int
    ) -> float:
        """theta: the k-th best exact score among the documents with the best partial sums (-inf: too few)."""
        pick = min(len(touched), _THRESHOLD_PER_K * k)
        if pick < k:
            return -np.inf
        best = touched[np.argpartition(partial, len(partial) - pick)[len(partial) - pick :]]
        docs = np.unique(best)
        if len(docs) < k:
            return -np.inf
        scores = self._exact_scores(clauses, docs)
        theta = np.partition(scores, len(scores) - k)[len(scores) - k]
        return float(theta) if theta > 0 else -np.inf

    def _rank_pruned(
        self, clauses: list[tuple[int, int, np.float32]], k: int
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Score exactly only documents that can still reach the top ``k``; None: no pruning was possible.

        Clauses are taken in decreasing order of their bounds (rare terms first). First the documents of the
        lead clause: each further clause is looked up for those still in the race (their partial sum plus the
        bounds of the clauses not yet looked up can reach theta), theta rising as the best of them are scored
        exactly. When the other clauses' bounds sum to no more than theta, every top-k document contains the
        lead term (the usual case for an instruction: the k-th best matches nearly every term) and the answer
        is among them. Otherwise MaxScore over the other clauses finds the documents without the lead term
        that can still make it (``_rank_without_lead``).
        """
        count = len(clauses)
        if count > _MAX_PRUNED_CLAUSES:
            return None
        bounds = np.array([self._bound(clause) for clause in clauses], np.float64)
        by_bound = np.argsort(-bounds, kind="stable")
        rest = np.zeros(count + 1, np.float64)  # rest[j]: sum of the bounds of by_bound[j:]
        for j in range(count - 1, -1, -1):
            rest[j] = rest[j + 1] + bounds[by_bound[j]]

        lead = clauses[by_bound[0]]
        candidates, denoms = self._sorted_postings(lead)
        partial = _term_scores(lead[2], denoms, np.empty(len(denoms), np.float32)).astype(np.float64)
        theta = -np.inf
        for covered in range(1, count + 1):
            if covered % _THRESHOLD_EVERY == 0 or covered == count:
                theta = max(theta, self._threshold(clauses, candidates, partial, k))
            keep = (partial + rest[covered]) * _BOUND_SLACK > _below(theta)
            candidates, partial = candidates[keep], partial[keep]
            if covered == count or len(candidates) <= _THRESHOLD_PER_K * k:
                break
            partial += self._clause_scores(clauses[by_bound[covered]], candidates)
        scores = self._exact_scores(clauses, candidates)
        if len(scores) >= k:
            theta = max(theta, float(np.partition(scores, len(scores) - k)[len(scores) - k]))
        if theta == -np.inf or theta <= 0:
            return None  # fewer than k documents with the lead term: nothing can be ruled out cheaply
        if not _prunes(rest[1], theta):  # a document without the lead term may still make the top k
            others = self._rank_without_lead(clauses, k, by_bound, rest, theta)
            candidates = np.concatenate([candidates, others])
            scores = np.concatenate([scores, self._exact_scores(clauses, others)])
        return _top_k(candidates, scores, k)

    def _sorted_postings(self, clause: tuple[int, int, np.float32]) -> tuple[np.ndarray, np.ndarray]:
        """A clause's (documents, denominators), in document order."""
        start, end, _ = clause
        docs, denoms = np.asarray(self.docs[start:end]), np.asarray(self.denoms[start:end])
        if end - start < _SORT_POSTINGS_MIN_DF:  # short lists are stored unsorted
            order = np.argsort(docs, kind="stable")
            docs, denoms = docs[order], denoms[order]
        return docs, denoms

    def _rank_without_lead(
        self,
        clauses: list[tuple[int, int, np.float32]],
        k: int,
        by_bound: np.ndarray,
        rest: np.ndarray,
        theta: float,
    ) -> np.ndarray:
        """Sorted documents without the lead term that can still reach theta (MaxScore over the others).

        The next clauses by bound ("essential") are scored over their whole postings until the bounds of
        the ones after them sum to no more than theta: a document none of them matches cannot reach it.
        """
        count = len(clauses)
        workspace = self._workspace
        sums = workspace.sums
        parts: list[np.ndarray] = []
        essential = 1
        try:
            while essential < count and not _prunes(rest[essential], theta):
                start, end, weight = clauses[by_bound[essential]]
                docs = np.asarray(self.docs[start:end]).astype(np.intp)
                scores = _term_scores(
                    weight, self.denoms[start:end], workspace.get("scores32", end - start, np.float32)
                )
                np.add.at(sums, docs, scores.astype(np.float64))
                parts.append(docs)
                essential += 1
            if not parts:
                return np.zeros(0, np.int32)
            touched = np.concatenate(parts) if len(parts) > 1 else parts[0]
            owner = workspace.get("owner", self.num_docs, np.intp)  # one entry per touched document
            entry = np.arange(len(touched))
            owner[touched] = entry
            candidates = np.sort(touched[owner[touched] == entry]).astype(self.docs.dtype)
            partial = sums[candidates]
        finally:
            for docs in parts:
                sums[docs] = 0.0
        without = ~self._contains(clauses[by_bound[0]], candidates)
        candidates, partial = candidates[without], partial[without]
        below = _below(theta)
        for j in range(essential, count + 1):
            keep = (partial + rest[j]) * _BOUND_SLACK > below
            candidates, partial = candidates[keep], partial[keep]
            if j == count or len(candidates) <= _THRESHOLD_PER_K * k:
                break
            partial += self._clause_scores(clauses[by_bound[j]], candidates)
        return candidates

    def _accumulate(self, clauses: list[tuple[int, int, np.float32]], workspace: _Workspace) -> np.ndarray:
        """Add every clause's scores into ``workspace.sums``; returns all postings' documents (as intp).

        Each document's clause scores are added in float64 in clause order, as Lucene's BooleanScorer does.
        All clauses go in one pass (an instruction-length query has ~15 terms, and numpy's per-call cost
        outweighed the arithmetic on small catalogs): the postings laid end to end in clause order, each
        with its clause's weight, scored elementwise by the same float32 operations, then one ``add.at``,
        which adds in input order, so each document still receives its clause scores in clause order.
        """
        sums = workspace.sums
        lengths = [end - start for start, end, _ in clauses]
        total = sum(lengths)
        every = workspace.get("docs", total, np.intp)
        denoms = workspace.get("denoms", total, np.float32)
        np.concatenate([self.docs[start:end] for start, end, _ in clauses], out=every, casting="safe")
        np.concatenate([self.denoms[start:end] for start, end, _ in clauses], out=denoms)
        weights = np.repeat(np.array([weight for _, _, weight in clauses], np.float32), lengths)
        scores = _term_scores(weights, denoms, workspace.get("scores32", total, np.float32))
        wide = workspace.get("scores64", total, np.float64)
        np.copyto(wide, scores, casting="safe")
        np.add.at(sums, every, wide)  # fast for intp indices and float64 values only
        return every

    def _dense_top_k(self, workspace: _Workspace, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top k when the query touched many documents: select over the array of all documents' sums."""
        sums = workspace.sums
        scores = workspace.get("sums32", self.num_docs, np.float32)
        np.copyto(scores, sums, casting="same_kind")
        sums.fill(0.0)
        bound = _kth_bound(scores, k)
        matches = workspace.get("mask", self.num_docs, np.bool_)
        if bound > 0:
            np.greater_equal(scores, bound, out=matches)
        else:  # fewer than k matches: every clause score is > 0, so a document matches when its sum is
            np.greater(scores, 0, out=matches)
        hits = np.flatnonzero(matches)
        return _top_k(hits, scores[hits], k)

    def _sparse_top_k(
        self, every: np.ndarray, workspace: _Workspace, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top k when the query touched few documents: work on the touched ones only."""
        sums = workspace.sums
        # One entry per document: whichever entry the scatter left in ``owner`` keeps the document.
        owner = workspace.get("owner", self.num_docs, np.intp)
        entry = workspace.get("entry", len(every), np.intp)
        entry[:] = np.arange(len(every))
        owner[every] = entry
        docs = every[owner[every] == entry]
        scores = sums[docs].astype(np.float32)
        sums[every] = 0.0
        return _top_k(docs, scores, k)


def _below(theta: float) -> float:
    """The float32 just below theta: a float64 sum at most this casts to a float32 below theta."""
    return float(np.nextafter(np.float32(theta), np.float32(-np.inf)))


def _prunes(bound_sum: float, theta: float) -> bool:
    """Whether documents whose clause scores sum to at most ``bound_sum`` (float64) all score below theta."""
    return bound_sum * _BOUND_SLACK <= _below(theta)


def _term_scores(weight: np.float32, denoms: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Lucene 8's BM25 term score in float32: weight - weight / (1 + freq * cache[norm])."""
    np.divide(weight, denoms, out=out)
    return np.subtract(weight, out, out=out)


def _kth_bound(scores: np.ndarray, k: int) -> np.float32:
    """A value that at least ``k`` scores reach and no score among the best ``k`` is below (k-th best or less).

    A full selection over 100k+ scores costs ~1 ms, so first try a value from a strided sample of ~16k scores,
    picked so that about 2k + 4 strides' worth of scores reach it; counting them proves it is a valid bound.
    """
    n = len(scores)
    if n <= k:
        return np.float32(-np.inf)
    if n >= 4096 and n >= 64 * k:
        sample = scores[:: max(16, n // 16384)]
        position = len(sample) - (-(-2 * k * len(sample) // n) + 4)
        bound = np.partition(sample, position)[position]
        if np.count_nonzero(scores >= bound) >= k:
            return bound
    return np.partition(scores, n - k)[n - k]


def _top_k(docs: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best (score descending, document number ascending) of the candidates."""
    if len(docs) > k:
        keep = scores >= _kth_bound(scores, k)
        docs, scores = docs[keep], scores[keep]
    order = np.lexsort((docs, -scores))[:k]
    return docs[order], scores[order]
