"""What the routers share: the environment over the open catalog, the token codec, the compat sessions.

The only rule added on top of the simulator is the step limit (``WEBSHOP_MAX_STEPS``, 0 = none): the step
that reaches the limit without a purchase answers ``done: true`` with ``info.truncated: true`` (reward 0),
and a later step on that state is refused with 409 ``episode_finished``, like a step after a purchase.
Because ``steps`` is part of the signed state, this needs no memory in the server.
"""

from __future__ import annotations

import random
from functools import lru_cache
from importlib import metadata
from typing import Any

from ..catalog.store import PreparedCatalog
from ..core.env import EpisodeFinished, EpisodeState, Step, WebShopEnv
from ..core.goals import SPLITS, split_range
from ..core.oracle import expert_actions
from .compat_sessions import session_store
from .errors import ApiError
from .metrics import Metrics
from .settings import Settings
from .tokens import TokenCodec

APIS = ("native", "compat")  # the ``api`` label of the step metrics


class Runtime:
    """One worker's service state; built once at startup over the opened catalog."""

    def __init__(self, settings: Settings, catalog: PreparedCatalog, secret: bytes, metrics: Metrics) -> None:
        self.settings = settings
        self.catalog = catalog
        self.env = WebShopEnv(catalog, show_attrs=settings.show_attrs)
        self.codec = TokenCodec(secret, catalog.fingerprint)
        self.metrics = metrics
        self.sessions = session_store(
            settings, self.codec.encode, self.codec.decode, metrics.compat_sessions.set,
            lambda reason, count: metrics.compat_evictions.labels(reason).inc(count),
        )  # fmt: skip
        self._random = random.Random()
        self.expert = lru_cache(maxsize=4096)(self._expert)
        self._steps_served = {api: metrics.steps.labels(api) for api in APIS}  # labels() locks on every call

    # ---- episodes --------------------------------------------------------------------------------------
    def reset(self, goal: int, goal_set: str | None = None, split: str | None = None) -> Step:
        goal_set = goal_set or self.settings.default_goal_set
        if split is not None:
            allowed = split_range(split, self.catalog.goal_count(goal_set))
            if goal not in allowed:
                raise ApiError(
                    404, "goal_not_in_split",
                    f"goal {goal} is not in the {split} split of the {goal_set} goals: that split is "
                    f"{_describe(allowed)}",
                )  # fmt: skip
        return self.env.reset(goal, goal_set=goal_set)

    def random_goal(self, goal_set: str) -> int:
        return self._random.randrange(self.catalog.goal_count(goal_set))

    def step(self, state: EpisodeState, action: str, api: str) -> tuple[Step, bool]:
        """(next step, truncated) with the step limit applied."""
        limit = self.settings.max_steps
        if limit and state.steps >= limit:
            raise EpisodeFinished(
                f"the episode was truncated after the step limit of {limit} steps (WEBSHOP_MAX_STEPS); "
                "reset to start a new one"
            )
        step = self.env.step(state, action)
        self._steps_served[api].inc()
        truncated = bool(limit) and not step.done and step.state.steps >= limit
        if step.done:
            self.metrics.finished.labels(api, "purchase").inc()
        elif truncated:
            self.metrics.finished.labels(api, "truncated").inc()
        return step, truncated

    # ---- native payloads -------------------------------------------------------------------------------
    def reset_payload(self, step: Step) -> dict[str, Any]:
        goal = self.env.goal(step.state.goal_set, step.state.goal)
        return {
            "observation": step.observation,
            "instruction": step.instruction,
            "available_actions": step.available_actions,
            "state": self.codec.encode(step.state),
            # the category lets eval break results down without a copy of the catalog
            "info": {**step.info, "goal": goal.index, "goal_set": goal.goal_set, "category": goal.category},
        }

    def step_payload(self, step: Step, truncated: bool) -> dict[str, Any]:
        return {
            "observation": step.observation,
            "reward": step.reward,
            "done": step.done or truncated,
            "available_actions": step.available_actions,
            "state": self.codec.encode(step.state),
            "info": {**step.info, "truncated": truncated},
        }

    # ---- goals / info ----------------------------------------------------------------------------------
    def goals_summary(self, goal_set: str | None = None, split: str | None = None) -> dict[str, Any]:
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
        return {"default_goal_set": self.settings.default_goal_set, "goal_sets": sets}

    def _expert(self, goal_set: str, goal: int) -> tuple[str, ...]:
        self.env.goal(goal_set, goal)  # raises UnknownGoal before any work
        return tuple(expert_actions(self.env, goal, goal_set=goal_set))

    def info(self) -> dict[str, Any]:
        manifest = self.catalog.manifest
        return {
            "version": package_version(),
            "fingerprint": self.catalog.fingerprint,
            "products": self.catalog.product_count,
            "goal_sets": {name: self.catalog.goal_count(name) for name in self.catalog.goal_sets},
            "default_goal_set": self.settings.default_goal_set,
            "compat_goal_set": self.settings.compat_goal_set,
            "max_steps": self.settings.max_steps,
            "max_batch": self.settings.max_batch,
            "catalog": {
                key: manifest[key]
                for key in ("format_version", "noun_extractor", "prices", "price_ceilings", "created_unix")
                if key in manifest
            },
        }


def package_version() -> str:
    try:
        return metadata.version("webshop-env")
    except metadata.PackageNotFoundError:
        return "unknown"


def _describe(allowed: range) -> str:
    if len(allowed) == 0:
        return "empty for this goal set"
    return f"goals {allowed.start}..{allowed.stop - 1}"
