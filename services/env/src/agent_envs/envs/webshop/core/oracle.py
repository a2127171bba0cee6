"""An expert policy: the actions that buy the goal's product with the goal's options.

It drives the real environment (so its actions are known to work): search for the product's title (then its
query, then the instruction) and page through the results until the product shows up, open it, pick the goal's
option values, buy. Used by tests, the demo and the ``expert`` eval policy.
"""

from __future__ import annotations

from .env import Step, WebShopEnv
from .pages import RESULTS_PER_PAGE, SEARCH_TOP_N

MAX_PAGES = SEARCH_TOP_N // RESULTS_PER_PAGE


def expert_actions(env: WebShopEnv, goal: int, goal_set: str = "synthetic") -> list[str]:
    """Actions that take goal ``goal`` from reset to a purchase of its product (best effort)."""
    step = env.reset(goal, goal_set=goal_set)
    record = env.goal(goal_set, goal)
    product = env.product(record.product_index)
    target = product.asin.lower()
    actions: list[str] = []
    for query in _queries(product.title, record.query, record.instruction_text):
        trial = [f"search[{query}]"]
        page = env.step(step.state, trial[0])
        for _ in range(MAX_PAGES):
            if target in page.available_actions["clickables"]:
                actions = [*trial, f"click[{target}]"]
                break
            trial.append("click[next >]")
            page = env.step(page.state, "click[next >]")
        if actions:
            break
    if not actions:
        return []
    for action in actions:
        step = env.step(step.state, action)
    for value in _wanted_values(record.goal_options):
        if value in step.available_actions["clickables"] and value not in _BUTTONS:
            actions.append(f"click[{value}]")
            step = env.step(step.state, actions[-1])
    actions.append("click[buy now]")
    return actions


_BUTTONS = {
    "back to search",
    "< prev",
    "next >",
    "description",
    "features",
    "reviews",
    "attributes",
    "buy now",
}


def _queries(*candidates: str) -> list[str]:
    """Usable search arguments: no brackets (they would break the action grammar), no duplicates."""
    cleaned = []
    for candidate in candidates:
        text = " ".join(candidate.replace("[", " ").replace("]", " ").split())
        if text and text not in cleaned:
            cleaned.append(text)
    return cleaned


def _wanted_values(goal_options: dict[str, str] | list[str]) -> list[str]:
    values = goal_options.values() if isinstance(goal_options, dict) else goal_options
    return [str(value).lower() for value in values]


def run_actions(env: WebShopEnv, goal: int, actions: list[str], goal_set: str = "synthetic") -> list[Step]:
    """Reset and play ``actions``; returns every Step, the reset first."""
    steps = [env.reset(goal, goal_set=goal_set)]
    for action in actions:
        steps.append(env.step(steps[-1].state, action))
        if steps[-1].done:
            break
    return steps
