"""The reproducible episode plan that ``record`` plays: which goals, and which actions in which situation.

Every action is chosen from the goal (as the environment holds it), the latest observation's clickables and a
seeded ``random.Random``: nothing else. So two environments that show the same pages get the same actions,
and one seed gives the same episode set on every run. Episode kinds, in turn:

- ``expert``: search the goal product's title (then its query), page until its ASIN shows, choose the goal's
  option values, buy: full- or high-reward purchases;
- ``wrong``: search words of the instruction, open some other result, maybe pick an option, buy: partial
  credit and zero rewards;
- ``explore``: paging forward past the end and back, every sub-page (``< Prev`` from each), ``Back to Search``,
  a second search, then the expert's purchase;
- ``random``: a random walk mixing valid clicks, searches (including ones with no result) and invalid actions
  (unknown labels, wrong case, empty or malformed commands, ``click[search]`` off the search page), ending
  in a purchase when it reaches an item page late in the walk.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .adapter import EnvStep, TextEnvAdapter

EPISODE_KINDS = ("expert", "wrong", "explore", "random")
MAX_STEPS = 40  # per episode; the plan's walks stay well under it
_PAGE_BUTTONS = frozenset(
    ["back to search", "< prev", "next >", "description", "features", "reviews", "attributes", "buy now"]
)
_INVALID = (
    "click[no such button]",
    "click[]",
    "search[]",
    "Search[red]",
    "CLICK[next >]",
    "click[Next >]",
    "buy now",
    "click next >",
    "[click]",
    "click[search]",
)


@dataclass(frozen=True)
class PlannedEpisode:
    goal_set: str
    goal: int
    kind: str


def plan_episodes(goal_counts: dict[str, int], episodes: dict[str, int], seed: int) -> list[PlannedEpisode]:
    """``episodes[goal_set]`` distinct goals per goal set, drawn with ``seed``; kinds in turn."""
    rng = random.Random(seed)
    plan: list[PlannedEpisode] = []
    for goal_set, count in goal_counts.items():
        wanted = min(episodes.get(goal_set, 0), count)
        for number, goal in enumerate(sorted(rng.sample(range(count), wanted))):
            plan.append(PlannedEpisode(goal_set, goal, EPISODE_KINDS[number % len(EPISODE_KINDS)]))
    return plan


class _Episode:
    """Steps an adapter and keeps the trace; stops at a purchase or at MAX_STEPS."""

    def __init__(self, env: TextEnvAdapter, planned: PlannedEpisode) -> None:
        self.env = env
        first = env.reset(planned.goal_set, planned.goal)
        self.last = first
        self.steps: list[dict[str, Any]] = [
            {"observation": first.observation, "available_actions": first.available_actions}
        ]

    @property
    def over(self) -> bool:
        return self.last.done or len(self.steps) > MAX_STEPS

    @property
    def clickables(self) -> list[str]:
        return list(self.last.available_actions.get("clickables", []))

    def act(self, action: str) -> EnvStep:
        if self.over:
            return self.last
        step = self.env.step(action)
        record: dict[str, Any] = {
            "action": action,
            "observation": step.observation,
            "reward": step.reward,
            "done": step.done,
            "available_actions": step.available_actions,
        }
        if step.verbose_info is not None:
            record["verbose_info"] = step.verbose_info
        self.steps.append(record)
        self.last = step
        return step

    def results(self) -> list[str]:
        """ASINs (lower-case, as clickables) on the current results page."""
        return [
            c for c in self.clickables if c not in _PAGE_BUTTONS and c != "search" and _looks_like_asin(c)
        ]


def _looks_like_asin(label: str) -> bool:
    return len(label) == 10 and label.isalnum() and label[0] == "b"


def _wanted_values(goal: dict[str, Any]) -> list[str]:
    options = goal.get("goal_options") or []
    values = options.values() if isinstance(options, dict) else options
    return [str(v).lower() for v in values]


def _search_terms(goal: dict[str, Any], rng: random.Random) -> str:
    words = str(goal.get("instruction_text", "")).split()
    if not words:
        return "product"
    start = rng.randrange(len(words))
    return " ".join(words[start : start + rng.randint(1, 5)])


def _find_target(episode: _Episode, goal: dict[str, Any], max_pages: int = 5) -> bool:
    """Search the goal product by title, then by query; True when its item page is open."""
    target = str(goal["asin"]).lower()
    for query in (str(goal.get("name", "")).lower(), str(goal.get("query", ""))):
        if not query.strip():
            continue
        episode.act(f"search[{query}]")
        for page in range(max_pages):
            if target in episode.clickables:
                episode.act(f"click[{target}]")
                return True
            if page < max_pages - 1 and "next >" in episode.clickables:
                episode.act("click[next >]")
    return False


def _choose_options_and_buy(episode: _Episode, goal: dict[str, Any]) -> None:
    for value in _wanted_values(goal):
        if value in episode.clickables and value not in _PAGE_BUTTONS:
            episode.act(f"click[{value}]")
    episode.act("click[buy now]")


def _expert(episode: _Episode, goal: dict[str, Any], rng: random.Random) -> None:
    if _find_target(episode, goal):
        _choose_options_and_buy(episode, goal)
    else:
        _wrong(episode, goal, rng)


def _wrong(episode: _Episode, goal: dict[str, Any], rng: random.Random) -> None:
    target = str(goal["asin"]).lower()
    for _ in range(3):
        episode.act(f"search[{_search_terms(goal, rng)}]")
        others = [a for a in episode.results() if a != target]
        if others:
            episode.act(f"click[{rng.choice(others)}]")
            options = [c for c in episode.clickables if c not in _PAGE_BUTTONS]
            if options and rng.random() < 0.7:
                episode.act(f"click[{rng.choice(options)}]")
            episode.act("click[buy now]")
            return
    episode.act(f"search[{goal.get('query', 'product')}]")
    if episode.results():
        episode.act(f"click[{episode.results()[0]}]")
        episode.act("click[buy now]")


def _explore(episode: _Episode, goal: dict[str, Any], rng: random.Random) -> None:
    episode.act(f"search[{goal.get('query', 'product')}]")
    for _ in range(rng.randint(1, 6)):  # forward, possibly past the last page
        episode.act("click[next >]")
    episode.act("click[< prev]")
    results = episode.results()
    if results:
        episode.act(f"click[{rng.choice(results)}]")
        for page in ("description", "features", "reviews", "attributes"):
            episode.act(f"click[{page}]")
            if "< prev" in episode.clickables:
                episode.act("click[< prev]")
        episode.act("click[< prev]")  # item page -> results (drops chosen options)
    episode.act("click[back to search]")
    episode.act(f"search[{_search_terms(goal, rng)}]")
    _expert(episode, goal, rng)


def _random_walk(episode: _Episode, goal: dict[str, Any], rng: random.Random) -> None:
    length = rng.randint(8, 25)
    for number in range(length):
        clickables = [c for c in episode.clickables if c != "buy now"]
        roll = rng.random()
        if roll < 0.25:
            action = rng.choice(_INVALID)
        elif roll < 0.45 or not clickables:
            terms = _search_terms(goal, rng) if rng.random() < 0.8 else "zzqx qqzv"
            action = f"search[{terms}]"
        elif roll < 0.5:
            action = f"click[{rng.choice(clickables).upper()}]"
        else:
            action = f"click[{rng.choice(clickables)}]"
        episode.act(action)
        if episode.over:
            return
        if "buy now" in episode.clickables and number > length // 2 and rng.random() < 0.5:
            episode.act("click[buy now]")
            return


POLICIES: dict[str, Callable[[_Episode, dict[str, Any], random.Random], None]] = {
    "expert": _expert,
    "wrong": _wrong,
    "explore": _explore,
    "random": _random_walk,
}


def play_episode(
    env: TextEnvAdapter, planned: PlannedEpisode, goal: dict[str, Any], seed: int
) -> list[dict[str, Any]]:
    """Play one planned episode; returns its steps in the trace format."""
    rng = random.Random(f"{seed}:{planned.goal_set}:{planned.goal}:{planned.kind}")
    episode = _Episode(env, planned)
    POLICIES[planned.kind](episode, goal, rng)
    return episode.steps


def iter_episodes(
    env: TextEnvAdapter, plan: list[PlannedEpisode], goals: dict[str, list[dict[str, Any]]], seed: int
) -> Iterator[tuple[PlannedEpisode, list[dict[str, Any]]]]:
    for planned in plan:
        yield planned, play_episode(env, planned, goals[planned.goal_set][planned.goal], seed)
