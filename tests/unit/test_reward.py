"""The reward formula against the cases of the original's test-suite and docs/webshop-behaviour.md."""

from __future__ import annotations

import pytest

from agent_envs.envs.webshop.core.colors import normalize_color
from agent_envs.envs.webshop.core.fuzz import full_process, ratio, token_set_ratio
from agent_envs.envs.webshop.core.reward import (
    RewardGoal,
    RewardProduct,
    attribute_reward,
    compute_reward,
    option_reward,
    type_reward,
)


def product(**overrides) -> RewardProduct:
    fields = dict(
        title="Nike Men's Basketball Shoes",
        bullet_points=("breathable mesh", "rubber sole"),
        description="Great shoes for the court.",
        attributes=("non slip", "rubber sole", "lace up"),
        query="basketball shoes",
        product_category="Clothing › Men › Shoes › Athletic",
        title_nouns=("nike", "men", "basketball", "shoes"),
    )
    fields.update(overrides)
    return RewardProduct(**fields)


def goal(**overrides) -> RewardGoal:
    fields = dict(
        attributes=("non slip", "rubber sole", "lace up"),
        goal_options={"color": "red", "size": "9"},
        price_upper=100.0,
        query="basketball shoes",
        product_category="Clothing › Men › Shoes › Athletic",
        title_nouns=("nike", "men", "basketball", "shoes"),
    )
    fields.update(overrides)
    return RewardGoal(**fields)


class TestTypeReward:
    def test_identical_product(self) -> None:
        assert type_reward(product(), goal()) == {
            "r_type": 1.0,
            "query_match": True,
            "category_match": True,
            "title_score": 1.0,
        }

    @pytest.mark.parametrize(
        ("purchased", "wanted", "match"),
        [("b › c › a", "a › d › b", True), ("a › a › d", "a › b › c", False), ("x", "x", False)],
    )
    def test_category_needs_two_shared_parts(self, purchased: str, wanted: str, match: bool) -> None:
        info = type_reward(product(product_category=purchased), goal(product_category=wanted))
        assert info["category_match"] is match

    def test_duplicate_goal_nouns_lower_the_score(self) -> None:
        info = type_reward(product(title_nouns=("shoes",)), goal(title_nouns=("shoes", "shoes", "nike")))
        assert info["title_score"] == pytest.approx(1 / 3)

    def test_empty_goal_nouns_score_point_two(self) -> None:
        info = type_reward(product(query="x", product_category="y"), goal(title_nouns=()))
        assert info["title_score"] == 0.2
        assert info["r_type"] == 0.5  # 0.2 is not > 0.2 and nothing else matches

    @pytest.mark.parametrize(
        ("nouns", "r_type"),
        [(("nike",), 1.0), (("zzz",), 0.0)],
    )
    def test_query_match_does_not_protect_a_zero_title_score(self, nouns: tuple, r_type: float) -> None:
        assert type_reward(product(title_nouns=nouns), goal())["r_type"] == r_type

    def test_low_title_score_gives_point_one(self) -> None:
        nouns = tuple(f"n{i}" for i in range(11))
        info = type_reward(product(title_nouns=("n0",)), goal(title_nouns=nouns))
        assert info["title_score"] == pytest.approx(1 / 11)
        assert info["r_type"] == 0.1


class TestAttributeReward:
    def test_fuzzy_plural_matches(self) -> None:
        assert attribute_reward(product(attributes=("essential oils",)), ["essential oil"]) == (1.0, 1)

    def test_partial(self) -> None:
        r, n = attribute_reward(
            product(attributes=("non slip", "lace up")), ["non slip", "lace up", "waterproof"]
        )
        assert (r, n) == (pytest.approx(2 / 3), 2)

    def test_text_fallback_title_bullets_description(self) -> None:
        p = product(attributes=("DUMMY_ATTR",), title="Waterproof Boots", bullet_points=("memory foam",))
        r, n = attribute_reward(p, ["waterproof", "memory foam", "steel toe"])
        assert (r, n) == (pytest.approx(2 / 3), 2)

    def test_goal_attribute_is_not_lower_cased_for_the_text_fallback(self) -> None:
        p = product(attributes=("DUMMY_ATTR",), title="Waterproof Boots")
        assert attribute_reward(p, ["Waterproof"]) == (0.0, 0)

    def test_none(self) -> None:
        assert attribute_reward(product(attributes=("abc",)), ["xyz"]) == (0.0, 0)


class TestOptionReward:
    def test_exact(self) -> None:
        assert option_reward(["red", "9", "wide"], ["red", "9", "wide"]) == (1.0, 3)

    def test_partial(self) -> None:
        assert option_reward(["red", "10", "wide"], ["red", "9", "wide"]) == (pytest.approx(2 / 3), 2)

    def test_fuzzy(self) -> None:
        assert option_reward(["cool powder snow"], ["powder snow"]) == (1.0, 1)

    def test_no_goal_options(self) -> None:
        assert option_reward(["red"], []) == (None, 0)

    def test_no_purchased_options(self) -> None:
        assert option_reward([], ["red", "9"]) == (0.0, 0)

    def test_synthetic_goal_tuples_keep_the_option_name_in_play(self) -> None:
        # ('color', 'navy blue') is compared as the string "('color', 'navy blue')"; 'navy blue' -> 'blue'
        assert option_reward(["navy blue"], [("color", "navy blue")]) == (1.0, 1)
        # a tuple whose value *is* a colour becomes that colour
        assert option_reward(["red"], [("color", "red")]) == (1.0, 1)
        assert option_reward(["large"], [("size", "small")]) == (0.0, 0)


class TestComputeReward:
    def test_perfect_purchase(self) -> None:
        reward, info = compute_reward(product(), goal(), 50.0, {"color": "red", "size": "9"})
        assert reward == 1.0
        assert info == {
            "r_type": 1.0, "r_att": 1.0, "w_att": 0.5, "query_match": True, "category_match": True,
            "title_score": 1.0, "r_option": 1.0, "w_option": 2 / 6, "r_price": True, "w_price": 1 / 6,
        }  # fmt: skip

    def test_two_thirds(self) -> None:
        g = goal(attributes=("non slip", "waterproof"), goal_options={})
        reward, info = compute_reward(product(), g, 50.0, {"color": "red"})
        assert reward == 2 / 3
        assert "r_option" not in info and "w_option" not in info

    def test_over_the_price_ceiling(self) -> None:
        reward, info = compute_reward(product(), goal(attributes=("non slip",), goal_options={}), 100.01, {})
        assert reward == 0.5
        assert info["r_price"] is False

    def test_four_sevenths(self) -> None:
        g = goal(attributes=("non slip", "waterproof", "leather"), goal_options=["red", "9", "wide"])
        reward, _ = compute_reward(product(), g, 50.0, {"color": "red", "size": "9"})
        assert reward == pytest.approx(0.5714, abs=1e-4)

    def test_four_sevenths_halved_by_type(self) -> None:
        g = goal(attributes=("non slip", "waterproof", "leather"), goal_options=["red", "9", "wide"],
                 query="other", product_category="a › b", title_nouns=(*(f"w{i}" for i in range(6)), "nike"))  # fmt: skip
        reward, info = compute_reward(product(), g, 50.0, {"color": "red", "size": "9"})
        assert 0.1 <= info["title_score"] <= 0.2
        assert reward == pytest.approx(0.2857, abs=1e-4)


class TestNormalizeColor:
    @pytest.mark.parametrize(
        ("value", "expected"),
        [("black forest", "black"), ("violet lavender", "lavender"), ("123alabaster", "alabaster"),
         ("dark grey", "dark"), ("standard", "tan"), ("neon", "neon")],
    )  # fmt: skip
    def test_first_colour_of_the_list_wins(self, value: str, expected: str) -> None:
        assert normalize_color(value) == expected


class TestFuzz:
    def test_processing(self) -> None:
        assert full_process("Men's  T-Shirt!") == "men s  t shirt"
        assert full_process("caf\u00e9") == "caf"  # U+0080..U+00FF are deleted
        assert full_process(("color", "red")) == "color    red"

    def test_ratio_rounding_is_bankers(self) -> None:
        # 'ab' vs 'abc': 2 * 2 / 5 = 0.8 -> 80 ; equal strings 100 ; empty 0
        assert ratio("ab", "abc") == 80
        assert ratio("", "") == 100
        assert ratio("", "a") == 0

    def test_token_set(self) -> None:
        assert token_set_ratio("essential oils", "essential oil") > 85
        assert token_set_ratio("red", ("color", "red")) == 100
        assert token_set_ratio("!!!", "red") == 0
