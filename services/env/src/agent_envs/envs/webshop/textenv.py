"""WebShop behind the environment contract: ``WebShopTextEnv`` over the simulator (``core``) and a prepared catalog.

The contract (``envs.contract.TextEnv``) sees WebShop as it sees every environment: tasks are the goals of the
default goal set, ``reset(task)`` and ``step(state, action)`` return ``Transition``s whose ``state`` is the
simulator's ``EpisodeState`` (travelling in a signed token, as JSON: ``state_to_json``/``state_from_json``), and the
expert is ``core.oracle``'s. WebShop's richer protocol (goal sets, splits, the step limit's truncation, batches,
goal summaries) is methods of the same object, which WebShop's own routes (``http``) call; nothing here knows HTTP.

The only rule added on top of the simulator is the step limit (``WEBSHOP_MAX_STEPS``, 0 = none): the step that
reaches the limit without a purchase answers ``done: true`` with ``info.truncated: true`` (reward 0), and a later
step on that state is refused with 409 ``episode_finished``, like a step after a purchase. Because ``steps`` is
part of the signed state, this needs no memory in the server.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, ClassVar

from ..contract import JSON, StateTravel, Transition, UnknownTask
from .catalog.store import PreparedCatalog
from .core.env import EpisodeFinished, EpisodeState, Step, WebShopEnv
from .core.goals import SPLITS, split_range
from .core.oracle import expert_actions


class GoalNotInSplit(UnknownTask):
    """A reset that names a split its goal is not in."""

    kind = "goal_not_in_split"


class WebShopTextEnv:
    """WebShop's core as the serving layer and the trainer see it (``envs.contract.TextEnv``, plus WebShop's own).

    Args:
        catalog: the prepared catalog (memory-mapped; shared by every worker of a host).
        default_goal_set: the goals a request that names no goal set gets (and the contract's tasks).
        compat_goal_set: the goals of the AgentGym routes.
        max_steps: steps per episode before truncation (0: none).
        show_attrs: offer the item page's Attributes button.
    """

    env_id: ClassVar[str] = "webshop"
    state_travel: ClassVar[StateTravel] = "token"
    #: what a token made on other data is said to be made for (``TokenCodec``'s message)
    data_name: ClassVar[str] = "catalog"

    def __init__(
        self,
        catalog: PreparedCatalog,
        *,
        default_goal_set: str = "synthetic",
        compat_goal_set: str = "synthetic",
        max_steps: int = 100,
        show_attrs: bool = False,
    ) -> None:
        self.catalog = catalog
        self.sim = WebShopEnv(catalog, show_attrs=show_attrs)
        self.default_goal_set = default_goal_set
        self.compat_goal_set = compat_goal_set
        self.max_steps = max_steps
        self._random = random.Random()
        self.expert_for = lru_cache(maxsize=4096)(self._expert_for)

    # ---- the contract --------------------------------------------------------------------------------------
    def task_count(self) -> int:
        return self.catalog.goal_count(self.default_goal_set)

    def fingerprint(self) -> str:
        return self.catalog.fingerprint

    def token_binding(self) -> str:
        """What a state token is bound to: the catalog's fingerprint alone (it names WebShop's data uniquely),
        so tokens are those WebShop has always made."""
        return self.catalog.fingerprint

    @staticmethod
    def state_to_json(state: EpisodeState) -> JSON:
        return state.to_dict()

    @staticmethod
    def state_from_json(value: JSON) -> EpisodeState:
        return EpisodeState.from_dict(value)

    def reset(self, task: int) -> Transition:
        return self.transition(self.reset_goal(task))

    def step(self, state: JSON, action: str) -> Transition:
        if not isinstance(state, EpisodeState):
            state = self.state_from_json(state)
        step, truncated = self.step_limited(state, action)
        return self.transition(step, truncated)

    def expert(self, task: int) -> Sequence[str] | None:
        return list(self.expert_for(self.default_goal_set, task)) or None

    @staticmethod
    def transition(step: Step, truncated: bool = False) -> Transition:
        """A simulator step as the contract's ``Transition``: the page and its actions in ``info``."""
        info = {**step.info, "instruction": step.instruction, "available_actions": step.available_actions}
        return Transition(step.observation, step.reward, step.done or truncated, step.state,
                          {**info, "truncated": truncated})  # fmt: skip

    # ---- WebShop's own protocol ----------------------------------------------------------------------------
    def reset_goal(self, goal: int, goal_set: str | None = None, split: str | None = None) -> Step:
        """The first step of ``goal`` in ``goal_set`` (default: the default goal set); with ``split``, the goal must
        lie in that split (else ``GoalNotInSplit``)."""
        goal_set = goal_set or self.default_goal_set
        if split is not None:
            allowed = split_range(split, self.catalog.goal_count(goal_set))
            if goal not in allowed:
                raise GoalNotInSplit(
                    f"goal {goal} is not in the {split} split of the {goal_set} goals: that split is "
                    f"{_describe(allowed)}"
                )
        return self.sim.reset(goal, goal_set=goal_set)

    def random_goal(self, goal_set: str) -> int:
        return self._random.randrange(self.catalog.goal_count(goal_set))

    def step_limited(self, state: EpisodeState, action: str) -> tuple[Step, bool]:
        """(next step, truncated) with the step limit applied."""
        limit = self.max_steps
        if limit and state.steps >= limit:
            raise EpisodeFinished(
                f"the episode was truncated after the step limit of {limit} steps (WEBSHOP_MAX_STEPS); "
                "reset to start a new one"
            )
        step = self.sim.step(state, action)
        return step, bool(limit) and not step.done and step.state.steps >= limit

    def goals_summary(self, goal_set: str | None = None, split: str | None = None) -> dict[str, Any]:
        """Goal counts per goal set and the index range of each split."""
        names = [goal_set] if goal_set else self.catalog.goal_sets
        splits = [split] if split else list(SPLITS)
        sets = {}
        for name in names:
            count = self.catalog.goal_count(name)
            ranges = {s: split_range(s, count) for s in splits}
            sets[name] = {
                "count": count,
                "splits": {s: {"start": r.start, "stop": r.stop, "count": len(r)} for s, r in ranges.items()},
            }
        return {"default_goal_set": self.default_goal_set, "goal_sets": sets}

    def _expert_for(self, goal_set: str, goal: int) -> tuple[str, ...]:
        self.sim.goal(goal_set, goal)  # raises UnknownGoal before any work
        return tuple(expert_actions(self.sim, goal, goal_set=goal_set))

    def catalog_info(self) -> dict[str, Any]:
        """The catalog this process serves: fingerprint, products, goal sets, and its manifest's provenance."""
        manifest = self.catalog.manifest
        return {
            "fingerprint": self.catalog.fingerprint,
            "products": self.catalog.product_count,
            "goal_sets": {name: self.catalog.goal_count(name) for name in self.catalog.goal_sets},
            "default_goal_set": self.default_goal_set,
            "compat_goal_set": self.compat_goal_set,
            "max_steps": self.max_steps,
            "catalog": {
                key: manifest[key]
                for key in ("format_version", "noun_extractor", "prices", "price_ceilings", "created_unix")
                if key in manifest
            },
        }


def _describe(allowed: range) -> str:
    if len(allowed) == 0:
        return "empty for this goal set"
    return f"goals {allowed.start}..{allowed.stop - 1}"
