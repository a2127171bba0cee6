"""One live BabyAI episode: a minigrid 2.3.1 level plus AgentGym's text-wrapper state (reward, score, done).

``Episode.step(action)`` is AgentGym's ``BabyAI.step`` as the spec and the recorded traces describe it.
``Episode.replay(steps)`` re-runs the primitive actions earlier steps ran: how a state token (task + the
primitives of each step) becomes a live episode again on a replica that lacks it.
"""

from __future__ import annotations

import logging
import os
import pickle
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")  # minigrid imports pygame, which greets on stdout

import gymnasium
import minigrid
from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX
from minigrid.envs.babyai.core import roomgrid_level

from .levels import level_of
from .text import (
    COMPLETED,
    NO_CHANGE,
    NOT_RECOGNIZED,
    Frame,
    frame_from_image,
    postprocess_mission,
)

log = logging.getLogger(__name__)
MINIGRID_VERSION = minigrid.__version__
GYMNASIUM_VERSION = gymnasium.__version__
PRIMITIVES = frozenset(
    "012345"
)  # minigrid's left, right, forward, pickup, drop, toggle (6, "done", never sent)


def _quiet_print(*args: object, **_: object) -> None:
    """minigrid prints "Sampling rejected: ..." to stdout while generating some levels. A ``print`` in that one
    module's namespace sends it to the log instead (thread-safe, unlike swapping ``sys.stdout``)."""
    log.debug(" ".join(str(arg) for arg in args))


roomgrid_level.print = _quiet_print  # type: ignore[attr-defined]


def _no_obs() -> None:
    """Stands in for ``gen_obs`` while replaying (the only costly part of a minigrid step; verification does
    not use it)."""
    return None


def new_level(task: int) -> tuple[Any, Any]:
    """The level of task ``task`` reset with its seed, twice, and the image the second reset returned.

    gymnasium's registry supplies each level's arguments. AgentGym resets a new level twice with the same
    seed (its wrapper's constructor, then the server's reset), and twice is not always once: minigrid's
    LevelGen levels remember the locked room a generation drew (``locked_room``, never cleared), and the
    next generation avoids that stale room when it places objects, so its random draws go another way.
    With the same seed the second reset can then build another level (another mission even: data_idx 66314,
    SynthS5R2 seed 1657, is "put a ball next to the red door" after one reset and "go to a door" after two,
    as AgentGym's server answers; 1 of 4,000 sampled tasks). The first frame is built from the image
    ``reset`` returned, as the original does: for the *Carrying levels that image predates the level
    handing the agent its object, so the object is still drawn on the floor (and the text says the agent
    carries it).
    """
    name, seed = level_of(task)
    env = gymnasium.make(name, disable_env_checker=True).unwrapped
    env.reset(seed=seed)
    obs, _ = env.reset(seed=seed)
    return env, obs["image"]


@dataclass(frozen=True)
class Outcome:
    """One step as the wrapper answers it."""

    text: str  # the state part of the observation (before "\nAvailable actions: ...")
    ran: str  # the primitive actions that ran, as digits ("" when minigrid was not stepped)
    valid: bool  # False when the action was not recognised or not available
    success: bool  # minigrid ended the level on this step with a positive reward (not a failed ending)


class Episode:
    """A live level and the wrapper's state. Not thread-safe: one request owns it at a time."""

    def __init__(self, task: int) -> None:
        self.task = task
        self.env, image = new_level(task)
        self.goal = postprocess_mission(self.env.mission)
        self.image = image  # the last view the wrapper was given (what the next primitive is compared with)
        self.frame: Frame = frame_from_image(image, self.carrying(), self.env.agent_dir)
        self.reward: float = 0  # minigrid's reward of the last primitive that ran (sticks over other steps)
        self.score: float = 0  # the sum of ``reward`` after every step, as AgentGym's server adds it
        self.done = False
        self.steps: list[str] = []  # per step, the primitives that ran

    def clone(self) -> Episode:
        """An independent copy (pickling round trip: several times faster than ``copy.deepcopy`` here)."""
        return pickle.loads(pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL))

    def carrying(self) -> tuple[int, int] | None:
        """(type, colour) codes of what the agent holds (the text's "You are carrying ...")."""
        obj = self.env.carrying
        return None if obj is None else (OBJECT_TO_IDX[obj.type], COLOR_TO_IDX[obj.color])

    # ---- what the original prints ----------------------------------------------------------------------
    def first_observation(self) -> str:
        return f"Your goal: {self.goal}\n{self.frame.description}\n{self.frame.actions_line()}"

    def observation(self, text: str) -> str:
        return f"{text}\n{self.frame.actions_line()}"

    # ---- stepping ----------------------------------------------------------------------------------------
    def step(self, action: str) -> Outcome:
        """AgentGym's step on the wrapper (the caller refuses steps once ``done``)."""
        act = action.lower().strip()
        frame = self.frame
        if "check" in act:
            return self._still(frame.check_text(), True)
        if act == "":
            return self._still(NO_CHANGE, True)
        prims = frame.actions.get(act)
        if prims is None:
            return self._still(frame.messages.get(act, NOT_RECOGNIZED), False)
        if not prims:
            return self._still(NO_CHANGE, True)
        ran, terminated = self._run(prims)
        self.frame = frame_from_image(self.image, self.carrying(), self.env.agent_dir)
        # The original says "completed" on any ending, a failed one (e.g. PutNext's wrong object: reward 0) too;
        # ``success`` tells them apart (minigrid pays a success 1 - 0.9 * steps / max_steps > 0).
        text = self.frame.description + (COMPLETED if terminated else "")
        return Outcome(text, ran, True, terminated and self.reward > 0)

    def _still(self, text: str, valid: bool) -> Outcome:
        """A step that leaves minigrid alone: the reward stays, the score adds it again."""
        self._account("", self.reward, False)
        return Outcome(text, "", valid, False)

    def _run(self, prims: tuple[int, ...]) -> tuple[str, bool]:
        """Run primitives until one leaves the view unchanged (that one included), each compared with the view
        before it (at first the last one the wrapper was given: for the *Carrying levels' first step, the
        reset's)."""
        env = self.env
        before = self.image
        ran: list[str] = []
        reward: float = 0
        terminated = False
        for prim in prims:
            obs, reward, terminated, _truncated, _ = env.step(prim)
            ran.append(str(prim))
            if (obs["image"] == before).all():
                break
            before = obs["image"]
        self.image = obs["image"]
        digits = "".join(ran)
        self._account(digits, reward, bool(terminated))
        return digits, bool(terminated)

    def _account(self, ran: str, reward: float, terminated: bool) -> None:
        """The original's bookkeeping: the reward of the last primitive, the score summed at every step, and
        ``done`` only for a success worth more than 0.5 (slower successes say "completed" but go on)."""
        self.reward = reward
        self.score += reward
        self.done = terminated and reward > 0.5
        self.steps.append(ran)

    def replay(self, steps: list[str]) -> None:
        """Apply recorded steps (the primitives each ran) to a fresh episode, with the view computed only at
        the end. Raises ValueError for steps that cannot be (a step after the episode ended)."""
        env = self.env
        ran_any = False
        env.gen_obs = _no_obs  # instance attribute: this env only
        try:
            for digits in steps:
                if self.done:
                    raise ValueError("a step after the episode ended")
                if not digits:
                    self._account("", self.reward, False)
                    continue
                reward: float = 0
                terminated = False
                for prim in digits:
                    _, reward, terminated, _, _ = env.step(int(prim))
                self._account(digits, reward, bool(terminated))
                ran_any = True
        finally:
            del env.gen_obs
        if ran_any:
            self.image = env.gen_obs()["image"]
            self.frame = frame_from_image(self.image, self.carrying(), env.agent_dir)
