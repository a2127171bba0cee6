"""``nlp``: a stand-in for the spaCy pipeline, tagging a title's prepared nouns PROPN."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class Token:
    text: str
    pos_: str


class _Nlp:
    def __init__(self) -> None:
        self._nouns: dict[str, list[str]] | None = None

    def __call__(self, title: str) -> list[Token]:
        if self._nouns is None:
            from agent_envs.envs.webshop.catalog.store import open_catalog

            catalog = open_catalog(os.environ["WEBSHOP_SHIM_CATALOG"])
            products = (catalog.product(i) for i in range(catalog.product_count))
            self._nouns = {p.title: list(p.title_nouns) for p in products}
        # title-cased like spaCy's token text (the adapter lower-cases), and one token the filter must drop
        return [*(Token(word.title(), "PROPN") for word in self._nouns[title]), Token("-", "PUNCT")]


nlp = _Nlp()
