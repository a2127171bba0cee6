"""BabyAI (Chevalier-Boisvert et al.; AgentGym's ``agentenv-babyai``) as a pure core over minigrid 2.3.1: the
40 BabyAI levels AgentGym serves, behind AgentGym's text wrapper (docs/environments/babyai.md).

The episode state is ``{"task": t, "steps": ["<digits>", ...]}``: per step taken, the minigrid primitives it ran
("" for a step that ran none: a check, an invalid action). It travels in the client's signed token. A step
takes the live episode from a per-process LRU cache keyed by (task, steps), so the usual step replays
nothing; a replica that lacks it (another replica's episode, an evicted one, a restart) rebuilds it by
resetting the level and re-running those primitives without computing views (``Episode.replay``).
"""

from __future__ import annotations

import hashlib
import pickle
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, ClassVar

from ..contract import JSON, BadState, EnvError, EpisodeOver, StateTravel, Transition, UnknownTask
from .levels import LEVELS, level_of
from .sim import GYMNASIUM_VERSION, MINIGRID_VERSION, PRIMITIVES, Episode

STATE_VERSION = 1
SEEDS = (
    5000  # task_count() = 40 levels x seeds 0..4999 (AgentGym's data_idx 0..199999; the recordings' range)
)
MAX_STEPS = 100  # steps per episode (AgentGym-RL runs 20 rounds, its ScalingInter configs 30)
MAX_STEP_PRIMITIVES = 512  # primitives one step may have run (a path visits at most 4 x 8 x 8 states)
MAX_ACTION_CHARS = (
    10_000  # the original has none; its recordings send 3,000 (the routes cap fields at 10,000)
)
EPISODE_CACHE = 256  # live episodes kept per process (about 40 kB each, measured)
FRESH_CACHE = 64  # freshly reset levels kept per process, copied for each new episode of the task


class ActionRefused(EnvError):
    """An action this service refuses where the original would not (longer than ``MAX_ACTION_CHARS``)."""


class TooManySteps(EnvError):
    """An episode past ``MAX_STEPS`` steps (the original has no limit)."""


class _LRU:
    """A small thread-safe LRU. For live episodes, ``take`` removes what it returns, so an episode is only ever
    in the hands of one request, and ``put`` hands it back under its new key; ``get`` is for values nobody
    mutates (pickled fresh levels)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.items: OrderedDict[Any, Any] = OrderedDict()
        self.lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def take(self, key: Any) -> Any:
        with self.lock:
            episode = self.items.pop(key, None)
            if episode is None:
                self.misses += 1
            else:
                self.hits += 1
            return episode

    def get(self, key: Any) -> Any:
        with self.lock:
            value = self.items.get(key)
            if value is None:
                self.misses += 1
            else:
                self.items.move_to_end(key)
                self.hits += 1
            return value

    def put(self, key: Any, value: Any) -> None:
        with self.lock:
            self.items[key] = value
            self.items.move_to_end(key)
            while len(self.items) > self.size:
                self.items.popitem(last=False)

    def clear(self) -> None:
        with self.lock:
            self.items.clear()


class BabyAI:
    """AgentGym's BabyAI tasks: task ``t`` is level ``t % 40 + 1`` with seed ``t // 40``. Immutable apart
    from its caches, which hand each live episode to one request at a time, so one instance serves every
    episode concurrently."""

    env_id: ClassVar[str] = "babyai"
    state_travel: ClassVar[StateTravel] = "token"

    def __init__(
        self, seeds: int = SEEDS, episode_cache: int = EPISODE_CACHE, fresh_cache: int = FRESH_CACHE
    ) -> None:
        self.seeds = seeds
        self.live = _LRU(episode_cache)
        self.fresh = _LRU(fresh_cache)

    # ---- the contract --------------------------------------------------------------------------------------
    def task_count(self) -> int:
        return len(LEVELS) * self.seeds

    def fingerprint(self) -> str:
        """The level table, the simulator's versions and the wrapper's state format."""
        basis = "|".join(
            (*LEVELS, f"minigrid={MINIGRID_VERSION}", f"gymnasium={GYMNASIUM_VERSION}", f"v{STATE_VERSION}")
        )
        return "babyai-" + hashlib.sha256(basis.encode()).hexdigest()[:16]

    def reset(self, task: int) -> Transition:
        if isinstance(task, bool) or not isinstance(task, int) or not 0 <= task < self.task_count():
            raise UnknownTask(f"unknown task {task!r}: BabyAI's tasks are 0..{self.task_count() - 1}")
        return self.start(task)

    def start(self, task: int) -> Transition:
        """The first step of any non-negative task (AgentGym's routes accept every ``data_idx``)."""
        episode = self._fresh(task)
        transition = Transition(
            observation=episode.first_observation(),
            reward=0,
            done=False,
            state={"task": task, "steps": []},
            info=self._info(episode, valid=True, success=False),
        )
        self.live.put((task, ()), episode)
        return transition

    def step(self, state: JSON, action: str) -> Transition:
        task, steps = self._check_state(state)
        if not isinstance(action, str):
            raise ActionRefused(f"an action is a string, not {type(action).__name__}")
        if len(action) > MAX_ACTION_CHARS:
            raise ActionRefused(
                f"an action is at most {MAX_ACTION_CHARS} characters (this one has {len(action)})"
            )
        if len(steps) >= MAX_STEPS:
            raise TooManySteps(f"an episode has at most {MAX_STEPS} steps")
        key = (task, tuple(steps))
        episode = self.live.take(key)
        if episode is None:
            episode = self._rebuild(task, steps)
        if episode.done:
            self.live.put(key, episode)
            raise EpisodeOver("the episode has ended: reset to play again")
        outcome = episode.step(action)
        new_steps = [*steps, outcome.ran]
        self.live.put((task, tuple(new_steps)), episode)
        return Transition(
            observation=episode.observation(outcome.text),
            reward=episode.reward,
            done=episode.done,
            state={"task": task, "steps": new_steps},
            info=self._info(episode, valid=outcome.valid, success=outcome.success),
        )

    def expert(self, task: int) -> Sequence[str] | None:
        from .expert import solve

        if not 0 <= task < self.task_count():
            raise UnknownTask(f"unknown task {task!r}: BabyAI's tasks are 0..{self.task_count() - 1}")
        return solve(self._fresh(task))

    # ---- helpers --------------------------------------------------------------------------------------------
    def _fresh(self, task: int) -> Episode:
        """A new episode of ``task``: unpickled from a cached freshly reset level (resetting is the slow part:
        gymnasium.make plus minigrid's rejection sampling; unpickling is several times faster than a deep
        copy), else a new one."""
        frozen = self.fresh.get(task)
        if frozen is not None:
            return pickle.loads(frozen)
        episode = Episode(task)
        self.fresh.put(task, pickle.dumps(episode, protocol=pickle.HIGHEST_PROTOCOL))
        return episode

    def _rebuild(self, task: int, steps: list[str]) -> Episode:
        episode = self._fresh(task)
        try:
            episode.replay(steps)
        except ValueError as error:
            raise BadState(f"this state cannot be replayed: {error}") from None
        return episode

    def _check_state(self, state: JSON) -> tuple[int, list[str]]:
        if not isinstance(state, dict) or set(state) != {"task", "steps"}:
            raise BadState('a BabyAI state is {"task": int, "steps": [str, ...]}')
        task, steps = state["task"], state["steps"]
        if isinstance(task, bool) or not isinstance(task, int) or task < 0:
            raise BadState(f"a BabyAI state's task is a non-negative integer, not {task!r}")
        if not isinstance(steps, list):
            raise BadState(f"a BabyAI state's steps are a list, not {type(steps).__name__}")
        if len(steps) > MAX_STEPS:
            raise BadState(f"a BabyAI state has at most {MAX_STEPS} steps (this one has {len(steps)})")
        for digits in steps:
            if (
                not isinstance(digits, str)
                or len(digits) > MAX_STEP_PRIMITIVES
                or not set(digits) <= PRIMITIVES
            ):
                limit = MAX_STEP_PRIMITIVES
                raise BadState(
                    f"a BabyAI state's step is a string of at most {limit} primitive actions (digits 0-5)"
                )
        return task, steps

    @staticmethod
    def _info(episode: Episode, *, valid: bool, success: bool) -> dict[str, JSON]:
        name, seed = level_of(episode.task)
        return {
            "score": episode.score,
            "available_actions": episode.frame.action_names,
            "valid": valid,
            "success": success,
            "level": name,
            "seed": seed,
        }


def make() -> BabyAI:
    return BabyAI()
