"""The search engine: Lucene 8 SmallFloat norms, the analysis chain, Porter stems and BM25 ranking."""

from __future__ import annotations

import math
import random
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from agent_envs.envs.webshop.search import bm25
from agent_envs.envs.webshop.search.analyzer import (
    STOP_WORDS,
    analyze,
    lower_case,
    normalize_token,
    strip_possessive,
    tokenize,
)
from agent_envs.envs.webshop.search.bm25 import (
    LENGTH_TABLE,
    NUM_FREE_VALUES,
    BM25Index,
    bm25_cache,
    build_index,
    byte4_to_int,
    int4_to_long,
    int_to_byte4,
    long_to_int4,
    norm_bytes,
)
from agent_envs.envs.webshop.search.porter import stem

# --- SmallFloat -----------------------------------------------------------------------------------------------


def test_num_free_values_is_24() -> None:
    assert NUM_FREE_VALUES == 24


def test_int4_round_trip_keeps_four_significant_bits() -> None:
    for value in range(17):
        assert int4_to_long(long_to_int4(value)) == value  # exact up to 16
    rng = random.Random(7)
    for _ in range(2000):
        value = rng.randrange(0, 1 << rng.randint(5, 61))
        expected = value
        if value.bit_length() > 4:
            expected &= ~0 << (value.bit_length() - 4)
        assert int4_to_long(long_to_int4(value)) == expected
    decoded = [int4_to_long(i) for i in range(long_to_int4(2**63 - 1) + 1)]
    assert decoded == sorted(set(decoded))  # strictly increasing


def test_byte4_round_trips_and_is_monotonic() -> None:
    decoded = [byte4_to_int(b) for b in range(256)]
    for b, value in enumerate(decoded):
        assert int_to_byte4(value) == b
    assert decoded == sorted(set(decoded))
    assert int_to_byte4(2**31 - 1) == 255
    for value in range(NUM_FREE_VALUES):
        assert byte4_to_int(int_to_byte4(value)) == value  # short documents keep their exact length
    rng = random.Random(3)
    for _ in range(2000):
        value = rng.randrange(0, 1 << rng.randint(5, 30))
        b = int_to_byte4(value)
        assert decoded[b] <= value and (b == 255 or decoded[b + 1] > value)


@pytest.mark.parametrize(
    ("length", "stored"),
    [
        (0, 0),
        (1, 1),
        (23, 23),
        (24, 24),
        (31, 31),
        (32, 32),
        (39, 39),
        (40, 40),
        (41, 40),
        (43, 42),
        (100, 96),
    ],
)
def test_known_length_encodings(length: int, stored: int) -> None:
    assert byte4_to_int(int_to_byte4(length)) == stored


def test_vectorised_norms_match_scalar_encoding() -> None:
    lengths = np.array([*range(0, 3000), 10**5, 10**6, 2**31 - 1], dtype=np.int64)
    assert norm_bytes(lengths).tolist() == [int_to_byte4(int(n)) for n in lengths]
    assert LENGTH_TABLE.dtype == np.float32 and LENGTH_TABLE[100] == byte4_to_int(100)


def test_cache_is_computed_in_float32() -> None:
    avgdl = np.float32(21.726667)
    cache = bm25_cache(avgdl)
    assert cache.dtype == np.float32
    k1, b = np.float32(0.9), np.float32(0.4)
    for i in (0, 5, 23, 24, 57, 255):
        expected = np.float32(1) / (k1 * ((np.float32(1) - b) + b * np.float32(byte4_to_int(i)) / avgdl))
        assert cache[i] == expected


# --- analysis chain -------------------------------------------------------------------------------------------
# The expected tokens below are what Lucene 8.7's StandardTokenizer / this analysis chain produce.


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("Wikipedia's O'Reilly you're don't", ["Wikipedia's", "O'Reilly", "you're", "don't"]),
        (
            "some-dashed-phrase dogs,chase,cats ac/dc",
            ["some", "dashed", "phrase", "dogs", "chase", "cats", "ac", "dc"],
        ),
        (
            "21.35 R2D2 C3PO 216.239.63.104 1,000 6.5",
            ["21.35", "R2D2", "C3PO", "216.239.63.104", "1,000", "6.5"],
        ),
        ("U.S.A. e.g. 3.5mm 10pcs", ["U.S.A", "e.g", "3.5mm", "10pcs"]),
        ("color:red size: large", ["color:red", "size", "large"]),  # ':' joins letters (MidLetter)
        ("a_b __x__ ___ 1_000", ["a_b", "__x__", "1_000"]),  # '_' joins, alone it is no token
        ("a.1 1.a 1a.b a1,2 1;2", ["a", "1", "1", "a", "1a.b", "a1,2", "1;2"]),
        ("$12.99 | 50% off & more + (new) [x]", ["12.99", "50", "off", "more", "new", "x"]),
        ("men’s shoes ＂quoted＂", ["men’s", "shoes", "quoted"]),
        ('"QUOTED" word', ["QUOTED", "word"]),
    ],
)
def test_tokenizer_cases(text: str, tokens: list[str]) -> None:
    assert tokenize(text) == tokens


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("安녕하세요 한글입니다", ["安", "녕하세요", "한글입니다"]),  # Han alone, Hangul runs
        ("仮名遣い カタカナ", ["仮", "名", "遣", "い", "カタカナ"]),  # one token per Han / Hiragana char
        ("ภาษาไทย ok", ["ภาษาไทย", "ok"]),  # South-East-Asian runs stay whole
        ("Café naïve cafe\u0301", ["Café", "naïve", "cafe\u0301"]),  # combining marks stay attached
        ("Apple® iPhone™ ©2020", ["Apple", "®", "iPhone", "™", "©", "2020"]),  # ©®™ are emoji tokens
        ("❤️ ★ ✔ 👍🏻 👨\u200d👩\u200d👧 🇺🇸 #️⃣", ["❤️", "★", "✔", "👍🏻", "👨\u200d👩\u200d👧", "🇺🇸", "#️⃣"]),
        ("soft\u00adware zero\u200bwidth", ["soft\u00adware", "zero", "width"]),  # soft hyphen is Format
        ("א' p:א' א\"ב a.א\"ב", ["א'", "p:א", 'א"ב', "a.א", "ב"]),  # Hebrew quotes (WB7a-c)
        ("ℹ\u200d© ℹ️ Ⓜabc", ["ℹ\u200d©", "ℹ️", "Ⓜabc"]),  # letters that are emoji too
        (
            "😀\u200d 🏻\u200d \u200d🏻 👍\u200d\u200d🏻",
            ["😀\u200d", "🏻\u200d", "🏻", "👍\u200d\u200d🏻"],
        ),  # ZWJs
        ("a\u202fb ‿x １２３ ٣٤ 1٣", ["a\u202fb", "‿x", "１２３", "٣٤", "1٣"]),  # joiners and other digits
    ],
)
def test_tokenizer_unicode_cases(text: str, tokens: list[str]) -> None:
    assert tokenize(text) == tokens


def test_long_tokens_are_chopped_at_255() -> None:
    assert tokenize("a" * 600 + " b") == ["a" * 255, "a" * 255, "a" * 90, "b"]
    assert tokenize("é" * 300) == ["é" * 255, "é" * 45]


def test_possessive_filter() -> None:
    assert strip_possessive("men's") == "men"
    assert strip_possessive("MEN'S") == "MEN"
    assert strip_possessive("men’s") == "men"
    assert strip_possessive("men＇s") == "men"
    assert strip_possessive("'s") == ""
    assert strip_possessive("mens") == "mens"
    assert strip_possessive("o'reilly") == "o'reilly"


def test_lower_case_is_javas_per_code_point_mapping() -> None:
    assert lower_case("MEN") == "men"
    assert lower_case("İSTANBUL") == "istanbul"  # str.lower gives "i̇stanbul"
    assert lower_case("ΣΊΣΥΦΟΣ") == "σίσυφοσ"  # no final-sigma rule
    assert analyze("ΣΊΣΥΦΟΣ İstanbul") == ["σίσυφοσ", "istanbul"]


def test_stop_words_are_lucenes_33() -> None:
    assert len(STOP_WORDS) == 33
    assert analyze("the cat and the hat is on a mat with no shoes") == ["cat", "hat", "mat", "shoe"]
    assert analyze("it's") == []  # possessive first, then "it" is a stop word
    assert normalize_token("The") is None  # lower-cased before the stop filter


def test_analyze_full_chain() -> None:
    assert analyze("Men's Running Shoes, Size: 10.5 - Wi-Fi") == [
        "men",
        "run",
        "shoe",
        "size",
        "10.5",
        "wi",
        "fi",
    ]
    assert analyze("Possibly the BEST archaeology books") == ["possibl", "best", "archaeolog", "book"]
    assert analyze("") == []
    assert analyze("a an the of") == []


# --- Porter stemmer -------------------------------------------------------------------------------------------

PORTER_CASES = (
    "caresses:caress ponies:poni ties:ti caress:caress cats:cat feed:feed agreed:agre plastered:plaster bled:bled "
    "motoring:motor sing:sing conflated:conflat troubled:troubl sized:size hopping:hop tanned:tan falling:fall "
    "hissing:hiss fizzed:fizz failing:fail filing:file happy:happi sky:sky relational:relat conditional:condit "
    "rational:ration valenci:valenc hesitanci:hesit digitizer:digit conformabli:conform radicalli:radic "
    "differentli:differ vileli:vile analogousli:analog vietnamization:vietnam predication:predic operator:oper "
    "feudalism:feudal decisiveness:decis hopefulness:hope callousness:callous formaliti:formal sensitiviti:sensit "
    "sensibiliti:sensibl triplicate:triplic formative:form formalize:formal electriciti:electr electrical:electr "
    "hopeful:hope goodness:good revival:reviv allowance:allow inference:infer airliner:airlin gyroscopic:gyroscop "
    "adjustable:adjust defensible:defens irritant:irrit replacement:replac adjustment:adjust dependent:depend "
    "adoption:adopt homologou:homolog communism:commun activate:activ angulariti:angular homologous:homolog "
    "effective:effect bowdlerize:bowdler probate:probat rate:rate cease:ceas controll:control roll:roll "
    "generalization:gener oscillators:oscil"
)


@pytest.mark.parametrize(("word", "expected"), [pair.split(":") for pair in PORTER_CASES.split()])
def test_porter_reference_vocabulary(word: str, expected: str) -> None:
    assert stem(word) == expected


def test_porter_departures_from_the_paper() -> None:
    # Lucene (= Porter's reference code) maps -bli to -ble (the paper: -abli to -able) and adds -logi to -log.
    assert stem("possibly") == "possibl"  # paper: possibli
    assert stem("sensibly") == "sensibl"
    assert stem("terribly") == "terribl"
    assert stem("archaeology") == "archaeolog"  # paper: archaeologi
    assert stem("apology") == "apolog"


def test_porter_short_and_odd_words() -> None:
    assert stem("is") == "is" and stem("as") == "as"  # two letters or fewer stay
    assert stem("yyy") == "yyi"
    assert stem("10pcs") == "10pc"
    assert stem("i.e") == "i."
    assert stem("sizes") == "size"
    # Java stems UTF-16 units: a supplementary character counts twice towards the 3-unit minimum.
    assert stem("\U0001d41ats") == "\U0001d41at"


def test_porter_leaves_words_not_ending_in_a_letter_alone() -> None:
    """Why ``stem`` may skip them: the full algorithm, run step by step, never changes such a word."""
    from agent_envs.envs.webshop.search.porter import _Stemmer

    def all_steps(word: str) -> str:
        stemmer = _Stemmer(word)
        for step in (
            stemmer.step1,
            stemmer.step2,
            stemmer.step3,
            stemmer.step4,
            stemmer.step5,
            stemmer.step6,
        ):
            step()
        return stemmer.result()

    rng = random.Random(4)
    letters, endings = "aeiouysbcdlnt", "0123456789.-'_AZé²"
    for _ in range(20_000):
        word = "".join(rng.choices(letters + endings, k=rng.randint(2, 12))) + rng.choice(endings)
        assert all_steps(word) == word == stem(word), word
    for number in (
        "2024",
        "10",
        "007",
        "\u0663\u0664\u0665",
        "\U0001d7cf\U0001d7d0\U0001d7d1",
    ):  # ASCII, Arabic, math
        assert (
            number.isdigit() and normalize_token(number) == number
        )  # what the query path's shortcut assumes


# --- BM25 ranking ---------------------------------------------------------------------------------------------

WORDS = ["red", "blue", "shirt", "soft", "cotton", "long", "dress", "shoe", "lamp", "desk", "wood", "metal"]


class ReferenceBM25:
    """Lucene 8 BM25 written out one document and term at a time (float32 steps, double sum)."""

    def __init__(self, corpus: dict[str, str]) -> None:
        self.terms = {doc_id: Counter(analyze(text)) for doc_id, text in corpus.items()}
        self.lengths = {doc_id: sum(counts.values()) for doc_id, counts in self.terms.items()}
        self.doc_count = sum(1 for length in self.lengths.values() if length)
        self.avgdl = np.float32(sum(self.lengths.values()) / self.doc_count)

    def rank(self, query: str, k: int = 50) -> list[tuple[str, np.float32]]:
        k1, b = np.float32(0.9), np.float32(0.4)
        totals: dict[str, float] = {}
        for term, count in Counter(analyze(query)).items():
            df = sum(1 for counts in self.terms.values() if term in counts)
            if df == 0:
                continue
            idf = np.float32(math.log(1 + (self.doc_count - df + 0.5) / (df + 0.5)))
            weight = np.float32(count) * idf
            for doc_id, counts in self.terms.items():
                if term not in counts:
                    continue
                length = np.float32(byte4_to_int(int_to_byte4(self.lengths[doc_id])))
                norm_inverse = np.float32(1) / (k1 * ((np.float32(1) - b) + b * length / self.avgdl))
                score = weight - weight / (np.float32(1) + np.float32(counts[term]) * norm_inverse)
                totals[doc_id] = totals.get(doc_id, 0.0) + float(score)
        ranked = sorted(
            ((np.float32(t), doc_id) for doc_id, t in totals.items()), key=lambda x: (-x[0], x[1])
        )
        return [(doc_id, score) for score, doc_id in ranked[:k]]

    def ids(self, query: str, k: int = 50) -> list[str]:
        return [doc_id for doc_id, _ in self.rank(query, k)]


def make_index(tmp_path: Path, corpus: dict[str, str]) -> BM25Index:
    build_index(list(corpus), list(corpus.values()), tmp_path / "index")
    return BM25Index.open(tmp_path / "index")


def random_corpus(seed: int, size: int) -> dict[str, str]:
    rng = random.Random(seed)
    corpus = {}
    while len(corpus) < size:
        doc_id = "".join(rng.choice("ABCDEFGH0123") for _ in range(rng.randint(3, 6)))
        length = rng.choice([rng.randint(0, 30), rng.randint(20, 120)])
        weights = [1 / (i + 1) for i in range(len(WORDS))]
        corpus[doc_id] = " ".join(
            rng.choices(WORDS, weights, k=length) + rng.choices(["the", "and", "of"], k=3)
        )
    return corpus


def test_reference_words_are_their_own_terms() -> None:
    assert [analyze(word) for word in WORDS] == [[word] for word in WORDS]


@pytest.mark.parametrize("path", ["exhaustive", "pruned"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_scores_match_the_lucene_formula(tmp_path: Path, path: str, seed: int) -> None:
    # prune_min_postings decides which of the two paths runs: check both against the reference
    corpus = random_corpus(seed, 300)
    index = make_index(tmp_path, corpus)
    index.prune_min_postings = 0 if path == "pruned" else 10**18
    reference = ReferenceBM25(corpus)
    rng = random.Random(seed)
    queries = ["red", "lamp", "red shirt", "wood wood metal", "blue soft cotton long dress", "the red"]
    queries += [" ".join(rng.choices(WORDS, k=rng.randint(1, 6))) for _ in range(20)]
    for query in queries:
        for k in (1, 10, 50, 1000):
            expected = reference.rank(query, k)
            positions, scores = index.rank(query, k)
            got = [(index.doc_id(int(p)), s) for p, s in zip(positions, scores, strict=True)]
            assert [doc_id for doc_id, _ in got] == [doc_id for doc_id, _ in expected], (query, k)
            assert [s.tobytes() for _, s in got] == [s.tobytes() for _, s in expected], (query, k)
            assert index.search(query, k) == [doc_id for doc_id, _ in expected]


def test_big_candidate_sets_use_the_sampled_bound(tmp_path: Path) -> None:
    corpus = random_corpus(11, 6000)  # > 4096 candidates: the sampled k-th bound runs
    index = make_index(tmp_path, corpus)
    reference = ReferenceBM25(corpus)
    for query in ("red", "red blue", "shirt soft", "metal"):
        assert index.search(query) == reference.ids(query)


def test_ties_break_by_document_id(tmp_path: Path) -> None:
    corpus = {"B9": "red shirt", "A1": "red shirt", "C3": "red shirt", "B10": "red shirt", "Z": "blue"}
    index = make_index(tmp_path, corpus)
    assert index.search("red") == ["A1", "B10", "B9", "C3"]
    assert index.search("red", k=2) == ["A1", "B10"]
    assert index.search_positions("red") == [0, 1, 2, 3]  # documents are numbered in id order
    assert [index.doc_id(i) for i in range(5)] == ["A1", "B10", "B9", "C3", "Z"]


def test_repeated_query_terms_boost_their_clause(tmp_path: Path) -> None:
    corpus = {"A": "red", "B": "shirt", "C": "lamp desk"}
    index = make_index(tmp_path, corpus)
    assert index.search("red shirt") == ["A", "B"]  # equal scores: id order
    assert index.search("shirt shirt red") == ["B", "A"]  # "shirt" counts twice
    _, once = index.rank("shirt")
    _, twice = index.rank("shirt shirt")
    assert twice[0] == np.float32(2) * index.idf[index.vocab["shirt"]] - (
        np.float32(2) * index.idf[index.vocab["shirt"]]
    ) / np.float32(index.denoms[index.offsets[index.vocab["shirt"]]])
    assert twice[0] > once[0]


def test_queries_without_terms_find_nothing(tmp_path: Path) -> None:
    index = make_index(tmp_path, {"A": "red shirt", "B": "blue dress"})
    assert index.search("") == []
    assert index.search("the and of a") == []  # stop words only
    assert index.search("-- | $ &") == []  # no tokens at all
    assert index.search("purple") == []  # not in the index
    assert index.search("purple shirt") == ["A"]
    assert index.search("red", k=0) == []
    assert index.search_positions("purple") == []


def test_only_documents_with_a_query_term_match(tmp_path: Path) -> None:
    corpus = {f"D{i:03d}": ("red " if i % 3 == 0 else "blue ") + "shirt " * (i % 5) for i in range(90)}
    index = make_index(tmp_path, corpus)
    assert len(index.search("red", k=50)) == 30
    assert set(index.search("red lamp", k=50)) == {d for d, t in corpus.items() if "red" in t}
    assert len(index.search("blue red", k=1000)) == 90


def test_query_terms_word_by_word_equal_the_token_by_token_analysis(tmp_path: Path) -> None:
    """The search path looks up whole words of ASCII queries (cached); it must give the tokens' term ids."""
    corpus = {"A": "red shirt men's team 40.00 l'eau d'issey a_b 3,5 x" + "y" * 300, "B": "blue Shirts 10pcs"}
    index = make_index(tmp_path, corpus)
    fragments = ["red", "Red's", "shirts", "40.00", "40.", "l'eau", "d'issey", "a_b", "_", "__x", "3,5", "3;",
                 ",", ".", "'", ":", "-", "$", "10pcs", "the", "unknown", "2024", "x" + "y" * 300, "e\u0301"]  # fmt: skip
    separators = [" ", "  ", "\t", "\n", "\x1c", ""]
    rng = random.Random(2)
    for _ in range(3000):
        query = "".join(rng.choice(fragments) + rng.choice(separators) for _ in range(rng.randint(0, 12)))
        expected = [index._term_ids[token] for token in tokenize(query)]
        assert index._query_terms(query).tolist() == expected, repr(query)
        assert index._query_terms(query).tolist() == expected, repr(query)  # again, from the caches


def test_index_files_and_statistics(tmp_path: Path) -> None:
    corpus = {"B": "Red shirts for the men's team", "A": "", "C": "the of and"}
    index = make_index(tmp_path, corpus)
    meta = index.meta
    assert meta["num_docs"] == 3
    assert meta["doc_count"] == 1  # documents with no indexed term do not count (Lucene's docCount)
    assert meta["sum_total_term_freq"] == 4  # red shirt men team
    assert np.float32(meta["avgdl"]) == np.float32(4.0)
    assert sorted(index.vocab) == ["men", "red", "shirt", "team"]
    assert index.norms.tolist() == [0, 4, 0]
    assert index.search("shirt") == ["B"]
    for name in ("postings_docs.npy", "postings_denoms.npy", "term_offsets.npy", "idf.npy", "doc_ids.npy"):
        assert isinstance(np.load(tmp_path / "index" / name, mmap_mode="r"), np.memmap)


def test_empty_index(tmp_path: Path) -> None:
    index = make_index(tmp_path, {})
    assert len(index) == 0
    assert index.search("red") == []


def test_build_accepts_iterables_and_rejects_bad_input(tmp_path: Path) -> None:
    corpus = random_corpus(5, 40)
    build_index(iter(corpus), (text for text in corpus.values()), tmp_path / "a", progress=False)
    assert BM25Index.open(tmp_path / "a").search("red") == ReferenceBM25(corpus).ids("red")
    with pytest.raises(ValueError, match="duplicate"):
        build_index(["A", "B", "A"], ["x", "y", "z"], tmp_path / "b")
    with pytest.raises(ValueError):
        build_index(["A", "B"], ["x"], tmp_path / "c")
    with pytest.raises(FileNotFoundError):
        BM25Index.open(tmp_path / "missing")


def test_chunked_build_equals_single_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = random_corpus(9, 500)
    one = make_index(tmp_path / "one", corpus)
    monkeypatch.setattr(bm25, "_CHUNK_DOCS", 7)
    monkeypatch.setattr(bm25, "_SORT_POSTINGS_MIN_DF", 1)
    many = make_index(tmp_path / "many", corpus)
    for query in ("red", "red shirt metal", "lamp desk wood"):
        assert one.search(query) == many.search(query)
        assert one.rank(query)[1].tobytes() == many.rank(query)[1].tobytes()


def test_concurrent_searches_agree(tmp_path: Path) -> None:
    corpus = random_corpus(4, 400)
    index = make_index(tmp_path, corpus)
    queries = ["red shirt", "blue soft cotton", "wood metal", "lamp"] * 25
    expected = [index.search(q) for q in queries]
    results: dict[int, list[list[str]]] = {}

    def worker(n: int) -> None:
        results[n] = [index.search(q) for q in queries]

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(result == expected for result in results.values())
