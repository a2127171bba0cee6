"""Action grammar and page text rules, from the golden cases in docs/webshop-behaviour.md."""

from __future__ import annotations

import itertools
import random
import re

import pytest

from agent_envs.envs.webshop.core.actions import parse_action
from agent_envs.envs.webshop.core.model import ProductRecord
from agent_envs.envs.webshop.core.pages import (
    SEP,
    item_clickables,
    join_nodes,
    render_done_page,
    render_item_page,
    render_results_page,
    render_search_page,
    render_sub_page,
    text_node,
)


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("search[Red Shoes]", ("search", "red shoes")),
        ("search[]", ("search[]", None)),
        ("click[a] extra", ("click", "a")),
        ("search[a[b]c]", ("search[a", "b]c")),
        ("Search[x]", ("Search", "x")),
        ("click[ Buy Now ]", ("click", " buy now ")),
        ("click[x\n]", ("click[x\n]", None)),
        ("buy now", ("buy now", None)),
    ],
)
def test_parse_action(action: str, expected: tuple) -> None:
    assert tuple(parse_action(action)) == expected


def test_parse_action_agrees_with_the_original_regex_on_every_short_string() -> None:
    """Every string of up to 7 characters over the grammar's significant characters, and longer random ones."""
    original = re.compile(r"(.+)\[(.+)\]")

    def expected(action: str) -> tuple[str, str | None]:
        match = original.match(action)
        return (action, None) if match is None else (match.group(1), match.group(2).lower())

    alphabet = "a[]\nB"
    cases = ["".join(chars) for n in range(8) for chars in itertools.product(alphabet, repeat=n)]
    rng = random.Random(0)
    cases += [
        "".join(rng.choice(alphabet + " \r") for _ in range(rng.randrange(8, 40))) for _ in range(20_000)
    ]
    for action in cases:
        assert tuple(parse_action(action)) == expected(action), repr(action)


@pytest.mark.parametrize(
    ("node", "segment"),
    [("", None), (" ", ""), ("   \t", ""), (" \n ", None), ("\n", None), (" x ", "x"), ("a\nb", "a\nb"),
     ("\u00a0", ""), ("\u00a0\n", ""), ("\x0b\n", ""), ("\f\r\n", None)],
)  # fmt: skip
def test_text_node_whitespace_rules(node: str, segment: str | None) -> None:
    assert text_node(node) == segment


def make_product(**overrides) -> ProductRecord:
    fields = dict(
        index=0, asin="B09P87V3LZ", title="Basketball Shoes", description="desc",
        bullet_points=("first", "second"), price_text="$100.0", price=100.0,
        options={"color": ("black", "purple", "red"), "size": ("6.5", "7.5", "8", "8.5", "9")},
        attributes=("DUMMY_ATTR",), category="fashion", query="shoes", product_category="a › b",
        title_nouns=("basketball", "shoes"),
    )  # fmt: skip
    fields.update(overrides)
    return ProductRecord(**fields)


def test_golden_pages() -> None:
    product = make_product()
    assert render_search_page("find shoes") == "WebShop [SEP] Instruction: [SEP] find shoes [SEP] Search"
    assert render_item_page("find shoes", product) == (
        "Instruction: [SEP] find shoes [SEP] Back to Search [SEP] < Prev [SEP] color [SEP] black [SEP] purple "
        "[SEP] red [SEP] size [SEP] 6.5 [SEP] 7.5 [SEP] 8 [SEP] 8.5 [SEP] 9 [SEP] Basketball Shoes [SEP] "
        "Price: $100.0 [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now"
    )
    assert render_results_page("i", 2, 24, [product]) == (
        "Instruction: [SEP] i [SEP] Back to Search [SEP] Page 2 (Total results: 24) [SEP] < Prev [SEP] Next > "
        "[SEP] B09P87V3LZ [SEP] Basketball Shoes [SEP] $100.0"
    )
    assert render_results_page("i", 4, 24, []).endswith(
        "Page 4 (Total results: 24) [SEP] < Prev [SEP] Next >"
    )
    assert (
        render_sub_page("i", product, "reviews") == "Instruction: [SEP] i [SEP] Back to Search [SEP] < Prev"
    )


def test_features_page_blank_bullets() -> None:
    product = make_product(bullet_points=("", "  ", "first\nsecond", "\n"))
    assert render_sub_page("i", product, "features") == (
        "Instruction: [SEP] i [SEP] Back to Search [SEP] < Prev [SEP]  [SEP]  [SEP] first\nsecond"
    )


@pytest.mark.parametrize(
    ("description", "tail"), [("", "< Prev"), (" ", "< Prev [SEP] "), ("x", "< Prev [SEP] x")]
)
def test_description_page_blank(description: str, tail: str) -> None:
    assert render_sub_page("i", make_product(description=description), "description").endswith(tail)


def test_done_page_escapes_options_like_jinja_tojson() -> None:
    text = render_done_page("B0X", {"size": "<1>", "color": "men's black | white"}, 0.5)
    assert '{"color": "men\\u0027s black | white", "size": "\\u003c1\\u003e"}' in text
    assert text.endswith(
        "Reward [SEP] Your score (min 0.0, max 1.0) [SEP] 0.5 [SEP] Reward Details [SEP] None"
    )


def test_repeated_option_values_collapse_to_the_last_group_first_position() -> None:
    product = make_product(options={"size": ("small", "large"), "style": ("small", "buy now", "round")})
    clickables = item_clickables(product)
    assert list(clickables) == [
        "back to search", "< prev", "description", "features", "reviews", "buy now", "small", "large", "round",
    ]  # fmt: skip
    assert clickables["small"].target == "style"


def test_join_nodes_drops_newline_only_nodes() -> None:
    assert join_nodes(["a", "\n", " ", "b"]) == "a [SEP]  [SEP] b"


def test_join_nodes_applies_text_node_to_every_node() -> None:
    """join_nodes inlines text_node (it runs on every step): both must keep giving the same segments."""
    import random

    rng = random.Random(0)
    alphabet = " \t\n\r\fab\u00a0\x0b"
    for _ in range(5000):
        nodes = [
            "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5))) for _ in range(rng.randint(0, 6))
        ]
        expected = SEP.join(segment for segment in map(text_node, nodes) if segment is not None)
        assert join_nodes(nodes) == expected, nodes
