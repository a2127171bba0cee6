"""The scripted policies' choices (no cluster): random's candidate actions and the expert's plan playback."""

from __future__ import annotations

import asyncio
import random

from agent_trainer.evaluation.policies import ExpertPolicy, RandomPolicy, Turn, random_choices

INSTRUCTION = "i need a red cotton t-shirt for men in size large, and price lower than 30.00 dollars"
SEARCH_PAGE = {"has_search_bar": True, "clickables": ["search"]}
RESULTS_PAGE = {"has_search_bar": False, "clickables": ["back to search", "next >", "b01", "b02"]}


def turn(available: dict, index: int = 0, goal: int = 3) -> Turn:
    return Turn(goal, "synthetic", INSTRUCTION, "WebShop [SEP] ...", available, index)


def test_random_choices_on_the_search_page_are_one_instruction_search() -> None:
    words = set(INSTRUCTION.replace(",", " ").split())
    for seed in range(50):
        choices = random_choices(turn(SEARCH_PAGE), random.Random(seed))
        assert len(choices) == 1 and choices[0].startswith("search[")  # click[search] is not an action
        searched = choices[0][len("search[") : -1].split()
        assert 2 <= len(searched) <= 6 and set(searched) <= words | {"30.00"}


def test_random_choices_elsewhere_are_the_page_clicks() -> None:
    assert random_choices(turn(RESULTS_PAGE), random.Random(0)) == [
        "click[back to search]",
        "click[next >]",
        "click[b01]",
        "click[b02]",
    ]
    assert random_choices(turn({"has_search_bar": False, "clickables": []}), random.Random(0)) == []


def test_random_policy_is_seeded_per_goal() -> None:
    async def play(seed: int, goal: int) -> list[str]:
        agent = await RandomPolicy(seed).begin(turn(SEARCH_PAGE, goal=goal))
        first = await agent.act(turn(SEARCH_PAGE, goal=goal))
        rest = [await agent.act(turn(RESULTS_PAGE, i, goal)) for i in range(1, 6)]
        return [d.action for d in (first, *rest)]

    assert asyncio.run(play(0, 3)) == asyncio.run(play(0, 3))  # reproducible
    by_goal = {tuple(asyncio.run(play(0, goal))) for goal in range(8)}
    by_seed = {tuple(asyncio.run(play(seed, 3))) for seed in range(8)}
    assert len(by_goal) > 1 and len(by_seed) > 1  # both the goal and the seed change the draws


def test_expert_plays_its_plan_then_stops() -> None:
    async def plans(goal: int, goal_set: str) -> list[str]:
        return ["search[x]", "click[b01]", "click[buy now]"]

    async def play() -> list[tuple[str | None, bool]]:
        agent = await ExpertPolicy(plans, source="test").begin(turn(SEARCH_PAGE))
        return [((d := await agent.act(turn(SEARCH_PAGE, i))).action, d.stop) for i in range(4)]

    assert asyncio.run(play()) == [
        ("search[x]", False),
        ("click[b01]", False),
        ("click[buy now]", False),
        (None, True),
    ]
