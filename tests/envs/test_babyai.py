"""BabyAI: the core and its AgentGym routes against the recordings of AgentGym's own server, plus what the
recordings cannot show (a cold replica replaying a state token, threads, the expert, bad input, stdout)."""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("minigrid", reason="minigrid (the BabyAI simulator) is not installed")

from agent_envs.envs import agentgym as protocol
from agent_envs.envs.agentgym import InProcessAgentGym, replay_trace
from agent_envs.envs.babyai import (
    AGENTGYM_ROUTES,
    ActionRefused,
    BabyAI,
    TooManySteps,
    core,
    make,
)
from agent_envs.envs.babyai.levels import LEVELS, level_of
from agent_envs.envs.contract import (
    BadState,
    EnvError,
    EpisodeOver,
    TextEnv,
    Transition,
    UnknownTask,
)

TRACES = Path(__file__).parents[1] / "fixtures" / "conformance" / "agentgym-babyai"
ORACLE = TRACES.with_name("agentgym-babyai-oracle")


@pytest.fixture(scope="module")
def env() -> BabyAI:
    return make()


@pytest.fixture(scope="module")
def episodes() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (TRACES / "traces.jsonl").read_text().splitlines()]


def cold() -> BabyAI:
    """A core that keeps nothing: every step replays its state from a fresh reset (a replica that never saw
    the episode)."""
    return BabyAI(episode_cache=0, fresh_cache=0)


def same(a: Transition, b: Transition) -> bool:
    return (a.observation, a.reward, a.done, a.state, dict(a.info)) == (
        b.observation,
        b.reward,
        b.done,
        b.state,
        dict(b.info),
    )


def random_episode(
    env: BabyAI, task: int, steps: int, rng: random.Random
) -> list[tuple[Any, str, Transition]]:
    """(state before, action, transition) for a random walk: listed actions mostly, some invalid or odd ones."""
    odd = ["", "  ", "check", "pick up the ball", "drop", "toggle", "Move Forward ", "go to goal", "x" * 300]
    transition = env.reset(task)
    out = []
    for _ in range(steps):
        if transition.done:
            break
        listed = transition.info["available_actions"]
        action = rng.choice(odd) if rng.random() < 0.2 else rng.choice(listed)
        before = transition.state
        transition = env.step(before, action)
        out.append((before, action, transition))
    return out


# ---- conformance ------------------------------------------------------------------------------------------
def test_level_table_is_the_recorded_one(episodes: list[dict[str, Any]]) -> None:
    meta = json.loads((TRACES / "meta.json").read_text())
    assert [meta["data"]["levels"][str(n)] for n in range(1, 41)] == list(LEVELS)
    for episode in episodes:
        assert level_of(episode["data_idx"]) == (episode["level"], episode["seed"])


def test_every_trace_replays_without_difference(env: BabyAI, episodes: list[dict[str, Any]]) -> None:
    """All 240 recorded episodes through AgentGym's protocol in process: every answer from /reset on equal
    (the 3,000-character action included)."""
    assert len(episodes) == 240
    assert max(len(s["action"]) for e in episodes for s in e["steps"]) <= core.MAX_ACTION_CHARS
    gym = InProcessAgentGym(env, AGENTGYM_ROUTES)
    differences = [
        f"data_idx {episode['data_idx']}: {difference[:600]}"
        for episode in episodes
        for difference in replay_trace(episode, gym.call)
    ]
    assert differences == []


def oracle_episodes(selected: bool) -> list[dict[str, Any]]:
    """The episodes recorded from AgentGym's server for this project (``agentgym-babyai-oracle``): those its
    meta.json lists for ``make test`` (every one the implementation before issue 36 replayed differently, and a
    sample of the others), or all of them."""
    meta = json.loads((ORACLE / "meta.json").read_text())
    keep = set(meta["make_test_episodes"]) if selected else None
    with gzip.open(ORACLE / "traces.jsonl.gz", "rt") as lines:
        episodes = [json.loads(line) for number, line in enumerate(lines) if keep is None or number in keep]
    assert len(episodes) == (len(keep) if keep is not None else meta["counts"]["episodes"])
    return episodes


def replay_differences(env: BabyAI, episodes: list[dict[str, Any]]) -> list[str]:
    gym = InProcessAgentGym(env, AGENTGYM_ROUTES)
    return [
        f"data_idx {episode['data_idx']} ({episode['policy']}): {difference[:600]}"
        for episode in episodes
        for difference in replay_trace(episode, gym.call)
    ]


def test_new_oracle_episodes_replay_without_difference(env: BabyAI) -> None:
    """Episodes recorded from AgentGym's server with random, go-to-heavy and edge policies (unrecognised actions,
    go-to of objects out of view or never seen, the same go-to again), never used to write the code: the ones
    that pin the planner's choice among shortest paths, the numbering of reachable objects and the locked
    door's missing "go through" message, and a sample of the rest. Every answer equal."""
    assert replay_differences(env, oracle_episodes(selected=True)) == []


def test_every_new_oracle_episode_replays_without_difference(env: BabyAI) -> None:
    """All of that recording (make test-all: conftest.py's SLOW says why)."""
    assert replay_differences(env, oracle_episodes(selected=False)) == []


def test_the_routes_where_the_recordings_are_silent(env: BabyAI) -> None:
    gym = InProcessAgentGym(env, AGENTGYM_ROUTES, first_id=7)
    assert gym.call("GET", "/", {}) == (200, "This is environment BabyAI.")
    assert gym.call("POST", "/create", None) == (200, {"id": 7})
    assert gym.call("POST", "/close", {"id": 7}) == (200, True)
    assert gym.call("POST", "/close", {"id": 7}) == (200, False)
    assert gym.call("POST", "/create", None) == (200, {"id": 8})
    # the seed of a negative data_idx is data_idx // 40
    assert gym.call("POST", "/reset", {"id": 8, "data_idx": -41}) == (
        200,
        {"error": "Seed must be greater or equal to zero, actual value: -2"},
    )
    assert gym.call("POST", "/reset", {"id": 8})[0] == 422  # data_idx is required
    status, first = gym.call(
        "POST", "/reset", {"id": 8, "data_idx": 10**12 + 1}
    )  # any size, like the original
    assert status == 200 and first["observation"] == env.start(10**12 + 1).observation
    # right after a reset, /observation repeats the reset's observation
    status, seen = gym.call("GET", "/observation", {"id": 8})
    assert seen == {
        "observation": first["observation"],
        "reward": 0,
        "score": 0,
        "done": False,
        "deleted": False,
    }
    # a solved episode refuses /step and /observation; /reset starts again
    plan = env.expert(2)
    assert plan is not None
    gym.call("POST", "/reset", {"id": 8, "data_idx": 2})
    for action in plan:
        status, body = gym.call("POST", "/step", {"id": 8, "action": action})
    assert body["done"] is True and body["score"] == body["reward"] > 0.5
    assert gym.call("POST", "/step", {"id": 8, "action": "turn left"}) == (
        200,
        {"error": "The task with environment 8 has finished."},
    )
    assert gym.call("GET", "/observation", {"id": 8})[1] == {
        "error": "The task with environment 8 has finished."
    }
    assert gym.call("POST", "/reset", {"id": 8, "data_idx": 2})[1]["done"] is False


def test_sessions_are_json(env: BabyAI) -> None:
    gym = InProcessAgentGym(env, AGENTGYM_ROUTES)
    gym.call("POST", "/create", None)
    assert json.loads(json.dumps(gym.sessions[0])) == gym.sessions[0]
    gym.call("POST", "/reset", {"id": 0, "data_idx": 5})
    for action in ("turn left", "check available actions", "nonsense", "move forward"):
        gym.call("POST", "/step", {"id": 0, "action": action})
        assert json.loads(json.dumps(gym.sessions[0])) == gym.sessions[0]


def test_an_overlong_action_is_refused_and_a_long_one_is_not(env: BabyAI) -> None:
    """The routes cap a field at ``MAX_FIELD_CHARS`` (422, like a mistyped field); the core takes as much."""
    assert core.MAX_ACTION_CHARS == protocol.MAX_FIELD_CHARS
    gym = InProcessAgentGym(env, AGENTGYM_ROUTES)
    gym.call("POST", "/create", None)
    gym.call("POST", "/reset", {"id": 0, "data_idx": 0})
    assert gym.call("POST", "/step", {"id": 0, "action": "x" * (core.MAX_ACTION_CHARS + 1)})[0] == 422
    status, body = gym.call("POST", "/step", {"id": 0, "action": "x" * core.MAX_ACTION_CHARS})
    assert status == 200 and body["observation"].startswith("The action is not recognized.")


# ---- the core ---------------------------------------------------------------------------------------------
def test_the_core_fits_the_contract(env: BabyAI) -> None:
    assert isinstance(env, TextEnv)
    assert (env.env_id, env.state_travel) == ("babyai", "token")
    assert env.task_count() == 40 * core.SEEDS
    assert env.fingerprint() == make().fingerprint()
    first = env.reset(0)
    assert first.observation.startswith("Your goal: go to the red ball\n")
    assert (first.reward, first.done, first.state) == (0, False, {"task": 0, "steps": []})
    assert first.info["available_actions"][-1] == "check available actions"


def test_state_is_small_json_and_never_mutated(env: BabyAI) -> None:
    rng = random.Random(1)
    for task in (38, 39, 37, 13):
        for before, action, transition in random_episode(env, task, 30, rng):
            frozen = json.dumps(before)
            again = env.step(json.loads(frozen), action)
            assert json.dumps(before) == frozen
            assert same(again, transition)
            assert json.loads(json.dumps(transition.state)) == transition.state
            assert len(json.dumps(transition.state)) < 40 + 30 * 64


def test_a_cold_replica_answers_what_the_warm_one_does(env: BabyAI) -> None:
    """Every step of random episodes, taken again by a core that must rebuild the episode from the state
    (reset + replay of the recorded primitives), gives the same transition."""
    rng = random.Random(7)
    replica = cold()
    for task in [*rng.sample(range(env.task_count()), 10), 38, 39]:
        for before, action, transition in random_episode(env, task, 20, rng):
            assert same(replica.step(before, action), transition), (task, action)
    assert replica.live.hits == 0  # it really replayed


def test_a_cold_replica_replays_recorded_slow_successes(env: BabyAI, episodes: list[dict[str, Any]]) -> None:
    """The recorded "slow" episodes succeed with a reward of 0.5 or less and go on, so the sticky reward and the
    score that keeps adding it must survive a replay of steps that ran nothing (checks, invalid actions)."""
    slow = [e for e in episodes if e["policy"] == "slow"]
    assert len(slow) == 4
    replica = cold()
    scores = []
    for episode in slow:
        transition = env.reset(episode["data_idx"])
        for step in episode["steps"]:
            if transition.done:
                break
            for action in (step["action"], "check available actions"):  # a step that runs nothing, too
                if transition.done:
                    break
                warm = env.step(transition.state, action)
                assert same(replica.step(transition.state, action), warm)
                transition = warm
        scores.append(transition.info["score"])
    assert max(scores) > 1  # a slow success's reward added at every later step (the recorded 1.51 and more)


def test_a_fresh_process_replays_the_same(env: BabyAI, tmp_path: Path) -> None:
    """Another interpreter (another hash seed) stepping from the states answers byte for byte the same."""
    rng = random.Random(3)
    cases = [(b, a, t) for task in (38, 117, 22) for b, a, t in random_episode(env, task, 15, rng)]
    (tmp_path / "cases.json").write_text(json.dumps([[b, a] for b, a, _ in cases]))
    script = (
        "import json, sys\n"
        "from agent_envs.envs.babyai import make\n"
        "env = make()\n"
        "out = []\n"
        "for state, action in json.load(open(sys.argv[1])):\n"
        "    t = env.step(state, action)\n"
        "    out.append([t.observation, t.reward, t.done, t.state, dict(t.info)])\n"
        "print(json.dumps(out))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "cases.json")],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    got = json.loads(run.stdout)
    want = [[t.observation, t.reward, t.done, t.state, dict(t.info)] for _, _, t in cases]
    assert got == json.loads(json.dumps(want))


def test_concurrent_steps_from_threads_are_correct(env: BabyAI) -> None:
    """Threads stepping the same and different states at once (the cache hands a live episode to one
    request; the others replay) all get what a lone cold replica answers."""
    rng = random.Random(11)
    cases = [(b, a) for task in (38, 5, 77) for b, a, _ in random_episode(env, task, 12, rng)]
    expected = [cold().step(b, a) for b, a in cases]
    work = [i for i in range(len(cases)) for _ in range(3)]
    rng.shuffle(work)
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda i: (i, env.step(*cases[i])), work))
    assert all(same(result, expected[i]) for i, result in results)


def test_minigrid_stays_off_stdout(capfd: pytest.CaptureFixture[str]) -> None:
    """Task 6 (GoToImpUnlock, seed 0) makes minigrid print "Sampling rejected: ..." while generating it."""
    BabyAI().reset(6)
    assert capfd.readouterr().out == ""


def test_the_expert_solves_simple_levels(env: BabyAI) -> None:
    for task in (0, 1, 2, 3, 4, 8, 9, 16, 21, 30):
        plan = env.expert(task)
        assert plan is not None, task
        transition = env.reset(task)
        for action in plan:
            transition = env.step(transition.state, action)
        assert transition.done, task


def test_bad_input_is_a_clear_error(env: BabyAI) -> None:
    for task in (-1, env.task_count(), "3", True, 2.0):
        with pytest.raises(UnknownTask):
            env.reset(task)  # type: ignore[arg-type]
    good = env.reset(0).state
    tampered = [
        None,
        [],
        {"task": 0},
        {"task": 0, "steps": "2"},
        {"task": -1, "steps": []},
        {"task": True, "steps": []},
        {"task": 0, "steps": [2]},
        {"task": 0, "steps": ["29"]},
        {"task": 0, "steps": ["1" * (core.MAX_STEP_PRIMITIVES + 1)]},
        {"task": 0, "steps": [""] * (core.MAX_STEPS + 1)},
        {**good, "extra": 1},
    ]
    for state in tampered:
        with pytest.raises(BadState):
            env.step(state, "turn left")
    with pytest.raises(TooManySteps):
        env.step({"task": 0, "steps": [""] * core.MAX_STEPS}, "turn left")
    with pytest.raises(ActionRefused):
        env.step(good, "x" * (core.MAX_ACTION_CHARS + 1))
    with pytest.raises(ActionRefused):
        env.step(good, 5)  # type: ignore[arg-type]
    # a finished episode, and a state that goes on past the end
    plan = env.expert(0)
    assert plan is not None
    transition = env.reset(0)
    for action in plan:
        transition = env.step(transition.state, action)
    assert transition.done
    with pytest.raises(EpisodeOver):
        env.step(transition.state, "turn left")
    with pytest.raises(BadState):
        cold().step({"task": 0, "steps": [*transition.state["steps"], "0"]}, "turn left")
    assert issubclass(ActionRefused, EnvError) and issubclass(TooManySteps, EnvError)


def test_success_is_false_on_a_failed_ending(env: BabyAI, episodes: list[dict[str, Any]]) -> None:
    """A level can end in failure (e.g. PutNext: the wrong object), which the original also calls "The task is
    completed." with reward 0; the native ``info.success`` is false there, and true on the expert's success."""
    episode = next(
        e for e in episodes if e["data_idx"] == 23535
    )  # random policy: a `toggle` ends it, reward 0
    result = env.reset(episode["data_idx"])
    for step in episode["steps"][:4]:
        result = env.step(result.state, step["action"])
    assert "The task is completed." in result.observation and result.reward == 0
    assert result.info["success"] is False
    result = env.reset(3)
    for action in env.expert(3):
        result = env.step(result.state, action)
    assert result.done and result.reward > 0.5 and result.info["success"] is True
