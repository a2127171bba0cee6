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
document number and the float32 denominator ``1 + freq * cache[norm]``, so a term score is one
``weight - weight / denominator``. The scoring loops (exhaustive, and exact MaxScore pruning for large queries)
are compiled: ``kernels``.

Files of an index directory (arrays are memory-mapped on open):
  meta.json            format version, parameters, collection statistics
  vocab.txt            the terms, one per line; line i is term i
  term_offsets.npy     int64[V+1]: term i's postings are [offsets[i], offsets[i+1])
  postings_docs.npy    int32[P]: document numbers
  postings_denoms.npy  float32[P]: 1 + freq * cache[norm(doc)]
  idf.npy              float32[V]
  norms.npy            uint8[N]: the encoded document lengths
  doc_ids.npy          bytes[N]: document ids (UTF-8) in ascending order
  lookup_terms.npy     int64[R]: the terms with lookup codes (``lookup_code_terms``), ascending
  lookup_codes.npy     uint8[R, ceil(N/2)]: their 4-bit codes (``fill_lookup_codes``); an index written
                       before these existed gets them computed when it is opened, in that process's memory
"""

from __future__ import annotations

import json
import mmap
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from itertools import chain, pairwise
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from . import kernels
from .analyzer import normalize_token, tokenize

__all__ = [
    "K1",
    "B",
    "BM25Index",
    "bm25_cache",
    "build_index",
    "byte4_to_int",
    "compile_kernels",
    "fill_lookup_codes",
    "frequency_denominators",
    "int4_to_long",
    "int_to_byte4",
    "long_to_int4",
    "lookup_code_terms",
    "norm_bytes",
]

FORMAT_VERSION = 1
K1 = 0.9  # pyserini's LuceneSearcher defaults
B = 0.4
DEFAULT_TOP_K = 50

_CHUNK_DOCS = 8192  # documents per batch while building
_TOKEN_CACHE_LIMIT = 4_000_000  # raw token -> term id entries kept while building
_QUERY_TOKEN_CACHE_LIMIT = 1 << 16  # the same at search time: query tokens repeat (instructions share words)
_SORT_POSTINGS_MIN_DF = 64  # postings lists at least this long are sorted by document (memory locality)
# Queries with fewer postings are scored exhaustively: as fast (measured: below ~7k postings, faster).
_PRUNE_MIN_POSTINGS = 20_000
# Terms in at least this share of the documents get lookup codes (``fill_lookup_codes``, half a byte per
# document and term), densest first, within a memory budget: half of what the postings take. On the 1.2M
# generated catalog: 220 terms, 132 MB, and a pruned search 40% faster than galloping through their postings.
_LOOKUP_MIN_DF_SHARE = 1 / 32
_LOOKUP_MAX_BYTES_PER_POSTING = 4
_LOOKUP_BUILD_CHUNK = 1 << 16  # postings per step while making the codes (bounds the temporaries' memory)


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


def frequency_denominators(meta: dict[str, Any]) -> np.ndarray:
    """float32[LOOKUP_ESCAPE, 256]: row c is the denominator ``1 + c * cache[norm]`` of frequency c, computed
    as the index described by ``meta`` (its meta.json) computed its postings' denominators."""
    cache = bm25_cache(np.float32(meta["avgdl"]), meta["k1"], meta["b"])
    freqs = np.arange(kernels.LOOKUP_ESCAPE, dtype=np.float32)[:, None]
    return np.float32(1) + freqs * cache[None, :]


def idf_values(doc_freqs: np.ndarray, doc_count: int) -> np.ndarray:
    """BM25Similarity.idf: (float) Math.log(1 + (docCount - df + 0.5) / (df + 0.5))."""
    df = np.asarray(doc_freqs, dtype=np.float64)
    return np.log(1.0 + (doc_count - df + 0.5) / (df + 0.5)).astype(np.float32)


# --- building -------------------------------------------------------------------------------------------------
class _Memo(dict):  # type: ignore[type-arg]
    """A dict that computes a missing key's value (``_compute``) and keeps at most ``limit`` entries.

    Being a dict subclass with ``__missing__``, ``map(memo.__getitem__, keys)`` runs in C for known keys.
    Full, it starts over (a miss only costs the computation again).
    """

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def __missing__(self, key: str) -> Any:
        value = self._compute(key)
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value

    def _compute(self, key: str) -> Any:
        raise NotImplementedError


class _TermIds(_Memo):
    """Raw token -> term id (-1: a stop word, or a term not in a fixed vocabulary); a miss runs the analysis.

    While building, ``extend`` adds new terms to the vocabulary; at search time the vocabulary is the index's.
    """

    def __init__(self, vocab: dict[str, int], *, extend: bool, limit: int) -> None:
        super().__init__(limit)
        self.vocab, self.extend = vocab, extend

    def _compute(self, token: str) -> int:
        # a number is its own term (no possessive, case, stop word or suffix applies): the usual new query token
        term = token if token.isdigit() else normalize_token(token)
        if term is None:
            return -1
        term_id = self.vocab.get(term, -1)
        if term_id < 0 and self.extend:
            term_id = self.vocab[term] = len(self.vocab)
        return term_id


class _WordTermIds(_Memo):
    """A whitespace-separated word of ASCII text -> the term ids of its tokens; a miss tokenizes the word.

    Tokens never hold whitespace, so an ASCII query's tokens are its words' tokens in order (what
    ``tokenize`` itself relies on). Looking up whole words keeps a query's analysis in C loops: queries
    repeat their words far more often than whole queries repeat.
    """

    def __init__(self, term_ids: _TermIds, limit: int) -> None:
        super().__init__(limit)
        self.term_ids = term_ids

    def _compute(self, word: str) -> tuple[int, ...]:
        return tuple(map(self.term_ids.__getitem__, tokenize(word)))


class _Builder:
    """Tokenises documents in batches and spills each batch's (term, doc, freq) postings to a scratch file."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.vocab: dict[str, int] = {}
        self.term_ids = _TermIds(self.vocab, extend=True, limit=_TOKEN_CACHE_LIMIT)
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
        meta = _write_index(builder, out_dir, progress, k1, b)
        del builder  # its memory back before the lookup codes are made
    _write_lookup_codes(out_dir, meta, progress)
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")


def _write_index(builder: _Builder, out_dir: Path, progress: bool, k1: float, b: float) -> dict[str, Any]:
    """Every file of the index but the lookup codes and meta.json; returns what meta.json will hold."""
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
    return meta


def _write_lookup_codes(out_dir: Path, meta: dict[str, Any], progress: bool) -> None:
    """``lookup_terms.npy`` and ``lookup_codes.npy`` of a written index, a term at a time.

    The postings are read, not mapped, and each row written as it is made: mapped pages would count as this
    process's memory, which stays within ``catalog prepare``'s budget this way.
    """
    num_docs = meta["num_docs"]
    offsets = np.load(out_dir / "term_offsets.npy")
    norms = np.load(out_dir / "norms.npy")
    terms = lookup_code_terms(np.diff(offsets), num_docs)
    np.save(out_dir / "lookup_terms.npy", terms)

    def read_postings(start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        docs = _read_npy_range(out_dir / "postings_docs.npy", start, end)
        return docs, _read_npy_range(out_dir / "postings_denoms.npy", start, end)

    rows = _lookup_code_rows(terms, offsets, norms, frequency_denominators(meta), num_docs, read_postings)
    header = {"descr": "|u1", "fortran_order": False, "shape": (len(terms), (num_docs + 1) // 2)}
    with open(out_dir / "lookup_codes.npy", "wb") as out:
        np.lib.format.write_array_header_1_0(out, header)
        for row in tqdm(rows, total=len(terms), desc="lookup codes", unit=" terms", disable=not progress):
            out.write(row.tobytes())


def _lookup_code_rows(
    terms: np.ndarray,
    offsets: np.ndarray,
    norms: np.ndarray,
    denominators: np.ndarray,
    num_docs: int,
    read_postings: Callable[[int, int], tuple[np.ndarray, np.ndarray]],
) -> Iterator[np.ndarray]:
    """Each term's row of lookup codes, made from its postings [start, end) as ``read_postings`` gives them,
    ``_LOOKUP_BUILD_CHUNK`` at a time (so that the temporaries stay small)."""
    for term in terms:
        row = np.zeros((num_docs + 1) // 2, np.uint8)
        for start in range(int(offsets[term]), int(offsets[term + 1]), _LOOKUP_BUILD_CHUNK):
            docs, denoms = read_postings(start, min(start + _LOOKUP_BUILD_CHUNK, int(offsets[term + 1])))
            fill_lookup_codes(row, docs, denoms, norms, denominators)
        yield row


def fill_lookup_codes(
    row: np.ndarray, docs: np.ndarray, denoms: np.ndarray, norms: np.ndarray, denominators: np.ndarray
) -> None:
    """Write postings' 4-bit lookup codes (``kernels``) into their term's ``row``: document d's in byte d >> 1,
    bits 4 * (d & 1), which must still be 0 (documents without the term keep 0).

    ``docs``/``denoms``: postings of the term; ``denominators[c, norm]``: frequency c's denominator at that
    norm (``frequency_denominators``). A posting gets code c only if that is bit for bit its stored
    denominator, else ``LOOKUP_ESCAPE``. (numpy, not a compiled kernel: ``catalog prepare`` calls it, and
    loading compiled code would add ~50 MB to that process.)
    """
    norm = norms[docs]
    with np.errstate(divide="ignore", invalid="ignore"):  # a 0 unit, or a NaN, makes an escape below
        guess = np.rint((denoms - np.float32(1)) / (denominators[1, norm] - np.float32(1)))
    in_range = (guess >= 1) & (guess < kernels.LOOKUP_ESCAPE)
    guess = np.where(in_range, guess, 0).astype(np.intp)
    exact = in_range & (denominators[guess, norm] == denoms)
    codes = np.where(exact, guess, kernels.LOOKUP_ESCAPE).astype(np.uint8)
    odd = (docs & 1).astype(bool)  # a document occurs once in a postings list: no byte is written twice below
    row[docs[~odd] >> 1] |= codes[~odd]
    row[docs[odd] >> 1] |= codes[odd] << 4


def _read_npy_range(path: Path, start: int, stop: int) -> np.ndarray:
    """Elements [start, stop) of a one-dimensional ``.npy`` file, read from disk."""
    with open(path, "rb") as handle:
        version = np.lib.format.read_magic(handle)
        read_header = (
            np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        )
        _, _, dtype = read_header(handle)
        handle.seek(start * dtype.itemsize, os.SEEK_CUR)
        return np.fromfile(handle, dtype=dtype, count=stop - start)


# --- searching ------------------------------------------------------------------------------------------------
class _Workspace(threading.local):
    """Per-thread per-document arrays the kernels need, all False / 0 between searches (the kernels restore
    them). Allocated once: fresh arrays of 100k+ elements would cost page faults on every search."""

    def __init__(self, num_docs: int) -> None:
        self.seen = np.zeros(num_docs, dtype=np.bool_)
        self.sums = np.zeros(num_docs, dtype=np.float64)


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
        self._term_ids = _TermIds(self.vocab, extend=False, limit=_QUERY_TOKEN_CACHE_LIMIT)
        self._word_ids = _WordTermIds(self._term_ids, limit=_QUERY_TOKEN_CACHE_LIMIT)
        # Queries with at least this many postings take the pruned path (tests set 0 to force it everywhere).
        self.prune_min_postings = _PRUNE_MIN_POSTINGS
        _map_every_page(self.docs)  # the first searches must not pay the page faults of a cold mapping
        # the pruning's bounds, and whether every term score is positive (what exhaustive scoring may use)
        self._max_denoms, smallest = kernels.term_max_denoms(self.denoms, self.offsets)
        self._scores_positive = bool(smallest >= kernels.SCORES_POSITIVE_ABOVE)
        self._denominators = frequency_denominators(self.meta)
        if (self.directory / "lookup_codes.npy").exists():  # shared by every process that maps the index
            lookup_terms, self._lookup_codes = self._load("lookup_terms.npy"), self._load("lookup_codes.npy")
            _map_every_page(self._lookup_codes)
        else:  # an index written before lookup codes existed
            lookup_terms = lookup_code_terms(np.diff(self.offsets), self.num_docs)
            self._lookup_codes = np.zeros((len(lookup_terms), (self.num_docs + 1) // 2), np.uint8)
            rows = _lookup_code_rows(
                lookup_terms, self.offsets, self.norms, self._denominators, self.num_docs,
                lambda start, end: (self.docs[start:end], self.denoms[start:end]),
            )  # fmt: skip
            for number, row in enumerate(rows):
                self._lookup_codes[number] = row
        self._lookup_rows = np.full(len(self.idf), -1, np.int64)  # term -> its row of lookup codes
        self._lookup_rows[lookup_terms] = np.arange(len(lookup_terms))

    @classmethod
    def open(cls, directory: Path) -> BM25Index:
        return cls(directory)

    def _load(self, name: str) -> np.ndarray:
        # a plain ndarray view of the memory map: slicing an np.memmap costs microseconds per slice (its
        # __array_finalize__)
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

        Queries of two or more terms with many postings take the pruned path (``kernels.rank_pruned``), which
        returns exactly what exhaustive scoring (``rank_exhaustive``) returns, only faster.
        """
        docs, scores, _ = self.rank_counting(query, k)
        return docs, scores

    def rank_exhaustive(self, query: str, k: int = DEFAULT_TOP_K) -> tuple[np.ndarray, np.ndarray]:
        """``rank`` scoring every posting of every query term (the reference the pruned path must equal)."""
        docs, scores, _ = self.rank_counting(query, k, prune=False)
        return docs, scores

    def rank_counting(
        self, query: str, k: int = DEFAULT_TOP_K, *, prune: bool = True
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """``rank``, plus how many documents were scored (all that match, unless pruning ruled some out)."""
        docs, scores, scored, _ = self._rank_terms(
            self._query_terms(query), k, 0, self.prune_min_postings if prune else _NEVER_PRUNE
        )
        return docs, scores, scored

    def top_positions(self, query: str, k: int, count_up_to: int) -> tuple[list[int], int]:
        """The top ``k`` document numbers, and how many documents match counted up to ``count_up_to``.

        Why both: a results page shows ten hits and the total of the top 50; asking for only the hits a page
        shows makes the search cheaper (the first page's top 10 costs about two thirds of a top 50).
        """
        docs, _, _, matches = self._rank_terms(
            self._query_terms(query), k, count_up_to, self.prune_min_postings
        )
        return docs.tolist(), matches

    def _rank_terms(
        self, query_terms: np.ndarray, k: int, count_up_to: int, prune_min_postings: int
    ) -> tuple[np.ndarray, np.ndarray, int, int]:
        workspace = self._workspace
        docs, scores, scored, matches = kernels.rank(
            self.docs, self.denoms, self.offsets, self.idf, query_terms, k, count_up_to, prune_min_postings,
            _SORT_POSTINGS_MIN_DF, self._max_denoms, workspace.seen, workspace.sums, self._scores_positive,
            self._lookup_rows, self._lookup_codes, self.norms, self._denominators,
        )  # fmt: skip
        return docs, scores, int(scored), int(matches)

    def warm_up(self) -> None:
        """Compile the search kernels for this index's arrays, or load them from numba's cache, before serving.

        Without it the first search of each process pays the compile (~15 s when nothing is cached).
        """
        terms = np.arange(min(2, len(self.vocab)), dtype=np.intp)
        for prune_min_postings in (0, _NEVER_PRUNE):  # the pruned path, then the exhaustive one
            self._rank_terms(terms, 1, 1, prune_min_postings)

    def bound(self, term: str) -> float:
        """The largest float32 score the single-term query ``term`` gives any document (what pruning uses)."""
        terms, counts = kernels.distinct_terms(self._query_terms(term))
        weights = kernels.clause_weights(self.idf, terms, counts)
        return float(kernels.clause_bounds(self._max_denoms, terms, weights)[0])

    def _query_terms(self, query: str) -> np.ndarray:
        """The query's tokens as term ids, -1 for a stop word or a term no document has (C loops for known
        words and tokens: ``_WordTermIds``, ``_TermIds``); ``kernels.distinct_terms`` makes the clauses."""
        if query.isascii():
            return np.fromiter(chain.from_iterable(map(self._word_ids.__getitem__, query.split())), np.intp)
        tokens = tokenize(query)
        return np.fromiter(map(self._term_ids.__getitem__, tokens), np.intp, len(tokens))


def lookup_code_terms(doc_freqs: np.ndarray, num_docs: int) -> np.ndarray:
    """The terms that get lookup codes: those in at least ``_LOOKUP_MIN_DF_SHARE`` of the documents, densest
    first, as many as fit in ``_LOOKUP_MAX_BYTES_PER_POSTING`` bytes per posting of the index."""
    doc_freqs = np.asarray(doc_freqs, dtype=np.int64)
    dense = np.flatnonzero(doc_freqs >= max(1.0, num_docs * _LOOKUP_MIN_DF_SHARE))
    dense = dense[np.argsort(-doc_freqs[dense], kind="stable")]
    row_bytes = max(1, (num_docs + 1) // 2)
    fitting = int(doc_freqs.sum()) * _LOOKUP_MAX_BYTES_PER_POSTING // row_bytes
    return np.sort(dense[:fitting]).astype(np.int64)


def _map_every_page(array: np.ndarray) -> None:
    """Read one element per memory page of a memory-mapped array, so that the process maps all of it now.

    Shared with every process mapping the file (the OS page cache); ~0.1 s for the 1.2M catalog's postings.
    """
    array[:: max(1, mmap.PAGESIZE // array.itemsize)].sum(dtype=np.float64)


_NEVER_PRUNE = np.iinfo(np.int64).max


def compile_kernels() -> None:
    """Compile the search kernels into numba's cache for any index (the env image runs this at build time)."""
    with tempfile.TemporaryDirectory() as scratch:
        build_index(["a", "b", "c"], ["red shirt", "red dress", "blue shirt"], Path(scratch))
        BM25Index.open(Path(scratch)).warm_up()
