"""The WebShop episode as a pure function of (goal, actions so far).

``WebShopEnv.reset(goal)`` gives the first ``Step``; ``WebShopEnv.step(state, action)`` gives the next one and
never mutates anything: the whole episode lives in the immutable ``EpisodeState``, which the HTTP layer signs
and hands to the client. Any process holding the same prepared catalog can therefore serve any step.

Contract (Gymnasium-like):

- observation: the page as text (``' [SEP] '``-joined visible text, exactly as the original's ``text`` mode);
- available_actions: ``{"has_search_bar": bool, "clickables": [str, ...]}`` in the original's order;
- reward: 0.0 except on ``click[buy now]``, which returns the purchase reward in [0, 1] and ends the episode;
- done: True after a purchase (later steps raise ``EpisodeFinished``);
- info: ``valid`` (whether the action did anything), ``steps``, and ``reward_info`` on purchase.

An invalid action (bad format, unknown or wrong-case label, ``click[search]``) leaves the page as it was and
earns 0, as in the original; it still counts as a step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Any, NamedTuple

from ...contract import BadState, EpisodeOver, UnknownTask
from ...contract import EnvError as EnvError  # the base of every error below
from . import pages
from .actions import parse_action
from .model import Catalog, GoalRecord, ProductRecord
from .pages import Clickable, ClickKind, PageKind
from .reward import compute_reward

# The simulator's errors are the environment contract's (one hierarchy for every environment: the HTTP layer
# answers each with its ``status`` and ``kind``); ``EnvError`` is the contract's base, for anything else refused.


class UnknownGoal(UnknownTask):
    """A goal index outside the goal list, or a goal set that the catalog does not have."""

    kind = "unknown_goal"


class EpisodeFinished(EpisodeOver):
    """A step was asked for after the purchase that ended the episode."""


class InvalidState(BadState):
    """An episode state that does not fit the catalog (e.g. a product index out of range)."""


@dataclass(frozen=True)
class EpisodeState:
    """Everything the next step needs. Small on purpose: it travels in every request."""

    goal_set: str
    goal: int
    page: PageKind = PageKind.SEARCH
    query: str = ""  # the lower-cased search argument (the original's keywords joined by spaces)
    page_num: int = 1
    product: int | None = None  # product index on item and sub-pages
    options: Mapping[str, str] = field(default_factory=dict)  # group -> chosen value, in click order
    sub_page: str | None = None
    steps: int = 0
    reward: float | None = None  # set by the purchase

    def evolve(self, **changes: Any) -> EpisodeState:
        """A copy with ``changes`` (field names only), as ``dataclasses.replace`` makes it, at a fraction of its
        cost: every step makes one or two, and ``replace`` re-runs the frozen ``__init__`` over all ten fields."""
        if not _STATE_FIELDS.issuperset(changes):
            raise TypeError(f"EpisodeState has no field {sorted(set(changes) - _STATE_FIELDS)}")
        return _assemble(self.__dict__, changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "s": self.goal_set,
            "g": self.goal,
            "p": self.page.value,
            "q": self.query,
            "n": self.page_num,
            "i": self.product,
            "o": list(self.options.items()),
            "u": self.sub_page,
            "t": self.steps,
            "r": self.reward,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EpisodeState:
        """The state ``to_dict`` made (every request decodes one: built like ``evolve``, not by ``__init__``)."""
        try:
            values = {
                "goal_set": str(data["s"]),
                "goal": int(data["g"]),
                "page": _PAGE_KINDS[data["p"]],
                "query": str(data["q"]),
                "page_num": int(data["n"]),
                "product": None if data["i"] is None else int(data["i"]),
                "options": {str(k): str(v) for k, v in data["o"]},
                "sub_page": None if data["u"] is None else str(data["u"]),
                "steps": int(data["t"]),
                "reward": None if data["r"] is None else float(data["r"]),
            }
        except (KeyError, TypeError, ValueError) as error:
            raise InvalidState(f"malformed episode state: {error}") from None
        return _assemble(values)


_STATE_FIELDS = frozenset(f.name for f in fields(EpisodeState))


def _assemble(*parts: Mapping[str, Any]) -> EpisodeState:
    """A state from its field values (later parts win), without the frozen ``__init__`` (which sets each of the
    ten fields through ``object.__setattr__``): callers pass complete, checked values."""
    state = object.__new__(EpisodeState)
    for part in parts:
        state.__dict__.update(part)
    return state


_PAGE_KINDS = {kind.value: kind for kind in PageKind}


class ResultsView(NamedTuple):
    """What a results page shows for a (query, page): its clickables and its text below the header."""

    clickables: dict[str, Clickable]
    listing: str


@dataclass(frozen=True)
class Step:
    """One observation of the episode, with the state that produced it."""

    observation: str
    available_actions: dict[str, Any]
    reward: float
    done: bool
    state: EpisodeState
    info: dict[str, Any]
    instruction: str


class WebShopEnv:
    """Stateless WebShop text environment over a prepared catalog.

    Args:
        catalog: the prepared catalog (products, search index, goals).
        show_attrs: offer the item page's ``Attributes`` button (the original's ``show_attrs``, default off).
    """

    def __init__(self, catalog: Catalog, show_attrs: bool = False) -> None:
        self.catalog = catalog
        self.show_attrs = show_attrs
        # A step builds the clickables of the page it acts on and of the page it shows; they and a results page's
        # listing are pure functions of (query, page) or of the product, so they are built once per worker
        # (read-only, as pages.SEARCH_CLICKABLES already is). Bounded: a cache miss only costs the rebuild.
        self._results_view = lru_cache(maxsize=4096)(self._build_results_view)
        self._result_entry = lru_cache(maxsize=8192)(self._build_result_entry)  # new queries reuse products
        self._item_clickables = lru_cache(maxsize=4096)(self._build_item_clickables)
        self._item_body = lru_cache(maxsize=4096)(self._build_item_body)

    # ---- public contract -------------------------------------------------------------------------------
    def reset(self, goal: int, goal_set: str = "synthetic") -> Step:
        """Start an episode on goal ``goal`` of ``goal_set`` (the original's ``reset(session=goal)``)."""
        goal_record = self.goal(goal_set, goal)
        state = EpisodeState(goal_set=goal_set, goal=goal_record.index)
        return self._observe(state, goal_record, reward=0.0, info={"valid": True, "steps": 0})

    def step(self, state: EpisodeState, action: str) -> Step:
        """Apply ``action`` to ``state``; returns the next Step (the input state is never modified)."""
        if state.page is PageKind.DONE:
            raise EpisodeFinished("the episode ended with a purchase; reset to start a new one")
        goal = self.goal(state.goal_set, state.goal)
        new_state, reward_info = self._transition(state, goal, action)
        valid = new_state is not None
        next_state = (new_state if valid else state).evolve(steps=state.steps + 1)
        info: dict[str, Any] = {"valid": valid, "steps": next_state.steps}
        reward = 0.0
        if reward_info is not None:
            reward = next_state.reward if next_state.reward is not None else 0.0
            info["reward_info"] = reward_info
        return self._observe(next_state, goal, reward=reward, info=info)

    def observe(self, state: EpisodeState) -> Step:
        """The current observation of ``state`` (no transition)."""
        goal = self.goal(state.goal_set, state.goal)
        return self._observe(state, goal, reward=0.0, info={"valid": True, "steps": state.steps})

    def goal(self, goal_set: str, index: int) -> GoalRecord:
        count = self.catalog.goal_count(goal_set)
        if not 0 <= index < count:
            raise UnknownGoal(f"goal {index} is out of range: {goal_set} goals are numbered 0..{count - 1}")
        return self.catalog.goal(goal_set, index)

    # ---- transitions -------------------------------------------------------------------------------------
    def _transition(
        self, state: EpisodeState, goal: GoalRecord, action: str
    ) -> tuple[EpisodeState | None, dict[str, Any] | None]:
        """(new state, reward breakdown) for a valid action; (None, None) for an invalid one."""
        name, argument = parse_action(action)
        if argument is None:
            return None, None
        if name == "search":
            return state.evolve(page=PageKind.RESULTS, query=argument, page_num=1, product=None,
                           options={}, sub_page=None), None  # fmt: skip
        if name != "click" or argument == pages.SEARCH:
            return None, None
        clickable = self.clickables(state).get(argument)
        if clickable is None:
            return None, None
        return self._click(state, goal, argument, clickable)

    def _click(
        self, state: EpisodeState, goal: GoalRecord, label: str, clickable: Clickable
    ) -> tuple[EpisodeState | None, dict[str, Any] | None]:
        page = state.page
        if label == pages.BUY_NOW and state.product is not None:
            return self._purchase(state, goal)
        if label == pages.BACK_TO_SEARCH:
            return EpisodeState(goal_set=state.goal_set, goal=state.goal, steps=state.steps), None
        if label == pages.NEXT and page is PageKind.RESULTS:
            return state.evolve(page_num=state.page_num + 1), None
        if label == pages.PREV:
            if page is PageKind.RESULTS:
                return state.evolve(page_num=state.page_num - 1), None
            if page is PageKind.SUB:
                return state.evolve(page=PageKind.ITEM, sub_page=None), None
            if page is PageKind.ITEM:
                return state.evolve(page=PageKind.RESULTS, product=None, options={}), None
        if label in pages.SUB_PAGES and page is PageKind.ITEM:
            return state.evolve(page=PageKind.SUB, sub_page=label), None
        if clickable.kind is ClickKind.PRODUCT:
            return state.evolve(page=PageKind.ITEM, product=int(clickable.target), options={}), None  # type: ignore[arg-type]
        if clickable.kind is ClickKind.OPTION:
            options = dict(state.options)
            options[str(clickable.target)] = label
            return state.evolve(page=PageKind.ITEM, options=options), None
        return None, None

    def _purchase(self, state: EpisodeState, goal: GoalRecord) -> tuple[EpisodeState, dict[str, Any]]:
        product = self.product(state.product)  # type: ignore[arg-type]
        goal_product = self.product(goal.product_index)
        reward, info = compute_reward(
            product.for_reward(), goal.for_reward(goal_product), product.price, dict(state.options)
        )
        return state.evolve(page=PageKind.DONE, sub_page=None, reward=reward), info

    # ---- observation -------------------------------------------------------------------------------------
    def product(self, index: int) -> ProductRecord:
        try:
            return self.catalog.product(index)
        except IndexError:
            raise InvalidState(f"product {index} is not in this catalog") from None

    def _build_results_view(self, query: str, page_num: int) -> ResultsView:
        # The original ranks the top SEARCH_TOP_N and pages through them; a page needs only the hits up to its
        # last one (the first page: ten), and the total is the number of matches up to SEARCH_TOP_N.
        start = (page_num - 1) * pages.RESULTS_PER_PAGE
        depth = min(pages.SEARCH_TOP_N, max(start + pages.RESULTS_PER_PAGE, 1))
        ranked, total = self.catalog.search(query, depth, pages.SEARCH_TOP_N)
        shown = ranked[start : start + pages.RESULTS_PER_PAGE] if start >= 0 else []
        entries = list(map(self._result_entry, shown))
        return ResultsView(
            pages.results_clickables(page_num, entries),
            pages.render_results_listing(page_num, total, entries),
        )

    def _build_result_entry(self, index: int) -> pages.ResultEntry:
        return pages.result_entry(self.product(index))

    def clickables(self, state: EpisodeState) -> dict[str, Clickable]:
        if state.page is PageKind.SEARCH:
            return pages.SEARCH_CLICKABLES
        if state.page is PageKind.RESULTS:
            return self._results_view(state.query, state.page_num).clickables
        if state.page is PageKind.ITEM:
            return self._item_clickables(state.product)  # type: ignore[arg-type]
        if state.page is PageKind.SUB:
            return pages.SUB_PAGE_CLICKABLES
        return pages.DONE_CLICKABLES

    def _build_item_body(self, product: int) -> str:
        return pages.render_item_body(self.product(product), self.show_attrs)

    def _build_item_clickables(self, product: int) -> dict[str, Clickable]:
        return pages.item_clickables(self.product(product), self.show_attrs)

    def render(self, state: EpisodeState, instruction: str) -> str:
        if state.page is PageKind.SEARCH:
            return pages.render_search_page(instruction)
        if state.page is PageKind.RESULTS:
            return pages.with_header(instruction, self._results_view(state.query, state.page_num).listing)
        if state.page is PageKind.DONE:
            product = self.product(state.product)  # type: ignore[arg-type]
            return pages.render_done_page(product.asin, dict(state.options), state.reward or 0.0)
        if state.page is PageKind.ITEM:
            return pages.with_header(instruction, self._item_body(state.product))
        product = self.product(state.product)  # type: ignore[arg-type]
        return pages.render_sub_page(instruction, product, state.sub_page or "")

    def _observe(self, state: EpisodeState, goal: GoalRecord, reward: float, info: dict[str, Any]) -> Step:
        instruction = goal.instruction_text
        available = {
            "has_search_bar": state.page is PageKind.SEARCH,
            "clickables": list(self.clickables(state)),
        }
        return Step(
            observation=self.render(state, instruction),
            available_actions=available,
            reward=reward,
            done=state.page is PageKind.DONE,
            state=state,
            info=info,
            instruction=instruction,
        )
