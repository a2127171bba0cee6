"""Compiled (numba) BM25 scoring loops: exhaustive scoring and exact MaxScore pruning.

Plain loops over the postings, compiled once and cached on disk (``NUMBA_CACHE_DIR``, else next to this file),
so a search costs what its arithmetic costs instead of a numpy call per step. The arithmetic is Lucene 8's, as
``bm25`` documents it: a term score ``w - w / denominator`` in float32, a document's score the float64 sum of
its clauses' scores *in clause order* cast to float32, ties broken by document number.

A query arrives as clauses: ``starts``/``ends`` index a postings list, in the index's arrays (``source`` 0) or,
for a list stored unsorted (shorter than ``bm25``'s sort threshold), in a sorted copy (``source`` 1) that
``sorted_copies`` makes; every list the pruned path reads is sorted by document number.

Lookup codes. Finding a document in a long postings list is a search through it; for the index's densest terms
the index keeps instead a 4-bit code per document (two per byte; ``bm25.fill_lookup_codes``): 0 the document
lacks the term, c in 1..14 its denominator is ``denominators[c, norm]`` (what ``1 + freq * cache[norm]`` gives
for freq c, checked against the stored one when the codes are made), ``LOOKUP_ESCAPE`` anything else (a larger
frequency), looked up in the postings. A lookup is then one read of a small array, with the very denominator
the postings hold.

Exactness of the pruning. A clause's float32 term score is non-decreasing in the denominator (IEEE division
and subtraction round monotonically), so its score at the term's largest denominator bounds what it gives any
document. A float64 sum of up to ``MAX_CLAUSES`` non-negative scores, in any order and with bounds standing in
for some of them, is within a relative ``(1 + n 2^-53)`` of the real sum; ``BOUND_SLACK`` covers that both
ways. A document is dropped only when an upper bound of its float64 sum is at most the float32 just below
``theta``, where ``k`` other documents provably score at least ``theta``: it then ranks below all of them.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import numba
import numpy as np

__all__ = [
    "BOUND_SLACK",
    "LOOKUP_ESCAPE",
    "MAX_CLAUSES",
    "SCORES_POSITIVE_ABOVE",
    "clause_bounds",
    "clause_weights",
    "distinct_terms",
    "rank",
    "rank_exhaustive",
    "rank_pruned",
    "term_max_denoms",
]

LOOKUP_ESCAPE = 15  # a lookup code: the term is there, its denominator is in the postings only
# Every term score w - w / d is above 0 when every denominator d is at least this: w / d is then below w by more
# than float32 division's rounding (half a unit in the last place, 2^-24 relative). Weights are positive (idf > 0).
SCORES_POSITIVE_ABOVE = 1.0 + 2.0**-22
MAX_CLAUSES = 1 << 16  # the slack below covers float64 rounding of sums of up to this many terms
BOUND_SLACK = 1.0 + 2.0**-28  # > (1 + n 2^-53) / (1 - 2n 2^-53) for n <= 2^16, plus the product's rounding

log = logging.getLogger(__name__)


def _seed_compiled_cache() -> None:
    """Start an empty ``NUMBA_CACHE_DIR`` from ``WEBSHOP_NUMBA_CACHE_SEED`` (the image's build-time compile).

    The env image runs on a read-only root file system with a tmpfs at /tmp: the cache must live there, and
    copying the seed in spares every worker of every container the ~15 s compile.
    """
    seed, target = os.environ.get("WEBSHOP_NUMBA_CACHE_SEED"), numba.config.CACHE_DIR
    if not seed or not target or not Path(seed).is_dir() or Path(target).exists():
        return
    try:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".numba-seed-", dir=Path(target).parent)
        shutil.copytree(seed, staging, dirs_exist_ok=True)
        os.rename(staging, target)  # atomic: a concurrent worker either sees all of it or copies its own
    except OSError as error:
        log.debug("numba cache not seeded: %s", error)


def _cache_usable() -> bool:
    """Whether numba can cache compiled code anywhere (else every process compiles, slower but correct)."""
    try:
        numba.njit(cache=True)(lambda: 0)
    except RuntimeError as error:  # "cannot cache function ...: no locator available"
        log.warning(
            "compiled search kernels cannot be cached (%s); set NUMBA_CACHE_DIR to a writable directory",
            error,
        )
        return False
    return True


_seed_compiled_cache()
_jit = numba.njit(cache=_cache_usable(), nogil=True, error_model="numpy")  # numpy: no zero-division checks


@_jit
def _below(theta: float) -> float:
    """The float32 just below theta: a float64 sum at most this casts to a float32 below theta."""
    return float(np.nextafter(np.float32(theta), np.float32(-np.inf)))


@_jit
def _term_score(weight, denom):  # type: ignore[no-untyped-def]
    """Lucene 8's BM25 term score in float32: weight - weight / (1 + freq * cache[norm])."""
    return weight - weight / denom


@_jit
def _gallop(docs, position, end, target):  # type: ignore[no-untyped-def]
    """The first index in [position, end) of the sorted ``docs`` whose document is >= target (or ``end``)."""
    if position >= end or docs[position] >= target:
        return position
    low = position  # docs[low] < target
    step = 1
    high = low + 1
    while high < end and docs[high] < target:
        low = high
        step <<= 1
        high = low + step
    if high > end:
        high = end
    low += 1
    while low < high:
        middle = (low + high) >> 1
        if docs[middle] < target:
            low = middle + 1
        else:
            high = middle
    return low


@_jit
def term_max_denoms(denoms, offsets):  # type: ignore[no-untyped-def]
    """Each term's largest denominator (what its bound, its largest score, is computed from), and the
    smallest denominator of the index (whether every term score is positive: ``SCORES_POSITIVE_ABOVE``)."""
    largest = np.ones(len(offsets) - 1, np.float32)  # denominators are >= 1
    smallest = np.inf
    for term in range(len(offsets) - 1):
        for position in range(offsets[term], offsets[term + 1]):
            if denoms[position] > largest[term]:
                largest[term] = denoms[position]
            if denoms[position] < smallest:
                smallest = denoms[position]
    return largest, smallest


@_jit
def clause_bounds(max_denoms, terms, weights):  # type: ignore[no-untyped-def]
    """Each clause's largest float32 term score: its term score at the term's largest denominator."""
    bounds = np.empty(len(terms), np.float64)
    for clause in range(len(terms)):
        bounds[clause] = np.float64(_term_score(weights[clause], max_denoms[terms[clause]]))
    return bounds


@_jit
def _insert(best_scores, best_docs, size, score, doc):  # type: ignore[no-untyped-def]
    """Insert a hit into the best hits so far, kept in rank order (capacity ``len(best_scores)``).

    Returns the new size. Rank order: score descending, then document number ascending. Most hits rank below
    a full list's last and cost one comparison; the others shift at most k entries.
    """
    capacity = len(best_scores)
    if size == capacity:
        last = capacity - 1
        if score < best_scores[last] or (score == best_scores[last] and doc > best_docs[last]):
            return size
        slot = last
    else:
        slot = size
        size += 1
    while slot > 0 and (
        best_scores[slot - 1] < score or (best_scores[slot - 1] == score and best_docs[slot - 1] > doc)
    ):
        best_scores[slot] = best_scores[slot - 1]
        best_docs[slot] = best_docs[slot - 1]
        slot -= 1
    best_scores[slot] = score
    best_docs[slot] = doc
    return size


@_jit
def _essential_count(rest, theta):  # type: ignore[no-untyped-def]
    """MaxScore's split: the fewest leading clauses (by bound) that a document must match to reach theta."""
    if theta == -np.inf:
        return len(rest) - 1
    below = _below(theta)
    essential = 0
    while essential < len(rest) - 1 and not rest[essential] * BOUND_SLACK <= below:
        essential += 1
    return essential


@_jit
def rank_pruned(  # type: ignore[no-untyped-def]
    docs,
    denoms,
    starts,
    ends,
    weights,
    terms,
    max_denoms,
    k,
    sorted_below,
    lookup_rows,
    codes,
    norms,
    denominators,
):
    """The exact top ``k`` of a query, scoring only documents that can still reach it (MaxScore).

    Documents are visited in increasing number, as the union of the "essential" clauses' postings: the
    clauses with the largest bounds, as few as a document must match one of to beat theta, the k-th best
    exact score so far (the others' bounds sum below it). Each visited document then looks up the other
    clauses in decreasing bound order, and is dropped as soon as its partial sum plus the bounds of the
    clauses left cannot reach theta; one that survives them all is scored exactly (clause order) and may
    enter the top k, raising theta and shrinking the essential set.
    ``starts``/``ends``: the clauses' postings in ``docs``/``denoms``; lists shorter than ``sorted_below``
    are stored unsorted. A term with a row in ``codes`` (``lookup_rows[term]`` >= 0) is looked up there
    (``bm25.fill_lookup_codes``), the others by galloping through their postings. Returns (documents, float32 scores,
    how many documents were scored exactly).
    """
    clauses = len(starts)
    bounds = clause_bounds(max_denoms, terms, weights)
    sorted_docs, sorted_denoms, starts, ends, sources = sorted_copies(
        docs, denoms, starts, ends, sorted_below
    )
    by_bound = np.argsort(-bounds, kind="mergesort")
    rest = np.zeros(clauses + 1, np.float64)  # rest[j]: the sum of the bounds of by_bound[j:]
    for j in range(clauses - 1, -1, -1):
        rest[j] = rest[j + 1] + bounds[by_bound[j]]
    position = np.empty(clauses, np.int64)  # per clause in bound order: its cursor in its postings
    end = np.empty(clauses, np.int64)
    source = np.empty(clauses, np.uint8)
    weight = np.empty(clauses, np.float32)
    lookup_row = np.empty(clauses, np.int64)
    for j in range(clauses):
        clause = by_bound[j]
        position[j], end[j] = starts[clause], ends[clause]
        source[j], weight[j] = sources[clause], weights[clause]
        lookup_row[j] = lookup_rows[terms[clause]]
    rank_of = np.empty(clauses, np.int64)  # clause -> its place in bound order
    rank_of[by_bound] = np.arange(clauses)
    term_scores = np.zeros(clauses, np.float32)  # of the document at hand, in bound order

    best_scores = np.empty(k, np.float32)  # the top k so far, in rank order
    best_docs = np.empty(k, np.int32)
    size = 0
    theta = below = -np.inf
    essential = clauses
    scored = 0  # documents scored exactly
    no_doc = np.iinfo(np.int32).max
    while essential:
        doc = no_doc  # the next document of the essential clauses
        for j in range(essential):
            if position[j] < end[j]:
                at = docs[position[j]] if source[j] == 0 else sorted_docs[position[j]]
                if at < doc:
                    doc = at
        if doc == no_doc:
            break
        partial = 0.0
        for j in range(essential):
            if position[j] < end[j]:
                p = position[j]
                at = docs[p] if source[j] == 0 else sorted_docs[p]
                if at == doc:
                    denom = denoms[p] if source[j] == 0 else sorted_denoms[p]
                    term_scores[j] = _term_score(weight[j], denom)
                    partial += np.float64(term_scores[j])
                    position[j] = p + 1
        reached = clauses
        for j in range(essential, clauses):
            if (partial + rest[j]) * BOUND_SLACK <= below:
                reached = j
                break
            if lookup_row[j] >= 0:
                code = (codes[lookup_row[j], doc >> 1] >> ((doc & 1) * 4)) & 15
                if code == 0:
                    continue
                if code != LOOKUP_ESCAPE:
                    term_scores[j] = _term_score(weight[j], denominators[code, norms[doc]])
                    partial += np.float64(term_scores[j])
                    continue
            if source[j] == 0:
                p = _gallop(docs, position[j], end[j], doc)
                found = p < end[j] and docs[p] == doc
                denom = denoms[p] if found else np.float32(1)
            else:
                p = _gallop(sorted_docs, position[j], end[j], doc)
                found = p < end[j] and sorted_docs[p] == doc
                denom = sorted_denoms[p] if found else np.float32(1)
            position[j] = p
            if found:
                term_scores[j] = _term_score(weight[j], denom)
                partial += np.float64(term_scores[j])
        if reached == clauses:
            scored += 1
            total = 0.0
            for clause in range(clauses):  # the exact sum: clause order
                total += np.float64(term_scores[rank_of[clause]])
            size = _insert(best_scores, best_docs, size, np.float32(total), doc)
            if size == k and best_scores[k - 1] > theta:
                theta = float(best_scores[k - 1])
                below = _below(theta)
                essential = _essential_count(rest, theta)
        term_scores[:reached] = 0
    return best_docs[:size].copy(), best_scores[:size].copy(), scored


@_jit
def rank_exhaustive(docs, denoms, starts, ends, weights, k, seen, sums, positive):  # type: ignore[no-untyped-def]
    """The top ``k`` scoring every posting of every clause: (documents, float32 scores, documents scored).

    ``seen`` (bool) and ``sums`` (float64), one per document, are all False / 0 on entry and on return.
    ``positive``: every term score of the index is above 0, so a document's sum is 0 until a clause has
    scored it, and the sums alone tell the documents seen (one array less to touch per posting).
    """
    total = 0
    for clause in range(len(starts)):
        total += ends[clause] - starts[clause]
    touched = np.empty(total, np.int32)
    count = 0
    for clause in range(len(starts)):
        weight = weights[clause]
        for position in range(starts[clause], ends[clause]):
            doc = docs[position]
            touched[count] = doc  # kept (count moves on) only the first time: no branch to mispredict
            if positive:
                count += sums[doc] == 0.0
            else:
                count += not seen[doc]
                seen[doc] = True
            sums[doc] += np.float64(_term_score(weight, denoms[position]))
    best_scores = np.empty(min(k, count), np.float32)
    best_docs = np.empty(min(k, count), np.int32)
    size = 0
    for i in range(count):
        doc = touched[i]
        size = _insert(best_scores, best_docs, size, np.float32(sums[doc]), doc)
        sums[doc] = 0.0
        if not positive:
            seen[doc] = False
    return best_docs, best_scores, count


@_jit
def sorted_copies(docs, denoms, starts, ends, sorted_below):  # type: ignore[no-untyped-def]
    """Sorted copies of the clauses' postings lists shorter than ``sorted_below`` (stored unsorted).

    Returns (documents, denominators, starts, ends, sources): the clauses' ranges, in the copies for those
    lists (source 1) and in the index's arrays for the others (source 0).
    """
    clauses = len(starts)
    total = 0
    for clause in range(clauses):
        if ends[clause] - starts[clause] < sorted_below:
            total += ends[clause] - starts[clause]
    copy_docs = np.empty(total, np.int32)
    copy_denoms = np.empty(total, np.float32)
    new_starts = starts.copy()
    new_ends = ends.copy()
    sources = np.zeros(clauses, np.uint8)
    filled = 0
    for clause in range(clauses):
        start, end = starts[clause], ends[clause]
        if end - start < sorted_below:
            order = np.argsort(docs[start:end])
            for i in range(end - start):
                copy_docs[filled + i] = docs[start + order[i]]
                copy_denoms[filled + i] = denoms[start + order[i]]
            new_starts[clause], new_ends[clause] = filled, filled + end - start
            sources[clause] = 1
            filled += end - start
    return copy_docs, copy_denoms, new_starts, new_ends, sources


@_jit
def clause_weights(idf, terms, counts):  # type: ignore[no-untyped-def]
    """A clause's weight: its term's idf boosted by the term's count in the query (a float32 product)."""
    weights = np.empty(len(terms), np.float32)
    for clause in range(len(terms)):
        weights[clause] = np.float32(counts[clause]) * idf[terms[clause]]
    return weights


@_jit
def distinct_terms(query_terms):  # type: ignore[no-untyped-def]
    """A query's clauses: its distinct terms (ids >= 0) in order of first occurrence, and each one's count.

    ``query_terms`` is the query's token sequence as term ids, -1 for a stop word or a term no document has.
    A term occurring c times is one clause boosted by c (Anserini's bag-of-words query).
    """
    n = len(query_terms)
    order = np.argsort(query_terms, kind="mergesort")  # stable: a term's first occurrence leads its run
    firsts = np.empty(n, np.int64)
    runs = np.empty(n, np.int64)
    groups = 0
    i = 0
    while i < n:
        term = query_terms[order[i]]
        j = i + 1
        while j < n and query_terms[order[j]] == term:
            j += 1
        if term >= 0:
            firsts[groups], runs[groups] = order[i], j - i
            groups += 1
        i = j
    by_first = np.argsort(firsts[:groups])
    terms = np.empty(groups, np.int64)
    counts = np.empty(groups, np.int64)
    for g in range(groups):
        terms[g], counts[g] = query_terms[firsts[by_first[g]]], runs[by_first[g]]
    return terms, counts


@_jit
def rank(  # type: ignore[no-untyped-def]
    docs, denoms, offsets, idf, query_terms, k, count_up_to, prune_min_postings, sorted_below, max_denoms,
    seen, sums, scores_positive, lookup_rows, codes, norms, denominators,
):  # fmt: skip
    """The top ``k`` of the query whose tokens are ``query_terms`` (term ids, -1 for none: ``distinct_terms``).

    Pruned (``rank_pruned``) when it has two or more terms and at least ``prune_min_postings`` postings,
    exhaustive (``rank_exhaustive``) otherwise: the same documents and scores either way. Returns
    (documents, float32 scores, how many documents were scored: what pruning saved, for tests and benches,
    how many documents match counted up to ``count_up_to``: a results page's total). Pruning scores only some
    of the matches, but a query's matches are at least its longest postings list: a query that pruning could
    not count that far takes the exhaustive path. The query's analysis up to term ids happens in Python, the
    rest here: one call per search. ``k`` <= 0 gives no hits (and a count of 0).
    """
    terms, counts = distinct_terms(query_terms)
    if len(terms) == 0 or k <= 0:
        return np.zeros(0, np.int32), np.zeros(0, np.float32), 0, 0
    weights = clause_weights(idf, terms, counts)
    starts = np.empty(len(terms), np.int64)
    ends = np.empty(len(terms), np.int64)
    postings = 0
    longest = 0
    for clause in range(len(terms)):
        starts[clause], ends[clause] = offsets[terms[clause]], offsets[terms[clause] + 1]
        postings += ends[clause] - starts[clause]
        longest = max(longest, ends[clause] - starts[clause])
    k = min(k, postings)  # no more hits than postings: what the top-k buffers are sized by
    if 2 <= len(terms) <= MAX_CLAUSES and postings >= prune_min_postings and longest >= count_up_to:
        best_docs, best_scores, scored = rank_pruned(
            docs, denoms, starts, ends, weights, terms, max_denoms, k, sorted_below,
            lookup_rows, codes, norms, denominators,
        )  # fmt: skip
        return best_docs, best_scores, scored, count_up_to
    best_docs, best_scores, matches = rank_exhaustive(
        docs, denoms, starts, ends, weights, k, seen, sums, scores_positive
    )
    return best_docs, best_scores, matches, min(matches, count_up_to)
