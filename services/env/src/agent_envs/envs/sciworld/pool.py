"""ScienceWorld JVMs: one ``Simulator`` per episode, and the bounded pool that starts, lends and reaps them.

Why one JVM per episode: the Scala simulator replays identically only for the *first* task load in a fresh JVM
(a second load in the same JVM can list objects in another order, and an ambiguity menu's ``0`` can then mean
another object). So a JVM is loaded once, stepped for one episode, and closed; an episode whose JVM is gone is
rebuilt by replaying its actions in another fresh JVM (``core``).

The pool keeps ``spares`` started-but-unloaded JVMs (started by one background thread, so a reset never waits for
a JVM start while a spare exists) and at most ``max_live`` JVMs holding episodes (idle or in use). Taking a fresh
JVM when ``max_live`` are held evicts the least recently used idle episode (its next step replays); when all are
in use it waits up to ``wait_s``, then raises ``SimulatorsBusy``. Idle episodes are closed after ``idle_ttl_s``.
A JVM is used by one thread at a time (checked out of the pool) and every py4j call holds its lock.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import subprocess
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..contract import EnvError

log = logging.getLogger("agent_envs.envs.sciworld")


class SimulatorUnavailable(EnvError):
    """No JVM could be had (none starts: no java, a broken jar): retry shortly."""

    status = 503
    kind = "simulator_unavailable"


class SimulatorsBusy(SimulatorUnavailable):
    """Every JVM this process may hold is in use: retry shortly (or raise ``SCIWORLD_MAX_LIVE_JVMS``)."""

    kind = "simulators_busy"


class SimulatorDied(RuntimeError):
    """The JVM went away (killed, crashed, closed) during a call: the episode is rebuilt elsewhere."""


class SimulatorFailed(RuntimeError):
    """The simulator raised a Java exception: its world may be half-updated, so the JVM is discarded."""


@dataclass(frozen=True)
class Outcome:
    """One simulator step as ScienceWorld's Python API computes it (``ScienceWorldEnv.step``)."""

    observation: str
    reward: int  # score - previous score
    score: int  # round(100 * getScore())
    done: bool  # completed, or more than 100 moves, or a negative score
    moves: int


# The simulator lists some objects (a room's three paint cups, an ambiguity menu's choices) in identity-hash order,
# and HotSpot seeds a thread's identity hashes from how many threads the JVM started before it: a number that
# follows the CPU count the JVM sees and its garbage collector. So the same first load lists the same room in
# another order on another host (measured: hosts of 2, 4 and 8 CPUs list what AgentGym's recording lists, 1 and 64
# another order, 16 either). These options make every JVM start the threads of the recording's (2 CPUs, G1) on
# any host; a JVM runs one single-threaded episode, so it loses nothing by them.
JVM_OPTIONS = ("-XX:ActiveProcessorCount=2", "-XX:+UseG1GC")


@functools.cache
def _env_class() -> type:
    """scienceworld's ``ScienceWorldEnv`` without its ``__del__`` (which would shut a closed or dead gateway down
    again and log connection errors): ``Simulator.close`` closes it, and a JVM dies with its Python process.
    Its JVMs start with ``JVM_OPTIONS`` (``ScienceWorldEnv`` takes no Java options, so its module's
    ``launch_gateway`` is given them), and its gateways without py4j's memory management: py4j tells Java when a
    Python proxy is collected, from whichever thread's garbage collection drops it, on a new connection (so a new
    Java thread) when the call in flight holds the only one; later calls then run on that thread, and identity
    hashes, so the order the simulator lists objects in, are per Java thread. CI saw data_idx 4186's paint cups
    listed in another order from its step 18 on. A JVM holds one episode and is closed after it, so what Java keeps
    for the proxies is freed then."""
    import scienceworld.scienceworld as module
    from py4j.java_gateway import GatewayParameters, launch_gateway
    from scienceworld import ScienceWorldEnv

    module.launch_gateway = functools.partial(launch_gateway, javaopts=list(JVM_OPTIONS))
    module.GatewayParameters = functools.partial(GatewayParameters, enable_memory_management=False)

    class Env(ScienceWorldEnv):
        def __del__(self) -> None:
            pass

    return Env


def _py4j_errors() -> tuple[type[BaseException], type[BaseException]]:
    from py4j.protocol import Py4JError, Py4JJavaError

    return Py4JError, Py4JJavaError


class Simulator:
    """One ScienceWorld JVM, driven through scienceworld's own ``ScienceWorldEnv`` (py4j).

    ``episode`` and ``actions`` say which episode it holds and which actions it has taken since its load (the
    reset's own ``look around`` aside); ``core`` compares them with a state's before stepping it.
    """

    def __init__(self) -> None:
        self._env = _env_class()()
        self._lock = threading.Lock()
        self.pid: int = self._env._gateway.java_process.pid
        self.episode: str | None = None
        self.actions: list[str] = []
        self.chain = ""  # core's running digest of the observations so far (checked on replay)
        self.loaded = False
        self.closed = False
        self.doomed = False  # close when checked in (the episode was closed while this JVM was busy)
        self.last_used = 0.0
        self._last_score = 0  # the score after the previous step (a load starts from 0)

    # ---- calls (each one holds the lock; py4j errors become SimulatorDied / SimulatorFailed) ----------------
    def _call(self, fn: Callable[[], Any]) -> Any:
        py4j_error, java_error = _py4j_errors()
        with self._lock:
            if self.closed:
                raise SimulatorDied(f"JVM {self.pid} is closed")
            try:
                return fn()
            except java_error as error:
                raise SimulatorFailed(str(error).split("\n", 1)[0]) from error
            except (py4j_error, OSError) as error:
                raise SimulatorDied(f"JVM {self.pid}: {type(error).__name__}: {error}") from error

    def load(self, task_name: str, variation: int) -> tuple[str, Outcome]:
        """Load the task as AgentGym's server does (no simplifications, no gold path), then its task description
        and the first ``look around``: (task description, outcome)."""
        if self.loaded:
            raise RuntimeError(
                "a Simulator is loaded once (a reload in the same JVM does not replay identically)"
            )
        self.loaded = True

        def run() -> tuple[str, Outcome]:
            self._env.load(task_name, variation, "")
            description = self._env.get_task_description()
            return description, self._step("look around")

        return self._call(run)

    def step(self, action: str) -> Outcome:
        return self._call(lambda: self._step(action))

    def _step(self, action: str) -> Outcome:
        """``ScienceWorldEnv.step``'s observation, score, reward and done, without the extras it also computes
        and AgentGym's server discards (look, inventory, task text, and the valid-action list, which is 80 % of
        a step's time): the recorded answers are identical either way (docs/environments/sciworld.md)."""
        server = self._env.server
        observation = server.step(action)
        score = round(100 * server.getScore())
        completed = bool(server.getCompleted())
        moves = int(server.getNumMoves())
        done = completed or moves > self._env.envStepLimit or score < 0
        reward, self._last_score = score - self._last_score, score
        return Outcome(str(observation), reward, score, done, moves)

    def gold(self, task_name: str, variation: int) -> list[str]:
        """ScienceWorld's gold action sequence for the variation (loads with ``generateGoldPath``)."""
        if self.loaded:
            raise RuntimeError("a Simulator is loaded once")
        self.loaded = True

        def run() -> list[str]:
            self._env.load(task_name, variation, "", generateGoldPath=True)
            return [str(action) for action in self._env.get_gold_action_sequence()]

        return self._call(run)

    def goal_progress(self) -> str:
        return self._call(self._env.get_goal_progress)

    def possible_actions(self) -> list[str]:
        return self._call(self._env.get_possible_actions)

    def possible_objects(self) -> list[str]:
        return self._call(self._env.get_possible_objects)

    def object_tree(self) -> Any:
        return self._call(self._env.getObjectTree)

    def look(self) -> str:
        return self._call(self._env.look)

    def inventory(self) -> str:
        return self._call(self._env.inventory)

    def task_description(self) -> str:
        return self._call(self._env.get_task_description)

    def num_moves(self) -> int:
        return self._call(self._env.get_num_moves)

    def task_ids_and_variations(self) -> tuple[list[str], Callable[[str], int]]:
        """For ``games.check_against`` (a JVM used for this must not be loaded afterwards)."""
        self.loaded = True
        return list(self._env.tasks), lambda name: self._call(lambda: self._env.get_max_variations(name))

    def alive(self) -> bool:
        return not self.closed and self._env._gateway.java_process.poll() is None

    def close(self) -> None:
        """Shut the gateway down and make sure the JVM process is gone before returning."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            gateway = self._env._gateway
            process = gateway.java_process
            if process.poll() is None:
                # The library's own close: the gateway's shutdown, then a newline on the JVM's stdin.
                with contextlib.suppress(Exception):
                    self._env.close()
                try:
                    process.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=5)
            else:  # already dead: close the Python side without talking to it
                with contextlib.suppress(Exception):
                    gateway._gateway_client.close()
                    gateway.shutdown_callback_server()


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    return float(value) if value else default


class JvmPool:
    """Spare JVMs started in the background, live ones (holding an episode) bounded and reaped when idle."""

    def __init__(
        self,
        spares: int = 2,
        max_live: int = 8,
        idle_ttl_s: float = 600.0,
        wait_s: float = 60.0,
        start: Callable[[], Simulator] = Simulator,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if spares < 0 or max_live < 1:
            raise ValueError("spares must be >= 0 and max_live >= 1")
        self.spares_target = spares
        self.max_live = max_live
        self.idle_ttl_s = idle_ttl_s
        self.wait_s = wait_s
        self._start = start
        self._clock = clock
        self._cond = threading.Condition()
        self._spares: list[Simulator] = []
        self._idle: OrderedDict[str, Simulator] = (
            OrderedDict()
        )  # episode -> idle live JVM, least recent first
        self._busy: set[Any] = (
            set()
        )  # Simulators, and _Placeholders for cold starts  # checked out (loading, stepping, replaying)
        self._starting = 0
        self._threads: list[threading.Thread] = []
        self._stopped = False
        self.counts: Counter[str] = Counter()

    @classmethod
    def from_env(cls) -> JvmPool:
        """Sized by ``SCIWORLD_SPARE_JVMS`` (2), ``SCIWORLD_MAX_LIVE_JVMS`` (8), ``SCIWORLD_IDLE_TTL_S`` (600),
        ``SCIWORLD_POOL_WAIT_S`` (60)."""
        return cls(
            spares=env_int("SCIWORLD_SPARE_JVMS", 2),
            max_live=env_int("SCIWORLD_MAX_LIVE_JVMS", 8),
            idle_ttl_s=env_float("SCIWORLD_IDLE_TTL_S", 600.0),
            wait_s=env_float("SCIWORLD_POOL_WAIT_S", 60.0),
        )

    # ---- background threads -----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the spare filler and the reaper (idempotent, non-blocking)."""
        with self._cond:
            if self._threads or self._stopped:
                return
            for target, name in ((self._fill, "sciworld-spares"), (self._reap_loop, "sciworld-reaper")):
                thread = threading.Thread(target=target, name=name, daemon=True)
                self._threads.append(thread)
                thread.start()

    def _fill(self) -> None:
        failures = 0
        while True:
            with self._cond:
                while not self._stopped and len(self._spares) + self._starting >= self.spares_target:
                    self._cond.wait()
                if self._stopped:
                    return
                self._starting += 1
            sim = None
            try:
                sim = self._start()
            except Exception:  # no java, a broken jar: keep serving, back off
                failures += 1
                self.counts["start_failures"] += 1
                log.exception("sciworld: starting a spare JVM failed (%d in a row)", failures)
            with self._cond:
                self._starting -= 1
                if sim is not None:
                    failures = 0
                    self.counts["started"] += 1
                    if self._stopped:
                        sim.close()
                        return
                    self._spares.append(sim)
                    self._cond.notify_all()
            if failures:  # back off (notifications from lending must not cut the wait short)
                deadline = time.monotonic() + min(30.0, 0.5 * 2**failures)
                with self._cond:
                    while not self._stopped and (left := deadline - time.monotonic()) > 0:
                        self._cond.wait(left)

    def _reap_loop(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
                self._cond.wait(max(0.05, min(30.0, self.idle_ttl_s / 4)))
                if self._stopped:
                    return
            self.reap()

    # ---- lending ----------------------------------------------------------------------------------------
    def fresh(self) -> Simulator:
        """A never-loaded JVM, checked out: a spare if one is ready, else started here (a cold start)."""
        self.start()
        evicted: list[Simulator] = []
        deadline = self._clock() + self.wait_s
        with self._cond:
            if self._stopped:
                raise SimulatorUnavailable("the SciWorld simulators are shutting down")
            while len(self._busy) + len(self._idle) >= self.max_live:
                if self._idle:
                    _, victim = self._idle.popitem(last=False)
                    evicted.append(victim)
                    self.counts["evicted"] += 1
                    continue
                left = deadline - self._clock()
                if left <= 0 or self._stopped:
                    raise SimulatorsBusy(
                        f"all {self.max_live} SciWorld simulators of this worker are in use; retry shortly"
                    )
                self._cond.wait(left)
            sim = self._spares.pop() if self._spares else None
            placeholder = sim or _Placeholder()
            self._busy.add(placeholder)
            self._cond.notify_all()  # the filler starts a replacement
        for victim in evicted:
            victim.close()
        if sim is not None:
            self.counts["from_spare"] += 1
            sim.last_used = self._clock()
            return sim
        try:
            sim = self._start()
        except BaseException as error:
            with self._cond:
                self._busy.discard(placeholder)
                self._cond.notify_all()
            if isinstance(error, Exception):
                raise SimulatorUnavailable(f"could not start a ScienceWorld JVM: {error}") from error
            raise
        self.counts["cold_starts"] += 1
        with self._cond:
            self._busy.discard(placeholder)
            self._busy.add(sim)
        sim.last_used = self._clock()
        return sim

    def checkout(self, episode: str) -> Simulator | None:
        """The idle JVM holding ``episode``, checked out (None if this process holds none)."""
        with self._cond:
            sim = self._idle.pop(episode, None)
            if sim is not None:
                self._busy.add(sim)
            return sim

    def checkin(self, sim: Simulator) -> None:
        """Give back a JVM that holds ``sim.episode`` (it becomes the episode's live JVM)."""
        stale: Simulator | None = None
        with self._cond:
            self._busy.discard(sim)
            if sim.closed or sim.doomed or self._stopped or sim.episode is None:
                stale = sim
            else:
                stale = self._idle.pop(
                    sim.episode, None
                )  # a concurrent replay of the same episode: keep ours
                sim.last_used = self._clock()
                self._idle[sim.episode] = sim
            self._cond.notify_all()
        if stale is not None:
            stale.close()

    def discard(self, sim: Simulator) -> None:
        """Close a checked-out JVM (its episode ended, or it failed)."""
        with self._cond:
            self._busy.discard(sim)
            self._cond.notify_all()
        sim.close()

    def release(self, episode: str) -> bool:
        """Close the JVM holding ``episode`` now (or when it is checked in, if busy): whether one was held."""
        with self._cond:
            sim = self._idle.pop(episode, None)
            if sim is None:
                busy = [s for s in self._busy if not isinstance(s, _Placeholder) and s.episode == episode]
                for s in busy:
                    s.doomed = True
                return bool(busy)
            self._cond.notify_all()
        sim.close()
        self.counts["released"] += 1
        return True

    def reap(self, now: float | None = None) -> int:
        """Close the idle episodes unused for ``idle_ttl_s``: how many."""
        now = self._clock() if now is None else now
        with self._cond:
            old = [e for e, s in self._idle.items() if now - s.last_used >= self.idle_ttl_s]
            victims = [self._idle.pop(e) for e in old]
            if victims:
                self._cond.notify_all()
        for sim in victims:
            sim.close()
        self.counts["reaped"] += len(victims)
        return len(victims)

    def holds(self, episode: str) -> Simulator | None:
        """The idle JVM holding ``episode``, left where it is (for tests and the benchmark)."""
        with self._cond:
            return self._idle.get(episode)

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {
                "spares": len(self._spares),
                "starting": self._starting,
                "idle": len(self._idle),
                "busy": len(self._busy),
                **self.counts,
            }

    def pids(self) -> set[int]:
        """The process ids of every JVM the pool holds."""
        with self._cond:
            sims = [*self._spares, *self._idle.values(), *self._busy]
        return {s.pid for s in sims if not isinstance(s, _Placeholder) and not s.closed}

    def wait_for_spares(self, count: int | None = None, timeout_s: float = 120.0) -> bool:
        """Block until ``count`` (default: all) spares are ready (tests, benchmarks, warm-up)."""
        self.start()
        want = self.spares_target if count is None else count
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while len(self._spares) < want:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def shutdown(self) -> None:
        """Close every JVM and stop the threads (the worker is stopping)."""
        with self._cond:
            self._stopped = True
            sims = [
                *self._spares,
                *self._idle.values(),
                *(s for s in self._busy if not isinstance(s, _Placeholder)),
            ]
            self._spares.clear()
            self._idle.clear()
            self._cond.notify_all()
        for sim in sims:
            sim.close()
        for thread in self._threads:
            thread.join(timeout=5)


class _Placeholder:
    """Holds a live slot while a cold JVM starts outside the lock."""

    episode = None
    closed = False
