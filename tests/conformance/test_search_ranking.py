"""Search results against the original (pyserini 0.17.0, Lucene 8) on the recorded traces.

Every ``search[...]`` action of the recorded episodes is replayed against an index built from the same raw
products; each results page the episode then shows ("Page p (Total results: T)", reached by the search itself
or by later ``next >`` / ``< prev`` clicks) must list exactly the ASINs of ranks 10(p-1)+1 .. 10p, and T must be
the number of hits (at most 50).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent_envs.envs.webshop.catalog.raw import index_text, iter_products
from agent_envs.envs.webshop.search.bm25 import BM25Index, build_index

ORIGINAL = Path(__file__).resolve().parents[1] / "fixtures" / "conformance" / "original-seed3"
TRACE_FILES = ("synthetic-goals/traces.jsonl", "human-goals/traces.jsonl")
PAGE = re.compile(r"Page (\d+) \(Total results: (\d+)\)")
PER_PAGE = 10


@dataclass
class ResultsPage:
    trace: str
    goal: int
    step: int
    query: str
    page: int
    total: int
    asins: list[str]


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> BM25Index:
    products = list(iter_products(ORIGINAL / "raw"))
    out = tmp_path_factory.mktemp("search") / "index"
    build_index([p.asin for p in products], [index_text(p) for p in products], out)
    return BM25Index.open(out)


def parse_results_page(observation: str) -> tuple[int, int, list[str]] | None:
    """(page, total, ASINs) of a results page observation, None for any other page."""
    parts = observation.split(" [SEP] ")
    for i, part in enumerate(parts):
        match = PAGE.fullmatch(part)
        if match:
            rest = parts[i + 1 :]
            while rest and rest[0] in ("< Prev", "Next >"):
                rest = rest[1:]
            return int(match.group(1)), int(match.group(2)), rest[0::3]  # ASIN, title, price per product
    return None


def recorded_pages(trace_file: str) -> list[ResultsPage]:
    pages = []
    with open(ORIGINAL / trace_file, encoding="utf-8") as handle:
        for line in handle:
            episode = json.loads(line)
            query = None
            for number, step in enumerate(episode["steps"]):
                action = step.get("action")
                if action is None:
                    continue
                match = re.match(r"(.+)\[(.+)\]", action)
                if match and match.group(1) == "search":
                    query = match.group(2).lower()  # the original lower-cases the search argument
                shown = parse_results_page(step["observation"])
                if shown is not None and query is not None:
                    pages.append(ResultsPage(trace_file, episode["goal"], number, query, *shown))
    return pages


@pytest.mark.parametrize("trace_file", TRACE_FILES)
def test_search_results_match_the_original(index: BM25Index, trace_file: str) -> None:
    pages = recorded_pages(trace_file)
    assert len({(p.goal, p.query) for p in pages}) >= 40  # the traces hold many searches
    mismatches = []
    for page in pages:
        ranking = index.search(page.query, k=50)
        shown = ranking[(page.page - 1) * PER_PAGE : page.page * PER_PAGE]
        if page.total != len(ranking) or page.asins != shown:
            mismatches.append(
                f"goal {page.goal} step {page.step} {page.query!r} page {page.page}: original total {page.total} "
                f"{page.asins}, ours total {len(ranking)} {shown}"
            )
    assert not mismatches, f"{len(mismatches)}/{len(pages)} pages differ:\n" + "\n".join(mismatches[:20])


def test_traces_reach_later_pages() -> None:
    # the check above covers more than page 1: the recorded agents paged through results
    pages = [page for trace_file in TRACE_FILES for page in recorded_pages(trace_file)]
    assert any(page.page >= 2 for page in pages)
    assert any(page.total < 50 for page in pages)  # and queries with fewer than 50 hits
