"""Sokoban: the core (rooms per task, gym-sokoban's rules and rewards, RAGEN's rendering, the expert), its state
token's path, bad input, and the environment served by the real app (native routes, signed tokens, no AgentGym
routes). AgentGym has no Sokoban server, so there are no recordings to replay: the rules are checked here against
gym-sokoban's own code (its generator's rooms, its rewards as written in its ``SokobanEnv.step``)."""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import itertools
import json
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

if importlib.util.find_spec("gym_sokoban") is None:
    pytest.skip("gym-sokoban (Sokoban's rooms) is not installed", allow_module_level=True)

from agent_envs.envs import registry
from agent_envs.envs.contract import BadState, EnvError, EpisodeOver, TextEnv, Transition, UnknownTask
from agent_envs.envs.sokoban import AGENTGYM_ROUTES, ActionRefused, Sokoban, core, make, rooms
from agent_envs.envs.sokoban.rooms import Room

SECRET = "k3N9-pQ2_vX7zL4mR8tB-wYc5"


@pytest.fixture(scope="module")
def env() -> Sokoban:
    return make()


def play(env: Sokoban, task: int, actions: list[str]) -> list[Transition]:
    """Every transition of ``actions`` from the reset, the state through JSON between steps (as a token)."""
    transitions = [env.reset(task)]
    for action in actions:
        state = json.loads(json.dumps(transitions[-1].state))
        transitions.append(env.step(state, action))
    return transitions


def plain_generator() -> Any:
    """gym-sokoban's room_utils as its own code runs it (a second private copy, on the global generators)."""
    spec = importlib.util.spec_from_file_location("plain_room_utils", rooms.generator_path())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rooms_digest(tasks: range) -> str:
    return hashlib.sha256(repr([rooms.room(t) for t in tasks]).encode()).hexdigest()


# ---- the contract ------------------------------------------------------------------------------------------------
def test_the_core_fits_the_contract(env: Sokoban) -> None:
    assert isinstance(env, TextEnv) and registry.make("sokoban") is registry.make("sokoban")
    assert (env.env_id, env.state_travel, env.task_count()) == ("sokoban", "token", 10_000)
    assert env.fingerprint().startswith("sokoban-") and env.fingerprint() == make().fingerprint()
    assert Sokoban(tasks=500).fingerprint() != env.fingerprint()  # another pool is other data
    assert AGENTGYM_ROUTES == () and registry.agentgym_routes("sokoban") == ()
    registration = registry.registration("sokoban")
    assert (registration.max_steps, registration.agentgym_routes, registration.placement) == (
        core.MAX_STEPS,
        (),
        "any",
    )
    assert registration.trainer == "agent_trainer.envs.sokoban:SPEC"


def test_gym_and_the_gym_sokoban_package_are_never_imported() -> None:
    """Only the generator's file is read: gym_sokoban/__init__.py imports gym and pkg_resources (gone from
    setuptools 81 on), and registers gym environments."""
    code = (
        "import sys\n"
        "from agent_envs.envs.sokoban import make\n"
        "env = make()\n"
        "t = env.reset(5)\n"
        "env.step(t.state, 'Up'); env.expert(5)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('gym', 'gym_sokoban', 'gymnasium', 'imageio')))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert run.stdout.strip() == "[]"


# ---- rooms ---------------------------------------------------------------------------------------------------------
def test_rooms_are_gym_sokobans_with_both_generators_seeded_by_the_task() -> None:
    """Task t's room is generate_room(dim=(6, 6), num_steps=20, num_boxes=1) after random.seed(t) and
    np.random.seed(t) (what RAGEN's reset(seed=t) does around its call), and generating one leaves the process's
    global generators as they were."""
    plain = plain_generator()
    random.seed(99)
    np.random.seed(99)
    before = (random.getstate(), np.random.get_state()[1].tobytes())
    rooms.room.cache_clear()
    ours = [rooms.room(task) for task in range(60)]
    assert (random.getstate(), np.random.get_state()[1].tobytes()) == before
    for task, room in enumerate(ours):
        assert room.seed == task
        random.seed(task)
        np.random.seed(task)
        fixed, state, _ = plain.generate_room(dim=(6, 6), num_steps=20, num_boxes=1)
        assert (rooms.generate(task)[0] == fixed).all() and (rooms.generate(task)[1] == state).all()
        symbols = {0: "#", 1: "_", 2: "O"}
        assert room.rows == tuple("".join(symbols[int(v)] for v in row) for row in fixed)
        assert room.player == tuple(int(v) for v in np.argwhere(state == 5)[0])
        assert room.boxes == tuple(tuple(int(v) for v in p) for p in np.argwhere(state == 4))
        assert not room.targets & set(room.boxes)  # every box starts off its target


def test_the_same_task_gives_the_same_room_in_threads_and_in_another_process(tmp_path: Path) -> None:
    """Rooms generated from 8 threads at once, while another thread draws from the global generators, equal those
    of one thread; and another interpreter (another hash seed) generates the same rooms."""
    rooms.room.cache_clear()
    want = rooms_digest(range(200))
    rooms.room.cache_clear()
    stop = False

    def noise() -> None:
        while not stop:
            random.random()
            np.random.randint(10)

    with ThreadPoolExecutor(max_workers=9) as pool:
        pool.submit(noise)
        got = list(pool.map(rooms.room, [t for t in range(200) for _ in range(2)][::-1]))
        stop = True
    assert {r.seed for r in got} == set(range(200))
    assert rooms_digest(range(200)) == want
    code = (
        "import hashlib\n"
        "from agent_envs.envs.sokoban import rooms\n"
        "print(hashlib.sha256(repr([rooms.room(t) for t in range(200)]).encode()).hexdigest())\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                         env={**os.environ, "PYTHONHASHSEED": "4242"})  # fmt: skip
    assert run.stdout.strip() == want


def test_a_refused_seed_is_retried_with_a_derived_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The generator raises for some seeds (too few floor cells, no displaced box): the next seed is a stable
    hash of the task and the try, so every process picks the same; a task it never gives a room is an error."""
    real = rooms.generate
    refused = {7, rooms.derived_seed(7, 1)}

    def flaky(seed: int) -> Any:
        if seed in refused:
            raise RuntimeWarning("Generated Model with score == 0")
        return real(seed)

    assert rooms.room(3248).seed == rooms.derived_seed(3248, 1)  # one of the 4 tasks of 10,000 it refuses
    with pytest.raises(RuntimeWarning, match="score == 0"):
        rooms.generate(3248)
    monkeypatch.setattr(rooms, "generate", flaky)
    rooms.room.cache_clear()
    try:
        assert rooms.room(7).seed == rooms.derived_seed(7, 2) == 2216886792
        monkeypatch.setattr(rooms, "generate", lambda seed: (_ for _ in ()).throw(RuntimeError("no spots")))
        with pytest.raises(rooms.NoRoom, match="task 8"):
            rooms.room(8)
    finally:
        rooms.room.cache_clear()


def test_ragens_rendering(env: Sokoban) -> None:
    assert env.reset(1002).observation == "######\n#_#O_#\n#____#\n#_#X_#\n###P_#\n######"
    last = play(env, 1002, ["Up", "Up"])[-1]
    assert last.observation == "######\n#_#√_#\n#__P_#\n#_#__#\n###__#\n######"
    standing = Room(("####", "#O_#", "####"), frozenset({(1, 1)}), (1, 1), (), 0)
    assert core.render(standing, (1, 1), []) == "####\n#S_#\n####"


# ---- rules and rewards ------------------------------------------------------------------------------------------
def test_a_push_onto_the_target_pays_10_9_and_ends_the_episode(env: Sokoban) -> None:
    first, pushed, solved = play(env, 1002, ["Up", "Up"])
    assert (first.reward, first.done, first.state) == (0.0, False, {"task": 1002, "player": [4, 3],
                                                                      "boxes": [[3, 3]], "steps": 0})  # fmt: skip
    assert (pushed.reward, pushed.done, pushed.info["pushed"], pushed.info["moved"]) == (
        -0.1,
        False,
        True,
        True,
    )
    assert pushed.state == {"task": 1002, "player": [3, 3], "boxes": [[2, 3]], "steps": 1}
    assert (solved.reward, solved.done, solved.info["success"], solved.info["boxes_on_target"]) == (
        10.9,
        True,
        True,
        1,
    )
    assert solved.info["score"] == 10.8 == round(pushed.reward + solved.reward, 6)
    with pytest.raises(EpisodeOver):
        env.step(solved.state, "Down")


def test_walls_and_unpushable_boxes_stop_the_player_and_still_cost_a_step(env: Sokoban) -> None:
    first = env.reset(1002)  # the player at (4, 3): a wall below, the box above
    bump = env.step(first.state, "Down")
    assert (bump.reward, bump.done, bump.info["moved"], bump.info["valid"]) == (-0.1, False, False, True)
    assert bump.state == {**first.state, "steps": 1} and bump.observation == first.observation
    left = env.step(bump.state, "Left")  # (4, 2) is a wall too
    assert left.state["player"] == [4, 3] and left.info["score"] == -0.2
    # a box against a wall does not move: (3, 3) pushed right into (3, 4) is fine, then (3, 5) is a wall
    walk = play(
        env, 1002, ["Right", "Up", "Left"]
    )  # to (3, 4): right of the box, then push it left into a wall
    assert walk[-1].state["boxes"] == [[3, 3]] and walk[-1].state["player"] == [3, 4]
    assert not walk[-1].info["pushed"] and walk[-1].reward == -0.1


def test_box_off_a_target_costs_one_and_two_boxes_do_not_move(monkeypatch: pytest.MonkeyPatch) -> None:
    """With two boxes (no generated room has them, but the rules are gym-sokoban's for any count): +1 for a box
    onto a target, -1 for one pushed off it, a box pushed into another does not move, +10 only once every box is
    on a target."""
    room = Room(
        rows=("#######", "#_O_O_#", "#_____#", "#_____#", "#######"),
        targets=frozenset({(1, 2), (1, 4)}),
        player=(3, 1),
        boxes=((2, 2), (2, 4)),
        seed=0,
    )
    monkeypatch.setattr(core, "room", lambda task: room)
    env = Sokoban()

    def step(player: list[int], boxes: list[list[int]], action: str) -> Transition:
        return env.step({"task": 0, "player": player, "boxes": boxes, "steps": 5}, action)

    onto = step([1, 2], [[1, 3], [2, 4]], "Right")  # (1, 3) -> (1, 4), a target; the other box is off
    assert (onto.reward, onto.info["boxes_on_target"], onto.done, onto.state["boxes"]) == (
        0.9, 1, False, [[1, 4], [2, 4]],
    )  # fmt: skip
    stuck = step([2, 2], [[2, 3], [2, 4]], "Right")  # a box into a box: nothing moves
    assert (stuck.state["player"], stuck.state["boxes"], stuck.reward, stuck.info["moved"]) == (
        [2, 2], [[2, 3], [2, 4]], -0.1, False,
    )  # fmt: skip
    off = step([1, 1], [[1, 2], [2, 4]], "Right")  # off the target (1, 2) onto the floor (1, 3)
    assert (off.reward, off.info["boxes_on_target"], off.info["score"]) == (-1.1, 0, -0.6)
    solved = step([3, 2], [[1, 4], [2, 2]], "Up")  # the second box onto (1, 2): every box on a target
    assert (solved.reward, solved.done, solved.info["success"], solved.info["score"]) == (
        10.9,
        True,
        True,
        11.4,
    )
    with pytest.raises(EpisodeOver, match="every box"):
        step([3, 2], [[1, 2], [1, 4]], "Down")


def test_an_unknown_action_is_a_no_op_step_and_words_are_case_insensitive(env: Sokoban) -> None:
    first = env.reset(1002)
    for word in ("jump", "", "move up", "<answer>Up</answer>"):
        noop = env.step(first.state, word)
        assert noop.observation == f"{core.INVALID}\n{first.observation}" and not noop.info["valid"]
        assert (noop.reward, noop.state["steps"], noop.state["player"]) == (-0.1, 1, [4, 3])
    assert env.step(first.state, "  uP \n").state == env.step(first.state, "Up").state


def test_the_episode_ends_after_100_steps_unsolved(env: Sokoban) -> None:
    state = env.reset(1002).state
    for n in range(1, 101):
        transition = env.step(state, "Down")  # into the wall below, every time
        state = transition.state
        assert transition.done == (n == 100)
    assert (
        transition.info["truncated"] and not transition.info["success"] and transition.info["score"] == -10.0
    )
    with pytest.raises(EpisodeOver, match="100 steps"):
        env.step(state, "Up")


def test_the_score_is_the_sum_of_the_step_rewards(env: Sokoban) -> None:
    rng = random.Random(5)
    ended = 0
    for task in range(0, 3000, 97):
        transition, total = env.reset(task), 0.0
        for _ in range(12):
            transition = env.step(transition.state, rng.choice(list(core.ACTIONS)))
            total += transition.reward
            assert transition.info["score"] == round(total, 6)
            if transition.done:
                ended += 1
                break
    assert ended  # some random walks solve their room (a third of the rooms take one push)


# ---- the expert ---------------------------------------------------------------------------------------------------
def test_the_expert_solves_every_task_it_is_asked(env: Sokoban) -> None:
    """Its plans solve the first 2,000 tasks (the bench plays all 10,000) in 1 to 13 steps."""
    lengths = []
    for task in range(2000):
        plan = env.expert(task)
        last = play(env, task, plan)[-1]
        assert last.done and last.info["success"], task
        assert last.info["score"] == round(11 - 0.1 * len(plan), 6)
        lengths.append(len(plan))
    assert min(lengths) >= 1 and max(lengths) <= 13


def test_the_expert_is_optimal(env: Sokoban) -> None:
    """No shorter action list solves the room: every list one step shorter is tried (plans of up to 6 steps)."""
    checked = 0
    for task in range(300):
        plan = env.expert(task)
        if len(plan) > 6:
            continue
        checked += 1
        for shorter in itertools.product(core.ACTIONS, repeat=len(plan) - 1):
            state = env.reset(task).state
            for action in shorter:
                transition = env.step(state, action)
                state = transition.state
                if transition.done:
                    break
            else:
                continue
            pytest.fail(f"task {task}: {list(shorter)} solves it, shorter than {plan}")
    assert checked > 250


# ---- the state and its token --------------------------------------------------------------------------------------
def test_state_is_small_json_and_never_mutated(env: Sokoban) -> None:
    state = env.reset(1002).state
    frozen = copy.deepcopy(state)
    for action in ("Up", "Right", "jump", "Down"):
        env.step(state, action)
    assert state == frozen and json.loads(json.dumps(state)) == state
    assert len(json.dumps(state, separators=(",", ":"))) <= 60


def test_a_fresh_process_steps_the_same_from_the_states(env: Sokoban, tmp_path: Path) -> None:
    """Another interpreter (another hash seed, no room generated yet) stepping from the states answers the same."""
    rng = random.Random(3)
    cases = []
    for task in (0, 17, 1002, 9999):
        transition = env.reset(task)
        for _ in range(10):
            if transition.done:
                break
            action = rng.choice([*core.ACTIONS, "nope"])
            cases.append((transition.state, action))
            transition = env.step(transition.state, action)
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    script = (
        "import json, sys\n"
        "from agent_envs.envs.sokoban import make\n"
        "env = make()\n"
        "out = []\n"
        "for state, action in json.load(open(sys.argv[1])):\n"
        "    t = env.step(state, action)\n"
        "    out.append([t.observation, t.reward, t.done, t.state, dict(t.info)])\n"
        "print(json.dumps([env.fingerprint(), out]))\n"
    )
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path / "cases.json")], capture_output=True,
                         text=True, check=True, timeout=120, env={**os.environ, "PYTHONHASHSEED": "12345"})  # fmt: skip
    fingerprint, got = json.loads(run.stdout)
    want = [
        [t.observation, t.reward, t.done, t.state, dict(t.info)] for t in (env.step(s, a) for s, a in cases)
    ]
    assert fingerprint == env.fingerprint() and got == json.loads(json.dumps(want))


def test_bad_input_is_a_clear_error(env: Sokoban) -> None:
    for task in (-1, 10_000, True, "3", 2.0, None):
        with pytest.raises(UnknownTask):
            env.reset(task)  # type: ignore[arg-type]
        with pytest.raises(UnknownTask):
            env.expert(task)  # type: ignore[arg-type]
    good = env.reset(1002).state
    bad_states = [
        None, [], "state", {}, {**good, "extra": 1}, {k: v for k, v in good.items() if k != "steps"},
        {**good, "task": 10_000}, {**good, "task": -1}, {**good, "task": True}, {**good, "task": "1002"},
        {**good, "steps": -1}, {**good, "steps": 101}, {**good, "steps": False}, {**good, "steps": 1.0},
        {**good, "player": [0, 0]}, {**good, "player": [4, 2]}, {**good, "player": [9, 9]}, {**good, "player": [-1, 3]},
        {**good, "player": [4]}, {**good, "player": [4.0, 3]}, {**good, "player": [True, 3]}, {**good, "player": "4,3"},
        {**good, "boxes": []}, {**good, "boxes": [[3, 3], [2, 3]]}, {**good, "boxes": [[0, 0]]},
        {**good, "boxes": [[4, 3]]}, {**good, "boxes": [3, 3]}, {**good, "boxes": "[[3, 3]]"},
    ]  # fmt: skip
    for state in bad_states:
        with pytest.raises(BadState):
            env.step(state, "Up")
    for action in (None, 3, ["Up"], "U" * (core.MAX_ACTION_CHARS + 1)):
        with pytest.raises(ActionRefused) as caught:
            env.step(good, action)  # type: ignore[arg-type]
        assert isinstance(caught.value, EnvError) and caught.value.status == 400
    assert env.step(good, "x" * core.MAX_ACTION_CHARS).info["valid"] is False  # at the limit: a no-op step


# ---- served by the real app -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def api() -> Any:
    from fastapi.testclient import TestClient

    from agent_envs.api.app import create_app
    from agent_envs.api.settings import Settings

    with TestClient(create_app(Settings(envs="sokoban", state_secret=SECRET, access_log=False))) as client:
        yield client


def test_served_episodes_follow_the_expert_through_signed_tokens(api: Any, env: Sokoban) -> None:
    info = api.get("/sokoban/v1/info").json()
    assert (info["tasks"], info["fingerprint"], info["state_travel"]) == (10_000, f"sokoban:{env.fingerprint()}",
                                                                           "token")  # fmt: skip
    for task in (0, 1002, 9999):
        plan = api.get(f"/sokoban/v1/tasks/{task}/expert").json()["actions"]
        assert plan == env.expert(task)
        answer = api.post("/sokoban/v1/reset", json={"task": task}).json()
        assert answer["observation"] == env.reset(task).observation and isinstance(answer["state"], str)
        for action in plan:
            answer = api.post("/sokoban/v1/step", json={"state": answer["state"], "action": action}).json()
        assert answer["done"] and answer["info"]["success"] and answer["reward"] == 10.9
        again = api.post("/sokoban/v1/step", json={"state": answer["state"], "action": "Up"})
        assert (again.status_code, again.json()["error"]) == (409, "episode_finished")


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "kind"),
    [
        ("POST", "/v1/reset", {"task": 10_000}, 404, "unknown_task"),
        ("POST", "/v1/reset", {"task": -1}, 422, "validation_error"),
        ("GET", "/v1/tasks/10000/expert", None, 404, "unknown_task"),
        ("POST", "/v1/step", {"state": "hello", "action": "Up"}, 400, "invalid_token"),
        ("POST", "/v1/step", {"action": "Up"}, 422, "validation_error"),
        ("POST", "/create", {}, 404, "not_found"),  # no AgentGym server for Sokoban, so none of its routes
        ("POST", "/step", {"id": 0, "action": "Up"}, 404, "not_found"),
    ],
)
def test_served_bad_input_gets_a_clear_4xx(api: Any, method: str, path: str, body: Any, status: int,
                                          kind: str) -> None:  # fmt: skip
    response = api.request(method, f"/sokoban{path}", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"] == kind


def test_served_overlong_action_and_tampered_token(api: Any) -> None:
    state = api.post("/sokoban/v1/reset", json={"task": 3}).json()["state"]
    at_cap = api.post("/sokoban/v1/step", json={"state": state, "action": "x" * 2048})  # the routes' cap
    assert (
        at_cap.status_code == 200 and at_cap.json()["info"]["valid"] is False
    )  # a no-op step, not a refusal
    long = api.post("/sokoban/v1/step", json={"state": state, "action": "x" * 2049})
    assert (long.status_code, long.json()["error"]) == (422, "validation_error")
    tampered = state[:-4] + ("AAAA" if not state.endswith("AAAA") else "BBBB")
    bad = api.post("/sokoban/v1/step", json={"state": tampered, "action": "Up"})
    assert (bad.status_code, bad.json()["error"]) == (400, "invalid_token")
