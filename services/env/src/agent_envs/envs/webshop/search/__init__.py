"""Search: the original's Lucene BM25 ranking (pyserini 0.17 / Lucene 8) re-implemented on numpy arrays."""

from .analyzer import analyze, tokenize
from .bm25 import BM25Index, build_index
from .porter import stem

__all__ = ["BM25Index", "analyze", "build_index", "stem", "tokenize"]
