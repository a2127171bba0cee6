"""Title nouns for the type reward, computed once per product at catalog-prepare time.

The original tags both titles with spaCy on every purchase and keeps the lower-cased tokens tagged NOUN or
PROPN, in order, with repeats. ``SpacyNounExtractor`` does the same (when spaCy and an English model are
installed). ``HeuristicNounExtractor`` is the documented fallback when they are not. It follows what the
small English model does with product titles: capitalised title words come out as proper nouns; lower-case
words count as nouns unless they are function words, common adjectives, or look like adjectives or
participles by their suffix; numbers never count. The prepared catalog records which extractor was used.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Protocol

_TOKEN = re.compile(r"[A-Za-z0-9]+(?:['’][A-Za-z]+)?|[^\sA-Za-z0-9]")

_FUNCTION_WORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "but",
        "nor",
        "for",
        "of",
        "in",
        "on",
        "at",
        "by",
        "to",
        "from",
        "with",
        "without",
        "into",
        "onto",
        "over",
        "under",
        "up",
        "down",
        "out",
        "off",
        "as",
        "than",
        "then",
        "so",
        "such",
        "this",
        "that",
        "these",
        "those",
        "it",
        "its",
        "it's",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "am",
        "do",
        "does",
        "did",
        "has",
        "have",
        "had",
        "will",
        "would",
        "can",
        "could",
        "should",
        "may",
        "might",
        "must",
        "shall",
        "not",
        "no",
        "yes",
        "all",
        "any",
        "each",
        "every",
        "both",
        "either",
        "neither",
        "some",
        "many",
        "much",
        "more",
        "most",
        "few",
        "less",
        "least",
        "own",
        "same",
        "other",
        "another",
        "i",
        "me",
        "my",
        "we",
        "our",
        "you",
        "your",
        "he",
        "him",
        "his",
        "she",
        "her",
        "they",
        "them",
        "their",
        "what",
        "which",
        "who",
        "whom",
        "whose",
        "when",
        "where",
        "why",
        "how",
        "if",
        "while",
        "per",
        "via",
        "about",
        "above",
        "after",
        "against",
        "along",
        "among",
        "around",
        "before",
        "behind",
        "below",
        "beneath",
        "beside",
        "between",
        "beyond",
        "during",
        "except",
        "inside",
        "near",
        "since",
        "through",
        "throughout",
        "toward",
        "towards",
        "until",
        "upon",
        "within",
    ]
)
_ADJECTIVES = frozenset(
    [
        "new",
        "best",
        "great",
        "good",
        "high",
        "low",
        "big",
        "small",
        "large",
        "little",
        "long",
        "short",
        "light",
        "dark",
        "soft",
        "hard",
        "easy",
        "heavy",
        "durable",
        "classic",
        "modern",
        "vintage",
        "portable",
        "waterproof",
        "slim",
        "wireless",
        "comfortable",
        "cute",
        "beautiful",
        "natural",
        "organic",
        "fresh",
        "pure",
        "clean",
        "sweet",
        "hot",
        "cold",
        "warm",
        "cool",
        "fast",
        "quick",
        "slow",
        "strong",
        "thin",
        "thick",
        "wide",
        "narrow",
        "deep",
        "full",
        "empty",
        "extra",
        "super",
        "ultra",
        "mini",
        "multi",
        "fit",
        "fitted",
        "casual",
        "elegant",
        "sexy",
        "compatible",
        "adjustable",
        "reusable",
        "rechargeable",
        "foldable",
        "washable",
        "breathable",
        "stretchy",
        "cozy",
        "plush",
        "sturdy",
        "stylish",
        "fashionable",
        "luxury",
        "professional",
        "heavy-duty",
        "free",
        "daily",
        "everyday",
        "perfect",
        "ideal",
        "unique",
        "original",
        "red",
        "blue",
        "green",
        "black",
        "white",
        "grey",
        "gray",
        "pink",
        "purple",
        "yellow",
        "orange",
        "brown",
        "beige",
        "navy",
        "silver",
        "gold",
    ]
)
_ADJECTIVE_SUFFIXES = ("ful", "less", "ous", "ive", "ible", "ish", "ical", "ing", "ed")
# Fixed adjectival pairs whose second word spaCy's small model tags as an adjective or verb even in title case
# ("Long Lasting", "Easy Clean"); the first word stays a (proper) noun there.
_ADJECTIVE_PAIRS = frozenset([("long", "lasting"), ("easy", "clean"), ("easy", "care"), ("quick", "dry")])
HEURISTIC = "heuristic-v3"


class NounExtractor(Protocol):
    name: str

    def nouns(self, titles: Iterable[str]) -> Iterator[list[str]]: ...


class HeuristicNounExtractor:
    """Fallback without an NLP model: content words of the title that do not look like adjectives."""

    name = HEURISTIC

    def nouns(self, titles: Iterable[str]) -> Iterator[list[str]]:
        for title in titles:
            tokens = _TOKEN.findall(title)
            previous = [""] + [t.lower() for t in tokens[:-1]]
            yield [
                token.lower()
                for token, before in zip(tokens, previous, strict=True)
                if self._is_noun(token) and (before, token.lower()) not in _ADJECTIVE_PAIRS
            ]

    @staticmethod
    def _is_noun(token: str) -> bool:
        lower = token.lower()
        if not token[0].isalpha() or lower in _FUNCTION_WORDS:
            return False
        if token[0].isupper():
            return True
        return lower not in _ADJECTIVES and not (len(lower) > 4 and lower.endswith(_ADJECTIVE_SUFFIXES))


class SpacyNounExtractor:
    """The original's rule: lower-cased ``token.text`` of tokens whose ``pos_`` is NOUN or PROPN."""

    def __init__(self, model: str = "en_core_web_sm") -> None:
        import spacy  # optional dependency

        # The whole pipeline, as the original loads it: disabling components (parser, ner, lemmatizer) would be
        # faster but changes some tags (e.g. "Gift" in "... Gluten Free, Great Gift"), and so some rewards.
        self._nlp = spacy.load(model)
        self.name = f"spacy-{spacy.__version__}/{model}-{self._nlp.meta.get('version', '?')}"

    def nouns(self, titles: Iterable[str]) -> Iterator[list[str]]:
        for doc in self._nlp.pipe(titles, batch_size=256):
            yield [token.text.lower() for token in doc if token.pos_ in ("NOUN", "PROPN")]


def default_noun_extractor(model: str = "en_core_web_sm") -> NounExtractor:
    """spaCy when it and the model are installed, otherwise the heuristic fallback."""
    try:
        return SpacyNounExtractor(model)
    except (ImportError, OSError):
        return HeuristicNounExtractor()
