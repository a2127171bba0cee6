"""Episode transitions of the stateless environment (on the conformance catalog)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_envs.envs.webshop.core.env import EpisodeFinished, EpisodeState, UnknownGoal, WebShopEnv
from agent_envs.envs.webshop.core.oracle import expert_actions, run_actions
from agent_envs.envs.webshop.core.pages import PageKind


@pytest.fixture(scope="module")
def env(conformance_catalog) -> WebShopEnv:
    return WebShopEnv(conformance_catalog)


def item_page(env: WebShopEnv, goal: int = 0):
    actions = expert_actions(env, goal)
    steps = run_actions(env, goal, actions[:-1])
    assert steps[-1].state.page is PageKind.ITEM
    return steps[-1], actions


@pytest.mark.parametrize("goal", [-1, 1153, 10**9])
def test_out_of_range_goal_is_a_clear_error(env: WebShopEnv, goal: int) -> None:
    with pytest.raises(UnknownGoal, match="out of range"):
        env.reset(goal)


def test_unknown_goal_set(env: WebShopEnv) -> None:
    with pytest.raises(UnknownGoal, match="no 'robots' goals"):
        env.reset(0, goal_set="robots")


@pytest.mark.parametrize(
    "action", ["click[search]", "search[]", "Search[x]", "click[nothing]", "buy now", ""]
)
def test_invalid_actions_change_nothing(env: WebShopEnv, action: str) -> None:
    start = env.reset(3)
    after = env.step(start.state, action)
    assert after.observation == start.observation
    assert after.reward == 0 and not after.done
    assert after.info == {"valid": False, "steps": 1}
    assert after.state == EpisodeState(**{**start.state.__dict__, "steps": 1})


def test_search_works_on_any_page_and_resets_options(env: WebShopEnv) -> None:
    step, _ = item_page(env)
    option = step.available_actions["clickables"][6]
    chosen = env.step(step.state, f"click[{option}]")
    assert dict(chosen.state.options)
    searched = env.step(chosen.state, "search[shoes]")
    assert searched.state.page is PageKind.RESULTS
    assert dict(searched.state.options) == {} and searched.state.product is None


def test_prev_from_item_resets_options_but_sub_page_keeps_them(env: WebShopEnv) -> None:
    step, _ = item_page(env)
    option = step.available_actions["clickables"][6]
    chosen = env.step(step.state, f"click[{option}]")
    sub = env.step(chosen.state, "click[features]")
    back = env.step(sub.state, "click[< prev]")
    assert back.state.page is PageKind.ITEM and dict(back.state.options) == dict(chosen.state.options)
    results = env.step(back.state, "click[< prev]")
    assert results.state.page is PageKind.RESULTS and dict(results.state.options) == {}
    assert results.state.page_num == step.state.page_num


def test_paging_past_the_end_keeps_next(env: WebShopEnv) -> None:
    step = env.step(env.reset(0).state, "search[zzzz qqqq unknownword]")
    assert "Total results: 0" in step.observation
    step = env.step(step.state, "click[next >]")
    assert step.observation.endswith("Page 2 (Total results: 0) [SEP] < Prev [SEP] Next >")
    assert step.available_actions["clickables"] == ["back to search", "< prev", "next >"]


@pytest.mark.parametrize(
    ("query", "matches"),
    [("women shoes size 8", 50), ("gift set red", 50), ("for women and men", 42), ("shirt", 8)],
)
def test_every_results_page_shows_its_slice_of_the_top_50(env: WebShopEnv, query: str, matches: int) -> None:
    """Pages ask the search only for the hits up to their last one: each must be its slice of the top 50."""
    top50 = [env.product(i).asin for i in env.catalog.index.search_positions(query, 50)]
    assert len(top50) == matches  # 50: at least 50 products match (the total the original shows)
    step = env.step(env.reset(0).state, f"search[{query}]")
    for page in range(1, 7):
        shown = top50[(page - 1) * 10 : page * 10]
        assert f"Page {page} (Total results: {len(top50)})" in step.observation
        products = [
            c for c in step.available_actions["clickables"] if c not in ("back to search", "< prev", "next >")
        ]
        assert products == [asin.lower() for asin in shown], page
        step = env.step(step.state, "click[next >]")


def test_back_to_search_starts_over(env: WebShopEnv) -> None:
    step, _ = item_page(env)
    back = env.step(step.state, "click[back to search]")
    assert back.observation == env.reset(0).observation
    assert back.state.steps == step.state.steps + 1


def test_purchase_ends_the_episode(env: WebShopEnv) -> None:
    actions = expert_actions(env, 5)
    steps = run_actions(env, 5, actions)
    assert steps[-1].done and steps[-1].reward == 1.0
    assert steps[-1].available_actions == {"has_search_bar": False, "clickables": []}
    with pytest.raises(EpisodeFinished):
        env.step(steps[-1].state, "search[more]")


def test_state_round_trips_through_its_dict(env: WebShopEnv) -> None:
    step, _ = item_page(env, 7)
    assert EpisodeState.from_dict(step.state.to_dict()) == step.state


ACTION_TEXT = st.one_of(
    st.text(max_size=40),
    st.builds(lambda s: f"search[{s}]", st.text(max_size=30)),
    st.builds(lambda s: f"click[{s}]", st.text(max_size=20)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(goal=st.integers(0, 99), choices=st.lists(st.tuples(st.booleans(), st.integers(0, 60), ACTION_TEXT),
                                                  max_size=12))  # fmt: skip
def test_any_action_on_any_page_never_raises(env: WebShopEnv, goal: int, choices: list) -> None:
    step = env.reset(goal, goal_set="human")
    for use_clickable, pick, text in choices:
        clickables = step.available_actions["clickables"]
        action = f"click[{clickables[pick % len(clickables)]}]" if use_clickable and clickables else text
        step = env.step(step.state, action)
        assert 0.0 <= step.reward <= 1.0
        assert isinstance(step.observation, str)
        if step.done:
            break


def test_evolve_is_dataclasses_replace() -> None:
    import dataclasses

    state = EpisodeState(goal_set="synthetic", goal=3, query="red shoes", options={"size": "9"}, steps=2)
    changes = {"page_num": 2, "steps": 3, "options": {}}
    assert state.evolve(**changes) == dataclasses.replace(state, **changes)
    assert state.evolve() == state and state.evolve() is not state
    assert state.steps == 2 and state.options == {"size": "9"}  # the original is untouched
    with pytest.raises(TypeError, match="no field"):
        state.evolve(stpes=4)
