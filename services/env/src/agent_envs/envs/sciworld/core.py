"""SciWorld's core: the ScienceWorld simulator (scienceworld 1.2.3's jar, one JVM per episode) behind the
environment contract, with the episode as a replay log.

The state is small JSON: the task, the actions so far, a random episode id, and what is needed to answer without
a JVM (score, moves, done) plus ``check``, a running digest of every observation and score so far. The live JVM
of an episode stays in the process that served it (``pool``); ``step`` uses it when it holds exactly that
episode after exactly those actions. Otherwise (another replica, a restart, a killed JVM, a retry from an older
state, an evicted or reaped episode) a fresh JVM loads the task and replays the actions: the first load in a
fresh JVM replays identically, and the digest proves it (a mismatch is ``EpisodeLost``, never a silent fork).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from ..contract import (
    JSON,
    BadState,
    EnvError,
    EpisodeLost,
    EpisodeOver,
    StateTravel,
    Transition,
    UnknownTask,
)
from .games import GAME_COUNT, game
from .pool import JvmPool, Outcome, Simulator, SimulatorDied, SimulatorFailed, SimulatorUnavailable

log = logging.getLogger("agent_envs.envs.sciworld")

STATE_VERSION = 1
# Per episode: the 100-move limit counts only time-advancing actions, and a replay costs each action.
MAX_ACTIONS = 300
MAX_ACTION_CHARS = 10_000  # the recordings send up to 3,000 characters
MAX_EPISODE_CHARS = 60_000  # all actions together: the state travels in every request
KNOWN_JAR_SHA256 = {"1.2.3": "f4e1fdce0cdabe1bab7128a7e78ea820210d9db3c28d7272bcbbc3f3a1c5f0d7"}
T = TypeVar("T")


class ActionFailed(EnvError):
    """The simulator raised a Java exception on this action; the episode's state is unchanged."""

    status = 422
    kind = "action_failed"


class EpisodeTooLong(EnvError):
    """The episode reached ``MAX_ACTIONS`` actions or ``MAX_EPISODE_CHARS`` characters of actions."""

    status = 409
    kind = "episode_too_long"


def link(chain: str, outcome: Outcome) -> str:
    """The digest of every observation and score so far: equal chains mean equal transcripts."""
    data = f"{chain}\x1f{outcome.observation}\x1f{outcome.score}".encode()
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def jar_sha256() -> str:
    import scienceworld

    return hashlib.sha256((Path(scienceworld.__file__).parent / "scienceworld.jar").read_bytes()).hexdigest()


class SciWorldEnv:
    """The contract's ``TextEnv`` for ScienceWorld (AgentGym's 4,639 games), with ``close``, ``prewarm`` and
    ``shutdown`` for the serving layer and the AgentGym routes' read-only probes."""

    env_id: ClassVar[str] = "sciworld"
    state_travel: ClassVar[StateTravel] = "token"
    blocking: ClassVar[bool] = True  # every call waits on a JVM over a socket: the serving layer uses threads

    def __init__(self, pool: JvmPool | None = None) -> None:
        self.pool = pool or JvmPool.from_env()
        self._experts: dict[int, list[str]] = {}
        self._experts_lock = threading.Lock()
        self._fingerprint: str | None = None

    # ---- contract ---------------------------------------------------------------------------------------
    def task_count(self) -> int:
        return GAME_COUNT

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            version = importlib.metadata.version("scienceworld")
            sha = jar_sha256()
            if KNOWN_JAR_SHA256.get(version) != sha:
                log.warning(
                    "sciworld: scienceworld %s's jar (%s) is not the one the task table was made for",
                    version,
                    sha,
                )
            self._fingerprint = f"scienceworld-{version}:jar-{sha[:16]}:games-{GAME_COUNT}:v{STATE_VERSION}"
        return self._fingerprint

    def reset(self, task: int) -> Transition:
        index = self._task(task)
        name, variation = game(index)
        episode = secrets.token_hex(8)
        for attempt in (1, 2):
            sim = self.pool.fresh()
            try:
                description, first = sim.load(name, variation)
                break
            except SimulatorDied as error:  # a spare died while idle: take another
                self.pool.discard(sim)
                if attempt == 2:
                    raise SimulatorUnavailable(f"two fresh JVMs died while loading task {index}") from error
            except SimulatorFailed as error:
                self.pool.discard(sim)
                raise ActionFailed(f"loading task {index} failed in the simulator: {error}") from None
        sim.episode, sim.chain = episode, link("", first)
        state = {
            "v": STATE_VERSION, "task": index, "episode": episode, "actions": [],
            "score": first.score, "moves": first.moves, "done": first.done, "check": sim.chain,
        }  # fmt: skip
        self._keep_or_close(sim, first.done)
        info = {
            "score": first.score, "moves": first.moves, "task_name": name, "var_num": variation,
            "task_description": description,
        }  # fmt: skip
        return Transition(first.observation, float(first.reward), first.done, state, info)

    def step(self, state: JSON, action: str) -> Transition:
        current = self._state(state)
        if current["done"]:
            raise EpisodeOver(f"episode {current['episode']} has finished: reset to start another")
        if not isinstance(action, str):
            raise EnvError(f"an action is a string, not {type(action).__name__}")
        if len(action) > MAX_ACTION_CHARS:
            raise EnvError(
                f"an action has at most {MAX_ACTION_CHARS} characters (this one has {len(action)})"
            )
        actions = current["actions"]
        if len(actions) >= MAX_ACTIONS or sum(map(len, actions)) + len(action) > MAX_EPISODE_CHARS:
            raise EpisodeTooLong(
                f"episode {current['episode']} reached the limit of {MAX_ACTIONS} actions "
                f"({MAX_EPISODE_CHARS} characters in all): reset to start another"
            )
        sim, outcome = self._with_episode(current, lambda s: s.step(action))
        sim.actions.append(action)
        sim.chain = link(sim.chain, outcome)
        new_state = {
            **current, "actions": [*actions, action], "score": outcome.score, "moves": outcome.moves,
            "done": outcome.done, "check": sim.chain,
        }  # fmt: skip
        self._keep_or_close(sim, outcome.done)
        info = {"score": outcome.score, "moves": outcome.moves}
        return Transition(outcome.observation, float(outcome.reward), outcome.done, new_state, info)

    def expert(self, task: int) -> Sequence[str] | None:
        """ScienceWorld's gold action sequence for the variation (a JVM loads it with ``generateGoldPath``)."""
        index = self._task(task)
        with self._experts_lock:
            if index in self._experts:
                return list(self._experts[index])
        sim = self.pool.fresh()
        try:
            actions = sim.gold(*game(index))
        except SimulatorFailed as error:
            raise ActionFailed(
                f"the simulator could not make a gold path for task {index}: {error}"
            ) from None
        finally:
            self.pool.discard(sim)
        with self._experts_lock:
            if len(self._experts) >= 4096:
                self._experts.clear()
            self._experts[index] = actions
        return list(actions)

    # ---- beyond the contract: the serving layer's hooks -----------------------------------------------
    def close(self, state: JSON) -> bool:
        """Free the JVM this episode holds in this process, at once: whether there was one. The state stays
        valid (a later step replays it in a fresh JVM)."""
        return self.pool.release(self._state(state)["episode"])

    def prewarm(self) -> None:
        """Start the spare JVMs in the background (non-blocking)."""
        self.pool.start()

    def shutdown(self) -> None:
        """Close every JVM (the worker is stopping)."""
        self.pool.shutdown()

    def stats(self) -> dict[str, int]:
        """This process's JVMs: spares, idle and busy episodes, and counts (replays, evictions, starts)."""
        return self.pool.stats()

    # ---- read-only probes for the AgentGym routes (they do not change the state) -----------------------
    def goal_progress(self, state: JSON) -> str:
        return self._probe(state, lambda s: s.goal_progress())

    def action_hint(self, state: JSON) -> tuple[list[str], list[str]]:
        return self._probe(state, lambda s: (s.possible_actions(), s.possible_objects()))

    def object_tree(self, state: JSON) -> Any:
        return self._probe(state, lambda s: s.object_tree())

    def snapshot(self, state: JSON) -> dict[str, Any]:
        """What AgentGym's ``GET /state`` shows (free look, inventory, task, goals, actions, objects, moves)."""

        def read(s: Simulator) -> dict[str, Any]:
            return {
                "observation": s.look(), "inventory": s.inventory(), "task_description": s.task_description(),
                "goal_progress": s.goal_progress(), "possible_actions": s.possible_actions()[:10],
                "possible_objects": s.possible_objects()[:10], "current_moves": s.num_moves(),
            }  # fmt: skip

        return self._probe(state, read)

    # ---- the live JVM, or a replay ----------------------------------------------------------------------
    def _probe(self, state: JSON, read: Callable[[Simulator], T]) -> T:
        current = self._state(state)
        sim, value = self._with_episode(current, read)
        self._keep_or_close(sim, current["done"])
        return value

    def _with_episode(
        self, current: Mapping[str, Any], call: Callable[[Simulator], T]
    ) -> tuple[Simulator, T]:
        """Run ``call`` on a JVM holding exactly this episode after exactly these actions: the live one if this
        process has it, else a fresh one that replays them. Returns the JVM checked out."""
        sim = self.pool.checkout(current["episode"])
        if sim is not None:
            if sim.actions == current["actions"] and sim.chain == current["check"] and not sim.doomed:
                try:
                    return sim, call(sim)
                except SimulatorDied:
                    log.warning("sciworld: the JVM of episode %s died; replaying", current["episode"])
                except SimulatorFailed as error:
                    self.pool.discard(sim)
                    raise ActionFailed(f"the simulator failed on this action: {error}") from None
            self.pool.discard(sim)  # another step of this episode, or dead: a replay replaces it
        for attempt in (1, 2):
            sim = self._replay(current)
            try:
                return sim, call(sim)
            except SimulatorDied:
                self.pool.discard(sim)
                if attempt == 2:
                    raise EpisodeLost(
                        f"episode {current['episode']}: its simulator died twice while replaying; start a new "
                        "episode"
                    ) from None
            except SimulatorFailed as error:
                self.pool.discard(sim)
                raise ActionFailed(f"the simulator failed on this action: {error}") from None
        raise AssertionError("unreachable")

    def _replay(self, current: Mapping[str, Any]) -> Simulator:
        """A fresh JVM with the task loaded and the episode's actions replayed, its transcript checked."""
        self.pool.counts["replays"] += 1
        for attempt in (1, 2):
            sim = self.pool.fresh()
            try:
                _, outcome = sim.load(*game(current["task"]))
                chain = link("", outcome)
                for action in current["actions"]:
                    chain = link(chain, sim.step(action))
                break
            except SimulatorDied:
                self.pool.discard(sim)
                if attempt == 2:
                    raise EpisodeLost(
                        f"episode {current['episode']}: the simulator died while replaying it; start a new episode"
                    ) from None
            except SimulatorFailed:
                self.pool.discard(sim)
                raise EpisodeLost(
                    f"episode {current['episode']}: replaying its actions failed in the simulator; start a new "
                    "episode"
                ) from None
        if chain != current["check"]:
            self.pool.discard(sim)
            self.pool.counts["replay_mismatches"] += 1
            raise EpisodeLost(
                f"episode {current['episode']} could not be rebuilt: replaying its {len(current['actions'])} "
                "actions in a fresh simulator gave other observations; start a new episode"
            )
        sim.episode, sim.actions, sim.chain = current["episode"], list(current["actions"]), chain
        return sim

    def _keep_or_close(self, sim: Simulator, done: bool) -> None:
        """A finished episode takes no more steps: its JVM is closed at once; else it stays live here."""
        if done:
            self.pool.discard(sim)
        else:
            self.pool.checkin(sim)

    # ---- validation -------------------------------------------------------------------------------------
    def _task(self, task: Any) -> int:
        if isinstance(task, bool) or not isinstance(task, int) or not 0 <= task < GAME_COUNT:
            raise UnknownTask(f"task {task!r} is not one of SciWorld's tasks 0..{GAME_COUNT - 1}")
        return task

    def _state(self, state: JSON) -> dict[str, Any]:
        """The state, checked field by field (a hand-made or other version's state is ``BadState``)."""
        ok = (
            isinstance(state, dict)
            and state.get("v") == STATE_VERSION
            and isinstance(state.get("task"), int)
            and not isinstance(state.get("task"), bool)
            and 0 <= state["task"] < GAME_COUNT
            and isinstance(state.get("episode"), str)
            and 0 < len(state["episode"]) <= 64
            and isinstance(state.get("actions"), list)
            and len(state["actions"]) <= MAX_ACTIONS
            and all(isinstance(a, str) and len(a) <= MAX_ACTION_CHARS for a in state["actions"])
            and all(
                isinstance(state.get(k), int) and not isinstance(state.get(k), bool)
                for k in ("score", "moves")
            )
            and isinstance(state.get("done"), bool)
            and isinstance(state.get("check"), str)
        )
        if not ok:
            raise BadState("not a SciWorld episode state (send the state of the previous response unchanged)")
        return state
