"""SciWorld: AgentGym's recorded episodes replayed through our routes, the replay log (live JVM vs a fresh JVM
that replays), the JVM pool (bounds, close, reaping, a killed JVM, threads).

Every recorded episode was the first load in a fresh JVM, so each replayed one takes a fresh JVM too (the pool's
spares): a full replay of the 59 takes minutes (``slow``); a subset covering every policy runs always. The pool's
bookkeeping is also tested with fake simulators (no JVM, fast).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agent_envs.envs import agentgym as protocol
from agent_envs.envs.agentgym import InProcessAgentGym, replay_trace
from agent_envs.envs.contract import BadState, EpisodeLost, EpisodeOver, Transition, UnknownTask
from agent_envs.envs.sciworld import (
    AGENTGYM_ROUTES,
    GAME_COUNT,
    JvmPool,
    SciWorldEnv,
    Simulator,
    SimulatorsBusy,
    SimulatorUnavailable,
    game,
    python_index,
)
from agent_envs.envs.sciworld import games as games_module
from agent_envs.envs.sciworld.agentgym import documented_difference

TRACES = Path(__file__).parents[1] / "fixtures" / "conformance" / "agentgym-sciworld"
HAVE_JVM = (
    shutil.which("java") is not None and __import__("importlib").util.find_spec("scienceworld") is not None
)
needs_jvm = pytest.mark.skipif(not HAVE_JVM, reason="needs java and the scienceworld package")

# Always run (`make test`): a bad data_idx (no JVM), random actions (an episode whose reload in one JVM differs:
# it fails when a JVM serves two episodes), edge strings with every probe route, and edge strings ending in a
# failed focus with the routes after done and after close. In `make test-all` also: gold reaching done (data_idx
# -1), the move-counter probe, and edge strings with 3,000-character actions.
FAST_SUBSET = (4639, 4136, 1436, 4446)
SLOW_SUBSET = (-1, 3500, 30)


@pytest.fixture(scope="module")
def episodes() -> dict[int, dict[str, Any]]:
    lines = (TRACES / "traces.jsonl").read_text().splitlines()
    return {e["data_idx"]: e for e in map(json.loads, lines)}


@pytest.fixture(scope="module")
def env() -> Iterator[SciWorldEnv]:
    """One core for the module: 1 spare JVM, at most 4 live."""
    if not HAVE_JVM:
        pytest.skip("needs java and the scienceworld package")
    core = SciWorldEnv(JvmPool(spares=1, max_live=4, idle_ttl_s=600, wait_s=120))
    core.prewarm()
    yield core
    core.shutdown()


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def replay(env: SciWorldEnv, episode: dict[str, Any]) -> list[str]:
    """The episode through AgentGym's protocol in process, differences listed, minus the documented ones
    (``documented_difference``: ``/goals`` and ``/state`` before a reset, where the original leaks a Java stack
    trace and ours answers the simulator's own "not initialized" text)."""
    assert max((len(s["action"]) for s in episode["steps"]), default=0) <= protocol.MAX_FIELD_CHARS
    gym = InProcessAgentGym(env, AGENTGYM_ROUTES)
    return [
        f"data_idx {episode['data_idx']}: {difference[:600]}"
        for difference in replay_trace(episode, gym.call, documented_difference)
    ]


def play(env: SciWorldEnv, episode: dict[str, Any], upto: int | None = None) -> list[Transition]:
    """Reset and step an episode's recorded actions through the core: the transitions (reset first)."""
    index = python_index(episode["data_idx"])
    assert index is not None
    out = [env.reset(index)]
    for step in episode["steps"][:upto]:
        if out[-1].done:
            break
        out.append(env.step(out[-1].state, step["action"]))
    return out


def wire(result: Transition) -> dict[str, Any]:
    return {"observation": result.observation, "reward": int(result.reward), "score": result.info["score"],
            "done": result.done}  # fmt: skip


# ---- the task list (no JVM) ------------------------------------------------------------------------------
def test_games_are_the_recorded_list() -> None:
    recorded = json.loads((TRACES / "games.json").read_text())["tasks"]
    assert GAME_COUNT == 4639 == sum(t["n_variations"] for t in recorded)
    for task in recorded:
        first, count = task["first_data_idx"], task["n_variations"]
        assert game(first) == (task["task_name"], 0)
        assert game(first + count - 1) == (task["task_name"], count - 1)
    assert python_index(-1) == 4638 and python_index(-4639) == 0
    assert python_index(4639) is None and python_index(-4640) is None
    with pytest.raises(IndexError):
        game(4639)


def test_bad_input_is_refused_before_any_jvm() -> None:
    env = SciWorldEnv(JvmPool(spares=0, max_live=1, start=_refuse))
    with pytest.raises(UnknownTask):
        env.reset(GAME_COUNT)
    with pytest.raises(UnknownTask):
        env.reset(-1)
    good = {
        "v": 1,
        "task": 0,
        "episode": "e",
        "actions": [],
        "score": 0,
        "moves": 0,
        "done": False,
        "check": "",
    }
    for bad in (
        None,
        [],
        {**good, "v": 2},
        {**good, "task": 4639},
        {**good, "actions": [1]},
        {**good, "done": 1},
    ):
        with pytest.raises(BadState):
            env.step(bad, "look around")
    with pytest.raises(EpisodeOver):
        env.step({**good, "done": True}, "look around")


def _refuse() -> Simulator:
    raise AssertionError("this test must not start a JVM")


def test_bad_data_idx_episode_needs_no_jvm(episodes: dict[int, dict[str, Any]]) -> None:
    """The recorded reset past the end (and everything before a reset) is answered without a JVM."""
    env = SciWorldEnv(JvmPool(spares=0, max_live=1, start=_refuse))
    assert replay(env, episodes[4639]) == []


# ---- the pool's bookkeeping, with fake simulators (no JVM) ------------------------------------------------
class FakeSim:
    pids = itertools.count(1)

    def __init__(self) -> None:
        self.pid = next(self.pids)
        self.episode: str | None = None
        self.closed = self.doomed = False
        self.last_used = 0.0

    def close(self) -> None:
        self.closed = True


def test_pool_keeps_spares_and_bounds_live_jvms() -> None:
    pool = JvmPool(spares=2, max_live=2, wait_s=0.2, start=FakeSim)
    assert pool.wait_for_spares(timeout_s=10)
    sims = []
    for name in "ab":
        sim = pool.fresh()
        sim.episode = name
        pool.checkin(sim)
        sims.append(sim)
    assert pool.stats()["idle"] == 2 and pool.stats()["from_spare"] == 2
    third = pool.fresh()  # the cap: the least recently used idle episode ("a") is closed
    assert sims[0].closed and not sims[1].closed and pool.holds("a") is None
    assert pool.stats()["evicted"] == 1
    second = pool.checkout("b")
    assert second is sims[1]
    with pytest.raises(SimulatorsBusy):  # both slots busy, nothing idle to evict
        pool.fresh()
    done = threading.Event()

    def free_one() -> None:
        time.sleep(0.05)
        pool.discard(third)
        done.set()

    pool.wait_s = 30
    threading.Thread(target=free_one).start()
    assert pool.fresh() is not None and done.is_set()  # waited for the slot
    pool.shutdown()
    assert all(s.closed for s in sims)


def test_pool_release_reap_and_doom() -> None:
    now = [100.0]
    pool = JvmPool(spares=0, max_live=4, idle_ttl_s=60, start=FakeSim, clock=lambda: now[0])
    a, b, c = pool.fresh(), pool.fresh(), pool.fresh()
    for sim, name in ((a, "a"), (b, "b"), (c, "c")):
        sim.episode = name
    pool.checkin(a)
    now[0] += 50
    pool.checkin(b)
    assert pool.release("b") is True and b.closed and pool.release("b") is False
    now[0] += 20  # a idle 70 s: reaped; c is busy (checked out): never reaped
    assert pool.reap() == 1 and a.closed and not c.closed
    assert pool.release("c") is True and not c.closed  # busy: closed when it comes back
    pool.checkin(c)
    assert c.closed and pool.stats()["idle"] == 0
    assert pool.stats()["cold_starts"] == 3
    pool.shutdown()


def test_a_jvm_that_cannot_start_is_a_retryable_error() -> None:
    def broken() -> Simulator:
        raise FileNotFoundError("java")

    pool = JvmPool(spares=0, max_live=1, start=broken)
    with pytest.raises(SimulatorUnavailable, match="could not start"):
        SciWorldEnv(pool).reset(0)
    assert pool.stats()["busy"] == 0  # the slot is given back
    pool.shutdown()


# ---- the simulator itself --------------------------------------------------------------------------------
@needs_jvm
@pytest.mark.slow
def test_task_table_matches_the_simulator() -> None:
    sim = Simulator()
    try:
        ids, variations = sim.task_ids_and_variations()
        assert games_module.check_against(ids, variations) == []
    finally:
        sim.close()
    assert not alive(sim.pid)


@needs_jvm
@pytest.mark.parametrize(
    "data_idx", [*FAST_SUBSET, *(pytest.param(n, marks=pytest.mark.slow) for n in SLOW_SUBSET)]
)
def test_recorded_episode_replays(
    env: SciWorldEnv, episodes: dict[int, dict[str, Any]], data_idx: int
) -> None:
    assert replay(env, episodes[data_idx]) == []


@needs_jvm
@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_every_recorded_episode_replays(env: SciWorldEnv, episodes: dict[int, dict[str, Any]]) -> None:
    assert len(episodes) == 59
    differences = [d for e in episodes.values() for d in replay(env, e)]
    assert differences == []


@needs_jvm
def test_a_simulators_calls_stay_on_one_java_thread_whatever_another_thread_collects() -> None:
    """Identity hashes, so the order the simulator lists a room's objects in, are per Java thread, and py4j runs a
    call on a new Java thread when it opens a new connection. With py4j's memory management on, a Python proxy
    collected while a call is in flight (another thread's garbage collection) sends Java a release on a new
    connection; later calls then run on its thread (CI saw data_idx 4186's cups reorder from step 18). The
    simulator's gateway sends no such command: dropping a proxy while the one connection is busy opens none."""
    import gc

    sim = Simulator()
    try:
        client = sim._env._gateway._gateway_client
        proxy = sim._env._gateway.jvm.java.util.ArrayList()  # a Java object the Python side holds
        assert len(client.deque) == 1  # the one connection every call has used
        busy = client.deque.pop()  # a call in flight holds it
        del proxy
        gc.collect()
        assert len(client.deque) == 0, "collecting a proxy opened a second connection (a second Java thread)"
        client.deque.append(busy)
    finally:
        sim.close()


@needs_jvm
@pytest.mark.parametrize("cpus", [1, 64])
def test_a_first_load_reads_as_recorded_whatever_cpus_the_host_has(
    episodes: dict[int, dict[str, Any]], monkeypatch: pytest.MonkeyPatch, cpus: int
) -> None:
    """data_idx 659's room lists three paint cups, and the ambiguity menu its paints, in identity-hash order, which
    follows the CPU count the JVM sees. ``JAVA_TOOL_OPTIONS`` plays a host of 1 or 64 CPUs; the Simulator's own
    options (``JVM_OPTIONS``) come after it and win, so the load reads as recorded. Without them both hosts list
    the cups in another order (CI's host did, and a menu's ``0`` then connects another paint)."""
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", f"-XX:ActiveProcessorCount={cpus}")
    episode = episodes[659]
    sim = Simulator()
    try:
        description, first = sim.load(episode["task_name"], episode["variation"])
        assert (description, first.observation) == (
            episode["reset"]["response"]["task_description"],
            episode["reset"]["response"]["observation"],
        )
        for step in episode["steps"][:2]:  # the menu, then its "0"
            assert sim.step(step["action"]).observation == step["response"]["observation"]
    finally:
        sim.close()


@needs_jvm
@pytest.mark.slow
def test_moves_and_state_route(env: SciWorldEnv, episodes: dict[int, dict[str, Any]]) -> None:
    """GET /state's move counter where the step-limit recording probed it (look/inventory/task: 0 moves,
    wait1: 2, wait: 11)."""
    episode = episodes[3500]
    gym = InProcessAgentGym(env, AGENTGYM_ROUTES)
    sid = gym.call("POST", "/create")[1]["id"]
    gym.call("POST", "/reset", {"id": sid, "data_idx": 3500})
    probes = {p["after_step"]: p["current_moves"] for p in episode["moves_probes"]}
    for n, step in enumerate([None, *episode["steps"]]):
        if step is not None:
            gym.call("POST", "/step", {"id": sid, "action": step["action"]})
        if n in probes:
            status, body = gym.call("GET", "/state", {"id": sid})
            assert status == 200 and body["current_moves"] == probes[n], n
            assert body["environment_info"]["task_name"] == "find-non-living-thing"
    assert gym.call("POST", "/close", {"id": sid}) == (200, True)


@needs_jvm
@pytest.mark.slow
def test_move_limit_ends_the_episode(env: SciWorldEnv) -> None:
    """More than 100 moves ends an episode: ``wait1`` (2 moves) the 51st time."""
    result = env.reset(2500)
    for n in range(1, 52):
        result = env.step(result.state, "wait1")
        assert result.done == (n == 51), n
    assert result.info["moves"] == 102
    with pytest.raises(EpisodeOver):
        env.step(result.state, "look around")


# ---- the replay log: live JVM vs a fresh one -------------------------------------------------------------
@needs_jvm
@pytest.mark.slow
def test_a_fresh_jvm_replays_what_the_live_one_answered(
    env: SciWorldEnv, episodes: dict[int, dict[str, Any]]
) -> None:
    """Another replica (a second core with its own pool) continues the episode from any recorded state with
    exactly the live answers: observation, reward, done, info and the next state."""
    episode = episodes[4136]  # random actions; its second load in one JVM lists objects differently
    live = play(env, episode, upto=20)
    other = SciWorldEnv(JvmPool(spares=1, max_live=2))
    try:
        for k in (0, 9, 19):
            again = other.step(live[k].state, episode["steps"][k]["action"])
            assert again == live[k + 1], k
        assert other.pool.counts["replays"] == 3
    finally:
        other.shutdown()


@needs_jvm
def test_a_killed_jvm_is_replaced_by_a_replay(env: SciWorldEnv, episodes: dict[int, dict[str, Any]]) -> None:
    """kill -9 the live JVM mid-episode: the next step replays in a fresh JVM and answers what the live one
    did (the recording); the rest of the episode goes on in the new JVM."""
    episode = episodes[1436]
    results = play(env, episode, upto=6)
    episode_id = results[-1].state["episode"]
    pid = env.pool.holds(episode_id).pid
    replays = env.pool.counts["replays"]
    os.kill(pid, signal.SIGKILL)
    state = results[-1].state
    for step in episode["steps"][6:]:
        result = env.step(state, step["action"])
        assert wire(result) == step["response"]
        state = result.state
    assert env.pool.counts["replays"] == replays + 1
    assert env.pool.holds(episode_id).pid != pid
    assert env.close(state) is True


@needs_jvm
def test_reaping_and_close_free_the_jvm_at_once_and_the_state_stays_valid(env: SciWorldEnv) -> None:
    first = env.reset(4136)
    episode = first.state["episode"]
    sim = env.pool.holds(episode)
    assert sim is not None and alive(sim.pid)
    assert env.pool.reap(now=time.monotonic() + 10) == 0  # not idle for long enough
    assert env.pool.reap(now=time.monotonic() + env.pool.idle_ttl_s + 1) >= 1
    assert env.pool.holds(episode) is None and not alive(sim.pid)
    again = env.step(first.state, "look around")  # replayed in a fresh JVM
    assert again.observation == first.observation and again.info == {"score": 0, "moves": 0}
    sim = env.pool.holds(episode)
    assert sim is not None and alive(sim.pid)
    assert env.close(again.state) is True
    assert not alive(sim.pid)  # gone before close returned
    assert env.close(again.state) is False and env.pool.holds(episode) is None


@needs_jvm
@pytest.mark.slow
def test_finished_episode_frees_its_jvm(env: SciWorldEnv, episodes: dict[int, dict[str, Any]]) -> None:
    results = play(env, episodes[4433])  # gold, done on the first step
    assert results[-1].done and results[-1].info["score"] == 100
    assert env.pool.holds(results[-1].state["episode"]) is None


@needs_jvm
@pytest.mark.slow
def test_eviction_keeps_the_live_cap_and_the_evicted_episode_replays(
    episodes: dict[int, dict[str, Any]],
) -> None:
    core = SciWorldEnv(JvmPool(spares=1, max_live=2))
    try:
        a, b = (episodes[n] for n in (4136, 1436))
        first_a = core.reset(python_index(a["data_idx"]))
        first_b = core.reset(python_index(b["data_idx"]))
        third = core.reset(3500)  # evicts a (least recently used)
        assert core.pool.stats()["evicted"] == 1 and core.pool.holds(first_a.state["episode"]) is None
        assert len(core.pool.pids()) <= 1 + 2
        step = core.step(first_a.state, a["steps"][0]["action"])
        assert wire(step) == a["steps"][0]["response"]
        assert core.pool.counts["replays"] == 1
        del first_b, third
    finally:
        core.shutdown()
    assert core.pool.pids() == set()


@needs_jvm
def test_concurrent_episodes_from_threads(env: SciWorldEnv, episodes: dict[int, dict[str, Any]]) -> None:
    chosen = [episodes[n] for n in (4433, 4257, 4362)]  # gold: 2, 2 and 9 steps

    def run(episode: dict[str, Any]) -> list[str]:
        results = play(env, episode)
        return [
            f"{episode['data_idx']} step {n}"
            for n, (result, step) in enumerate(zip(results[1:], episode["steps"], strict=False))
            if wire(result) != step["response"]
        ]

    with ThreadPoolExecutor(3) as workers:
        assert [d for found in workers.map(run, chosen) for d in found] == []


@needs_jvm
def test_a_tampered_state_is_lost_not_forked(env: SciWorldEnv) -> None:
    """A replay whose transcript differs from the state's digest is ``EpisodeLost``, never a silent fork."""
    first = env.reset(4433)
    env.close(first.state)
    with pytest.raises(EpisodeLost, match=first.state["episode"]):
        env.step({**first.state, "check": "0" * 16}, "look around")


@needs_jvm
@pytest.mark.slow
def test_expert_solves_its_task(env: SciWorldEnv, episodes: dict[int, dict[str, Any]]) -> None:
    """ScienceWorld's gold path, made in a fresh JVM, solves the episode. Where the task lets it choose (any
    plant), it may choose another object than the recording's gold path, which came from a JVM reused for many
    loads; where it does not, it is the recorded one."""
    assert env.expert(4433) == episodes[4433]["gold_sequence"]
    index = python_index(episodes[3811]["data_idx"])  # find-plant: the recording focused on a banana tree
    expert = env.expert(index)
    env._experts.clear()  # made again in another fresh JVM: the same
    assert expert is not None and expert == env.expert(index)
    result = env.reset(index)
    for action in expert:
        result = env.step(result.state, action)
    assert result.done and result.info["score"] == 100


@needs_jvm
def test_an_app_stopped_in_a_process_leaves_the_next_app_a_running_core(generated_catalog_dir: Path) -> None:
    """The core is one per process (``registry.make``); an app's shutdown stops its JVM pool, and a second app in
    the same process (a restarted worker, the next test) must get a core that runs, not the stopped one that
    answers every reset 503 "shutting down"."""
    from fastapi.testclient import TestClient

    from agent_envs.api.app import create_app
    from agent_envs.api.settings import Settings

    def first_reset() -> Any:
        settings = Settings(
            catalog=generated_catalog_dir,
            state_secret=os.urandom(32).hex(),
            access_log=False,
            envs="sciworld",
        )
        with TestClient(create_app(settings)) as client:
            created = client.post("/sciworld/v1/reset", json={"task": 3500})
            assert created.status_code == 200, created.text
            return created.json()["observation"]

    assert first_reset() == first_reset()
