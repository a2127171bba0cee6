"""Cross-check against real Lucene 8 where a JDK and Lucene 8 jars are installed (Debian: liblucene8-java).

The original's search is pyserini's Lucene 8; Lucene 8's StandardTokenizer, filters and BM25Similarity did not
change across 8.x. These tests compare tokens, analysed terms, ranked ids and float32 score bits on random
text full of edge cases. Without Java and the jars they are skipped.
"""

from __future__ import annotations

import glob
import os
import random
import shutil
import subprocess
import unicodedata
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest

from agent_envs.envs.webshop.catalog.generate import generate_catalog
from agent_envs.envs.webshop.catalog.raw import index_text, iter_products
from agent_envs.envs.webshop.search.analyzer import analyze, tokenize
from agent_envs.envs.webshop.search.bm25 import BM25Index, build_index

JARS = [
    sorted(glob.glob(f"/usr/share/java/lucene-{name}-8*.jar"))[-1:] for name in ("core", "analyzers-common")
]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("javac") is None or not all(JARS),
        reason="needs a JDK and Lucene 8 jars (liblucene8-java)",
    ),
]

JAVA = r"""
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.nio.file.*;
import java.util.*;
import org.apache.lucene.analysis.*;
import org.apache.lucene.analysis.en.*;
import org.apache.lucene.analysis.standard.StandardTokenizer;
import org.apache.lucene.analysis.tokenattributes.CharTermAttribute;
import org.apache.lucene.document.*;
import org.apache.lucene.index.*;
import org.apache.lucene.search.*;
import org.apache.lucene.search.similarities.BM25Similarity;
import org.apache.lucene.store.Directory;
import org.apache.lucene.store.FSDirectory;
import org.apache.lucene.util.BytesRef;

/** Anserini's DefaultEnglishAnalyzer and bag-of-words BM25 search, as pyserini's LuceneSearcher runs them. */
public class LuceneOracle {
  static Analyzer analyzer(boolean full) {
    return new Analyzer() {
      @Override protected TokenStreamComponents createComponents(String field) {
        Tokenizer source = new StandardTokenizer();
        if (!full) return new TokenStreamComponents(source, source);
        TokenStream result = new EnglishPossessiveFilter(source);
        result = new LowerCaseFilter(result);
        result = new StopFilter(result, EnglishAnalyzer.ENGLISH_STOP_WORDS_SET);
        return new TokenStreamComponents(source, new PorterStemFilter(result));
      }
    };
  }
  static List<String> terms(Analyzer a, String text) throws IOException {
    List<String> out = new ArrayList<>();
    try (TokenStream ts = a.tokenStream("contents", text)) {
      CharTermAttribute term = ts.addAttribute(CharTermAttribute.class);
      ts.reset();
      while (ts.incrementToken()) out.add(term.toString());
      ts.end();
    }
    return out;
  }
  static List<String> lines(String path) throws IOException {
    List<String> out = new ArrayList<>();
    for (String line : Files.readAllLines(Paths.get(path), StandardCharsets.UTF_8)) out.add(line.replace('\u0002', '\n').replace('\u0003', '\r'));
    return out;
  }
  public static void main(String[] args) throws Exception {
    PrintStream out = new PrintStream(new FileOutputStream(args[2]), true, "UTF-8");
    if (!args[0].equals("search")) {
      Analyzer a = analyzer(args[0].equals("analyze"));
      for (String text : lines(args[1])) out.println(String.join("\u0001", terms(a, text)));
      return;
    }
    Analyzer a = analyzer(true);
    // documents are streamed from the file and the index lives on disk: the 1.2M-product check fits a small heap
    Directory dir = FSDirectory.open(Files.createTempDirectory(Paths.get(args[2]).getParent(), "lucene-index"));
    IndexWriterConfig config = new IndexWriterConfig(a).setSimilarity(new BM25Similarity(0.9f, 0.4f))
        .setRAMBufferSizeMB(128);
    try (IndexWriter writer = new IndexWriter(dir, config);
         BufferedReader docs = Files.newBufferedReader(Paths.get(args[1]), StandardCharsets.UTF_8)) {
      for (String line = docs.readLine(); line != null; line = docs.readLine()) {
        line = line.replace('\u0002', '\n').replace('\u0003', '\r');
        int tab = line.indexOf('\t');
        Document doc = new Document();
        doc.add(new StringField("id", line.substring(0, tab), Field.Store.YES));
        doc.add(new SortedDocValuesField("id", new BytesRef(line.substring(0, tab))));
        doc.add(new TextField("contents", line.substring(tab + 1), Field.Store.NO));
        writer.addDocument(doc);
      }
    }
    IndexReader reader = DirectoryReader.open(dir);
    IndexSearcher searcher = new IndexSearcher(reader);
    searcher.setSimilarity(new BM25Similarity(0.9f, 0.4f));
    Sort sort = new Sort(SortField.FIELD_SCORE, new SortField("id", SortField.Type.STRING));
    for (String query : lines(args[3])) {
      Map<String, Long> counts = new LinkedHashMap<>();
      for (String t : terms(a, query)) counts.merge(t, 1L, Long::sum);
      BooleanQuery.Builder builder = new BooleanQuery.Builder();
      for (Map.Entry<String, Long> e : counts.entrySet())
        builder.add(new BoostQuery(new TermQuery(new Term("contents", e.getKey())), (float) e.getValue()),
            BooleanClause.Occur.SHOULD);
      StringBuilder line = new StringBuilder();
      for (ScoreDoc hit : searcher.search(builder.build(), 50, sort, true).scoreDocs)
        line.append(reader.document(hit.doc).get("id")).append(':')
            .append(Integer.toHexString(Float.floatToIntBits(hit.score))).append(' ');
      out.println(line.toString().trim());
    }
  }
}
"""


class LuceneOracle:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.classpath = ":".join([JARS[0][0], JARS[1][0], str(directory)])
        (directory / "LuceneOracle.java").write_text(JAVA, encoding="utf-8")
        subprocess.run(["javac", "-cp", self.classpath, str(directory / "LuceneOracle.java")], check=True)

    def _run(
        self, mode: str, lines: Iterable[str], count: int, queries: list[str] | None = None
    ) -> list[str]:
        def write(name: str, rows: Iterable[str]) -> str:
            path = self.directory / name
            with open(path, "w", encoding="utf-8") as handle:  # streamed: 1.2M product texts are ~1 GB
                for row in rows:
                    handle.write(row.replace("\n", "\u0002").replace("\r", "\u0003") + "\n")
            return str(path)

        args = [mode, write("in.txt", lines), str(self.directory / "out.txt")]
        if queries is not None:
            args.append(write("queries.txt", queries))
        subprocess.run(["java", "-cp", self.classpath, "LuceneOracle", *args], check=True)
        return (self.directory / "out.txt").read_text(encoding="utf-8").split("\n")[:count]

    def terms(self, mode: str, texts: list[str]) -> list[list[str]]:
        return [line.split("\u0001") if line else [] for line in self._run(mode, texts, len(texts))]

    def search(
        self, ids: Iterable[str], texts: Iterable[str], queries: list[str]
    ) -> list[list[tuple[str, int]]]:
        """Lucene's top 50 (id, float32 score bits) per query over the documents (ids and texts, streamed)."""
        rows = (f"{doc_id}\t{text}" for doc_id, text in zip(ids, texts, strict=True))
        results = []
        for line in self._run("search", rows, len(queries), queries):
            hits = [item.rsplit(":", 1) for item in line.split()]
            results.append([(doc_id, int(bits, 16)) for doc_id, bits in hits])
        return results


@pytest.fixture(scope="module")
def lucene(tmp_path_factory: pytest.TempPathFactory) -> LuceneOracle:
    return LuceneOracle(tmp_path_factory.mktemp("lucene"))


SPECIAL = [
    *"'’.,:;_-/\"&+()[]#*",
    *"\u200d\ufe0f\ufe0e\u0301\u00ad\u20e3\u202f‿·＇",
    *"👍🏻❤™®©★✔éüñカー日ひก\u0e31א한٣１🇺🇸ℹ",
    "\u2019s",
    "'s",
]


def random_text(rng: random.Random, assigned: list[str]) -> str:
    parts = []
    for _ in range(rng.randint(1, 40)):
        roll = rng.random()
        if roll < 0.45:
            parts.append(rng.choice("abcdefghijklmnopqrstuvwxyzS0123456789      "))
        elif roll < 0.75:
            parts.append(rng.choice(SPECIAL))
        elif roll < 0.9:
            parts.append(chr(rng.randint(0x20, 0x7E)))
        else:
            parts.append(rng.choice(assigned))
    return "".join(parts)


def test_tokens_and_terms_match_lucene(lucene: LuceneOracle) -> None:
    rng = random.Random(2024)
    assigned = [
        chr(c) for c in range(0x20, 0x30000) if unicodedata.category(chr(c)) not in ("Cn", "Co", "Cs", "Cc")
    ]
    texts = [random_text(rng, assigned) for _ in range(4000)]
    texts += ["x" * 300 + " " + "é" * 600, "Men's Running SHOES, Size: 10.5 - Wi-Fi ΣΊΣΥΦΟΣ İstanbul"]
    for mode, ours in (("tokens", tokenize), ("analyze", analyze)):
        expected = lucene.terms(mode, texts)
        differ = [(text, ours(text), theirs) for text, theirs in zip(texts, expected, strict=True)]
        differ = [d for d in differ if d[1] != d[2]]
        assert not differ, f"{mode}: {len(differ)} texts differ, e.g. {differ[:3]!r}"


def test_rankings_and_scores_match_lucene(lucene: LuceneOracle, tmp_path: Path) -> None:
    rng = random.Random(7)
    words = [
        f"{a}{b}"
        for a in ("red", "blue", "soft", "shoe", "lamp", "desk", "wood", "run")
        for b in ("", "s", "er")
    ]
    weights = [1 / (i + 1) for i in range(len(words))]
    extras = ["men's", "6.5", "1,000", "usb-c", "™", "★", "café", "the", "and", "x-large"]
    ids = sorted({"".join(rng.choice("ABCDEFGH0123456789") for _ in range(8)) for _ in range(1500)})
    rng.shuffle(ids)
    texts = []
    for _ in ids:
        length = rng.choice([rng.randint(0, 20), rng.randint(20, 200)])
        texts.append(" ".join(rng.choices(words, weights, k=length) + rng.choices(extras, k=length // 6)))
    queries = [" ".join(rng.choices(words + extras, k=rng.randint(1, 6))) for _ in range(300)]
    queries += ["red red shoe", "the and", "", "unknownword"]
    build_index(ids, texts, tmp_path / "index")
    index = BM25Index.open(tmp_path / "index")
    expected = lucene.search(ids, texts, queries)
    for query, theirs in zip(queries, expected, strict=True):
        positions, scores = index.rank(query)
        ours = [
            (index.doc_id(int(p)), int(np.float32(s).view(np.int32)))
            for p, s in zip(positions, scores, strict=True)
        ]
        assert ours == theirs, query


def ranked_bits(index: BM25Index, query: str) -> list[tuple[str, int]]:
    positions, scores = index.rank(query)
    return [
        (index.doc_id(int(p)), int(np.float32(s).view(np.int32)))
        for p, s in zip(positions, scores, strict=True)
    ]


def instruction_queries(raw_dir: Path, count: int, seed: int) -> tuple[list[str], list[str], list[str]]:
    """(ids, index texts, ``count`` sampled instructions) of a raw catalog, read in one pass."""
    ids, texts, instructions = [], [], []
    for product in iter_products(raw_dir):
        ids.append(product.asin)
        texts.append(index_text(product))
        if product.instruction_text:
            instructions.append(product.instruction_text)
        instructions += [h["instruction"] for h in product.human_instructions if h.get("instruction")]
    rng = random.Random(seed)
    return ids, texts, rng.sample(instructions, min(count, len(instructions)))


def test_pruned_search_matches_lucene_on_a_generated_catalog(lucene: LuceneOracle, tmp_path: Path) -> None:
    """The agents' real searches (instructions) on the bundled generator's products, the pruned path forced."""
    generate_catalog(tmp_path / "raw", products=6000, seed=5, progress=False)
    ids, texts, queries = instruction_queries(tmp_path / "raw", 300, seed=1)
    queries += ["size", "women men", "the"]
    build_index(ids, texts, tmp_path / "index")
    index = BM25Index.open(tmp_path / "index")
    index.prune_min_postings = 0
    expected = lucene.search(ids, texts, queries)
    for query, theirs in zip(queries, expected, strict=True):
        assert ranked_bits(index, query) == theirs, query


LARGE_RAW = os.environ.get("WEBSHOP_LUCENE_LARGE_RAW")


@pytest.mark.timeout(3 * 3600)  # 1.2M products through two indexers: tens of minutes on a loaded machine
@pytest.mark.skipif(
    not LARGE_RAW, reason="opt-in: set WEBSHOP_LUCENE_LARGE_RAW (and _CATALOG) to a large catalog"
)
def test_search_matches_lucene_on_a_large_catalog(lucene: LuceneOracle, tmp_path: Path) -> None:
    """Opt-in, full scale: ``WEBSHOP_LUCENE_LARGE_RAW=raw dir`` and ``WEBSHOP_LUCENE_LARGE_CATALOG=its prepared
    catalog`` (whose index is used as is; without it an index is built here), e.g. the 1.2M-product catalog
    that ``agent-envs bench --products 1200000`` caches. Default thresholds: what a replica serves is checked.
    """
    raw = Path(str(LARGE_RAW))
    count = int(os.environ.get("WEBSHOP_LUCENE_LARGE_QUERIES", "200"))
    ids, texts, queries = instruction_queries(raw, count, seed=2)
    catalog = os.environ.get("WEBSHOP_LUCENE_LARGE_CATALOG")
    if catalog:
        index = BM25Index.open(Path(catalog) / "index")
    else:
        build_index(ids, texts, tmp_path / "index")
        index = BM25Index.open(tmp_path / "index")
    assert len(index) == len(ids)
    expected = lucene.search(ids, texts, queries)
    del texts
    differ = [
        query for query, theirs in zip(queries, expected, strict=True) if ranked_bits(index, query) != theirs
    ]
    assert not differ, f"{len(differ)} of {len(queries)} queries differ from Lucene, e.g. {differ[:3]}"
