"""The text observation of each page, and its clickables, built directly as strings.

The original renders HTML and reads its visible text nodes back (BeautifulSoup ``html.parser``): a node made
only of ASCII whitespace becomes ``'\\n'`` (dropped) when it holds a newline and ``' '`` otherwise; every kept
node is ``.strip()``-ped and the nodes are joined with ``' [SEP] '``. ``text_node`` applies that rule to one
templated value, so empty and blank values come out exactly as there (an empty bullet gives an empty segment
because its template puts a space before it; an empty description gives none).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from itertools import chain
from operator import itemgetter
from typing import NamedTuple

from .model import ProductRecord

SEP = " [SEP] "
RESULTS_PER_PAGE = 10
SEARCH_TOP_N = 50

BACK_TO_SEARCH = "back to search"
NEXT = "next >"
PREV = "< prev"
BUY_NOW = "buy now"
SEARCH = "search"
SUB_PAGES = ("description", "features", "reviews", "attributes")
_ASCII_WHITESPACE = " \t\n\r\f"


class PageKind(str, Enum):
    SEARCH = "search"
    RESULTS = "results"
    ITEM = "item"
    SUB = "sub"
    DONE = "done"


class ClickKind(str, Enum):
    BUTTON = "button"
    PRODUCT = "product"
    OPTION = "option"


@dataclass(frozen=True)
class Clickable:
    """What clicking a label does: press a button, open a product (its index), or pick an option (its group)."""

    kind: ClickKind
    target: str | int | None = None


BUTTON = Clickable(ClickKind.BUTTON)  # frozen: every button shares it


def text_node(value: str) -> str | None:
    """The segment one HTML text node contributes to the observation, or None when it contributes none."""
    if value == "":
        return None
    if not value.strip(_ASCII_WHITESPACE):  # ASCII whitespace only (one C call, not a loop over characters)
        return None if "\n" in value else ""
    return value.strip()


def join_nodes(nodes: Iterable[str]) -> str:
    """The observation text of a page's text nodes: ``text_node`` of each, inlined (every step renders a page)."""
    segments = []
    for node in nodes:
        if not node:
            continue
        if node.strip(_ASCII_WHITESPACE):
            segments.append(node.strip())
        elif "\n" not in node:
            segments.append("")
    return SEP.join(segments)


def render_search_page(instruction: str) -> str:
    return join_nodes(["WebShop", "Instruction:", instruction, "Search"])


class ResultEntry(NamedTuple):
    """A product as a results page lists it: its clickable label and target, and its text segments."""

    label: str  # the ASIN, lower-cased
    clickable: Clickable
    segments: tuple[str, ...]  # of its ASIN, title and price nodes


_LABEL_AND_CLICKABLE = itemgetter(0, 1)  # of a ResultEntry (C-level loops: a new search builds a page)
_SEGMENTS = itemgetter(2)


def result_entry(product: ProductRecord) -> ResultEntry:
    nodes = (text_node(value) for value in (product.asin, product.title, product.price_text))
    return ResultEntry(
        product.asin.lower(),
        Clickable(ClickKind.PRODUCT, product.index),
        tuple(segment for segment in nodes if segment is not None),
    )


def render_results_page(instruction: str, page: int, total: int, products: Sequence[ProductRecord]) -> str:
    return with_header(instruction, render_results_listing(page, total, [result_entry(p) for p in products]))


def render_results_listing(page: int, total: int, entries: Sequence[ResultEntry]) -> str:
    """A results page below its header: the same for every episode that shows this query's page."""
    segments = [f"Page {page} (Total results: {total})"]
    if page > 1:
        segments.append("< Prev")
    segments.append("Next >")
    segments.extend(chain.from_iterable(map(_SEGMENTS, entries)))
    return SEP.join(segments)


def with_header(instruction: str, body: str) -> str:
    """The page text of ``body`` (a non-empty ``join_nodes`` result) under the instruction header.

    Both parts always hold a segment ("Instruction:", then the page line or "< Prev"), so this equals joining
    all the nodes.
    """
    return _header_text(instruction) + SEP + body


@lru_cache(maxsize=4096)
def _header_text(instruction: str) -> str:
    """An episode's pages share its header: built once per instruction, not on every step."""
    return join_nodes(["Instruction:", instruction, "Back to Search"])


def render_item_page(instruction: str, product: ProductRecord, show_attrs: bool = False) -> str:
    return with_header(instruction, render_item_body(product, show_attrs))


def render_item_body(product: ProductRecord, show_attrs: bool = False) -> str:
    """An item page below its header: the same for every episode that shows this product."""
    nodes = ["< Prev"]
    for name, values in product.options.items():
        nodes.append(name)
        nodes += values
    nodes += [
        product.title,
        f"Price: {product.price_text}",
        "Rating: N.A.",
        "Description",
        "Features",
        "Reviews",
    ]
    if show_attrs:
        nodes.append("Attributes")
    nodes.append("Buy Now")
    return join_nodes(nodes)


def render_sub_page(instruction: str, product: ProductRecord, sub_page: str) -> str:
    nodes = ["< Prev"]
    if sub_page == "description":
        nodes.append(product.description)
    elif sub_page == "features":
        nodes += [" " + bullet for bullet in product.bullet_points]
    elif sub_page == "attributes":
        nodes += [*product.attributes, product.category, product.query, product.product_category]
    return with_header(instruction, join_nodes(nodes))


def tojson(value: object) -> str:
    """Jinja's ``tojson``: sorted keys, ASCII, and HTML-significant characters as \\u escapes."""
    text = json.dumps(value, sort_keys=True)
    return (
        text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("'", "\\u0027")
    )


def render_done_page(asin: str, options: dict[str, str], reward: float) -> str:
    nodes = [
        "Thank you for shopping with us!", "Your code:", "None", "(Paste it in your MTurk interface.)",
        "Purchased", "asin", asin, "options", tojson(options),
        "attrs", "None", "category", "None", "query", "None", "product category", "None",
        "Target", "asin", "options", "attrs", "price upper", "instuction text", "category",
        "product category", "query", "Goal", "None",
        "Reward", "Your score (min 0.0, max 1.0)", str(reward), "Reward Details", "None",
    ]  # fmt: skip
    return join_nodes(nodes)


def results_clickables(page: int, entries: Sequence[ResultEntry]) -> dict[str, Clickable]:
    clickables = {BACK_TO_SEARCH: BUTTON}
    if page > 1:
        clickables[PREV] = BUTTON
    clickables[NEXT] = BUTTON
    clickables.update(map(_LABEL_AND_CLICKABLE, entries))
    return clickables


def item_clickables(product: ProductRecord, show_attrs: bool = False) -> dict[str, Clickable]:
    """Buttons, then option values; a value seen twice keeps its first position and its last group."""
    buttons = [BACK_TO_SEARCH, PREV, "description", "features", "reviews"]
    if show_attrs:
        buttons.append("attributes")
    buttons.append(BUY_NOW)
    clickables = {name: BUTTON for name in buttons}
    for group, values in product.options.items():
        for value in values:
            clickables[value] = Clickable(ClickKind.OPTION, group)
    return clickables


SEARCH_CLICKABLES = {SEARCH: BUTTON}
SUB_PAGE_CLICKABLES = {BACK_TO_SEARCH: BUTTON, PREV: BUTTON}
DONE_CLICKABLES: dict[str, Clickable] = {}
