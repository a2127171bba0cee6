"""The fallback noun extractor stays close to spaCy's nouns on product titles (recorded in the fixtures)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_envs.envs.webshop.catalog.raw import iter_products
from agent_envs.envs.webshop.core.nouns import HeuristicNounExtractor, default_noun_extractor

CONFORMANCE = Path(__file__).parents[1] / "fixtures" / "conformance" / "original-seed3"


def test_heuristic_agrees_with_recorded_spacy_nouns() -> None:
    reference = json.loads((CONFORMANCE / "synthetic-goals" / "title_nouns.json").read_text())
    products = list(iter_products(CONFORMANCE / "raw"))
    found = HeuristicNounExtractor().nouns(p.title for p in products)
    true_positive = false_positive = false_negative = 0
    for product, nouns in zip(products, found, strict=True):
        ours, theirs = set(nouns), set(reference[product.asin])
        true_positive += len(ours & theirs)
        false_positive += len(ours - theirs)
        false_negative += len(theirs - ours)
    precision = true_positive / (true_positive + false_positive)
    recall = true_positive / (true_positive + false_negative)
    assert precision > 0.95 and recall > 0.9, (precision, recall)


def test_heuristic_rules() -> None:
    (nouns,) = HeuristicNounExtractor().nouns(
        ["Orbit Slim Fit Bluetooth Speaker - long lasting design for 2 rooms"]
    )
    assert nouns == ["orbit", "slim", "fit", "bluetooth", "speaker", "design", "rooms"]


def test_default_extractor_falls_back_without_a_model() -> None:
    assert isinstance(default_noun_extractor(model="no_such_model_xyz"), HeuristicNounExtractor)


def test_heuristic_gives_spacys_whole_noun_list_for_most_titles() -> None:
    """Per title, not per noun: the type reward compares whole lists (176/300 titles with heuristic-v2)."""
    reference = json.loads((CONFORMANCE / "synthetic-goals" / "title_nouns.json").read_text())
    products = list(iter_products(CONFORMANCE / "raw"))
    found = HeuristicNounExtractor().nouns(p.title for p in products)
    same = sum(nouns == reference[p.asin] for p, nouns in zip(products, found, strict=True))
    assert same / len(products) >= 0.77, f"{same}/{len(products)} titles"


def test_spacy_extractor_runs_the_whole_pipeline(monkeypatch) -> None:
    """The original loads the model with every component; disabling any changes some tags."""
    import sys
    import types
    import typing

    calls = []

    class FakeNlp:
        meta: typing.ClassVar[dict[str, str]] = {"version": "3.8.0"}

        def pipe(self, titles, batch_size):
            return []

    fake = types.SimpleNamespace(__version__="3.8.18", load=lambda *a, **k: calls.append((a, k)) or FakeNlp())
    monkeypatch.setitem(sys.modules, "spacy", fake)
    from agent_envs.envs.webshop.core.nouns import SpacyNounExtractor

    extractor = SpacyNounExtractor()
    assert calls == [(("en_core_web_sm",), {})]
    assert extractor.name == "spacy-3.8.18/en_core_web_sm-3.8.0"


def test_spacy_extractor_gives_the_recorded_nouns_when_installed() -> None:
    """With `make spacy` (spaCy 3.8 + en_core_web_sm 3.8), every recorded title's noun list is reproduced."""
    extractor = default_noun_extractor()
    if isinstance(extractor, HeuristicNounExtractor):
        pytest.skip("spaCy and an English model are not installed (make spacy)")
    reference = json.loads((CONFORMANCE / "synthetic-goals" / "title_nouns.json").read_text())
    products = list(iter_products(CONFORMANCE / "raw"))
    found = list(extractor.nouns(p.title for p in products))
    assert found == [reference[p.asin] for p in products]


def test_extractor_by_name() -> None:
    from agent_envs.envs.webshop.core.nouns import noun_extractor_named

    assert isinstance(noun_extractor_named("heuristic"), HeuristicNounExtractor)
    with pytest.raises(ValueError, match="unknown noun extractor"):
        noun_extractor_named("nltk")
    try:
        extractor = noun_extractor_named("spacy")
    except ValueError as error:
        assert "make spacy" in str(error)
    else:
        assert extractor.name.startswith("spacy-")
