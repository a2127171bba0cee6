"""OpenEnv's own client (``openenv`` 0.10.0 from PyPI, unmodified, in .venv-trl) plays every served environment
through the balancer (real nginx, replicas with workers, Redis), over its WebSocket sessions and HTTP routes:

- every environment, each episode step for step what the environment's core gives in process, anonymous sessions
  (``/<env>/openenv``) and named ones (``.../sessions/<name>``, found by ``AutoEnv.from_env``);
- the HTTP answers validated by OpenEnv's own pydantic models;
- sessions at once, every environment mixed;
- errors in OpenEnv's shapes (the client's ``RuntimeError("Server error: ... (code: ...)")``, raw frames);
- a replica SIGKILLed under sessions with steps in flight: named sessions lose nothing, each step applied once
  (re-sent with its ``request_id`` after the connection error); anonymous sessions on the dead replica are gone and
  say so (OpenEnv's session-per-connection), the others finish; a SciWorld replica killed under named sessions: the
  other replica replays their episodes.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import requests
from _openenv import (
    FLEET_ENVS,
    SECRET,
    DriverError,
    OpenEnvDriver,
    core_trace,
    openenv_trace,
    play,
    start_fleet,
)

from agent_envs import cluster
from agent_envs.api.settings import Settings
from agent_envs.envs import registry

pytestmark = pytest.mark.slow

ENVS = FLEET_ENVS.split(",")
MAX_ACTIONS = 40  # an episode played here ends at the expert's end or after this many actions
TASKS = (0, 1)  # each environment's tasks played by each kind of session


@pytest.fixture(scope="module")
def cores(generated_catalog_dir: Path) -> Iterator[dict[str, Any]]:
    """Every environment's core in this process: the reference each episode through the balancer must equal."""
    settings = Settings(catalog=generated_catalog_dir, envs=FLEET_ENVS, state_secret=SECRET, access_log=False)
    made = {env_id: registry.make(env_id, settings) for env_id in ENVS}
    yield made
    for core in made.values():
        registry.shut_down(core)  # and forgotten: a later test's make() gets a core that runs


@pytest.fixture(scope="module")
def plans(cores: dict[str, Any]) -> dict[str, dict[int, list[str]]]:
    """The expert's actions (at most MAX_ACTIONS) for each environment's TASKS."""
    return {env_id: {task: list(core.expert(task) or ["look"])[:MAX_ACTIONS] for task in TASKS}
            for env_id, core in cores.items()}  # fmt: skip


@pytest.mark.parametrize("env_id", ENVS)
def test_openenv_client_plays_every_environment_through_the_balancer(
    fleet: dict, driver: OpenEnvDriver, cores: dict[str, Any], plans: dict, env_id: str
) -> None:
    base = f"{fleet['url']}/{env_id}/openenv"
    session = f"{base}/sessions/{uuid.uuid4().hex}"
    assert driver.call("open", client="anonymous", base_url=base) == "GenericEnvClient"
    assert driver.call("open", client="named", base_url=session, auto=True, name=env_id) == "GenericEnvClient"
    for task, actions in plans[env_id].items():
        expected = core_trace(cores[env_id], task, actions)
        for client in ("anonymous", "named"):
            answers = play(driver, client, task, actions)
            assert openenv_trace(answers) == expected, (env_id, task, client)
            assert answers[-1]["metadata"]["task"] == task
            state = driver.call("state", client=client)
            assert (state["step_count"], state["task"], state["done"], state["env"]) == (
                len(answers) - 1, task, expected[-1][2], env_id
            )  # fmt: skip
            assert state["session"] == (session.rsplit("/", 1)[1] if client == "named" else None)
    for client in ("anonymous", "named"):
        driver.call("close", client=client)
    # a closed named session is gone from the store: its state is empty again
    assert requests.get(f"{session}/state", timeout=30).json()["step_count"] == 0

    # the HTTP routes, in OpenEnv's own models' shapes; a stateless step continues from the observation's state
    first = requests.post(f"{base}/reset", json={"task": TASKS[0]}, timeout=60).json()
    driver.call("validate", model="ResetResponse", value=first)
    body = {"action": {"action": plans[env_id][TASKS[0]][0], "state": first["observation"]["state"]}}
    second = requests.post(f"{base}/step", json=body, timeout=60).json()
    driver.call("validate", model="StepResponse", value=second)
    assert openenv_trace([first, second]) == core_trace(cores[env_id], TASKS[0], plans[env_id][TASKS[0]][:1])
    for route, model in (("state", "State"), ("metadata", "EnvironmentMetadata"), ("schema", "SchemaResponse"),
                         ("health", "HealthResponse")):  # fmt: skip
        driver.call("validate", model=model, value=requests.get(f"{base}/{route}", timeout=30).json())
    # a named session over HTTP: reset, step, state on the session the WebSocket would see
    requests.post(f"{session}/reset", json={"task": TASKS[1]}, timeout=60).raise_for_status()
    step = requests.post(
        f"{session}/step", json={"action": {"action": plans[env_id][TASKS[1]][0]}}, timeout=60
    )
    assert step.status_code == 200, step.text
    assert requests.get(f"{session}/state", timeout=30).json()["step_count"] == 1


def test_sessions_at_once_every_environment_mixed(
    fleet: dict, driver: OpenEnvDriver, cores: dict[str, Any], plans: dict
) -> None:
    specs = []
    for number in range(24):
        env_id, task = ENVS[number % len(ENVS)], TASKS[number // len(ENVS) % len(TASKS)]
        base = f"{fleet['url']}/{env_id}/openenv" + (f"/sessions/{uuid.uuid4().hex}" if number % 2 else "")
        specs.append({"base_url": base, "task": task, "actions": plans[env_id][task], "env": env_id})
    driver.call("episodes", specs=specs)
    results = driver.call("results", timeout=600)
    for spec, result in zip(specs, results, strict=True):
        assert result["error"] is None, (spec, result["error"])
        assert openenv_trace(result["trace"]) == core_trace(cores[spec["env"]], spec["task"], spec["actions"])


def _server_error(call: Any) -> DriverError:
    with pytest.raises(DriverError) as caught:
        call()
    assert caught.value.kind == "RuntimeError", caught.value
    return caught.value


def test_errors_come_in_openenv_shapes(fleet: dict, driver: OpenEnvDriver, plans: dict) -> None:
    base = f"{fleet['url']}/textcraft/openenv"
    driver.call("open", client="errors", base_url=base)
    cases = {
        "step before reset": (lambda: driver.call("step", client="errors", action={"action": "inventory"}),
                              "no_episode", "EXECUTION_ERROR"),
        "unknown task": (lambda: driver.call("reset", client="errors", kwargs={"task": 10**9}),
                         "unknown_task", "EXECUTION_ERROR"),
        "unknown reset field": (lambda: driver.call("reset", client="errors", kwargs={"level": 3}),
                                "Invalid message", "VALIDATION_ERROR"),
        "action not a string": (lambda: driver.call("step", client="errors", action={"action": 7}),
                                "Invalid message", "VALIDATION_ERROR"),
        "action too long": (lambda: driver.call("step", client="errors", action={"action": "x" * 2049}),
                            "Invalid message", "VALIDATION_ERROR"),
    }  # fmt: skip
    for name, (call, text, code) in cases.items():
        error = _server_error(call)
        assert error.message.startswith("Server error: ") and f"(code: {code})" in error.message, (
            name,
            error,
        )
        assert text in error.message, (name, error)
    driver.call("close", client="errors")
    # an episode played to its end (a WebShop purchase: its core refuses a step after it), then one more step
    driver.call("open", client="finished", base_url=f"{fleet['url']}/webshop/openenv")
    assert play(driver, "finished", TASKS[0], plans["webshop"][TASKS[0]])[-1]["done"]
    error = _server_error(
        lambda: driver.call("step", client="finished", action={"action": "click[back to search]"})
    )
    assert "episode_finished" in error.message and "(code: EXECUTION_ERROR)" in error.message
    driver.call("close", client="finished")
    # frames OpenEnv's client never sends, over the websockets library: the server's error frames
    answers = driver.call("raw", url=base.replace("http://", "ws://") + "/ws",
                          frames=["not json", json.dumps({"type": "dance"}), json.dumps([1, 2]),
                                  json.dumps({"type": "state", "extra": 1})])  # fmt: skip
    assert [(a["type"], a["data"]["code"]) for a in answers] == [
        ("error", "INVALID_JSON"), ("error", "UNKNOWN_TYPE"), ("error", "INVALID_JSON"), ("error", "VALIDATION_ERROR")
    ]  # fmt: skip
    # HTTP: the service's JSON errors
    bad = requests.post(f"{base}/reset", json={"task": "three"}, timeout=30)
    assert (bad.status_code, bad.json()["error"]) == (422, "validation_error")
    bad = requests.post(f"{base}/sessions/{'x' * 65}/reset", json={}, timeout=30)
    assert bad.status_code in (404, 422), bad.text  # the balancer routes no such name; a replica refuses it
    bad = requests.post(f"{base}/step", json={"action": {"action": "inventory"}}, timeout=30)
    assert (bad.status_code, bad.json()["error"]) == (422, "validation_error")


# ---- a replica dies -----------------------------------------------------------------------------------------------
def _victim_sessions(run_dir: Path, victim: dict, specs: Sequence[dict]) -> list[int]:
    """The specs whose session's first WebSocket went to the victim replica (the balancer's access log, which has a
    WebSocket's line once it is closed: read it after the episodes)."""
    port = f":{victim['port']}"
    lines = (run_dir / "logs" / "nginx-access.log").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    first: dict[str, str] = {}
    for record in records:
        uri = record["uri"]
        if uri.endswith("/ws") and "/sessions/" in uri:
            first.setdefault(uri.rsplit("/", 2)[1], record["upstream_addr"])
    return [i for i, spec in enumerate(specs)
            if first.get(spec["base_url"].rsplit("/", 1)[1], "").endswith(port)]  # fmt: skip


@pytest.fixture
def small_fleet(generated_catalog_dir: Path, tmp_path: Path) -> Iterator[tuple[dict, Path]]:
    run_dir = tmp_path / "run"
    record = start_fleet(generated_catalog_dir, run_dir, "textcraft,babyai")
    try:
        yield record, run_dir
    finally:
        cluster.down(run_dir, quiet=True)


def _live_episodes(replica_url: str) -> int:
    """The SciWorld episodes whose JVMs a replica holds (idle between steps, or busy)."""
    simulators = requests.get(f"{replica_url}/sciworld/v1/info", timeout=30).json()["simulators"]
    return int(simulators["idle"]) + int(simulators["busy"])


def _kill_mid_run(
    driver: OpenEnvDriver, record: dict, victim_index: int, specs: list[dict], retry: bool
) -> list[dict[str, Any]]:
    """Play ``specs`` at once, pause them half-way, freeze the victim replica's process group (SIGSTOP), resume them
    (the victim's sessions send a step and wait for its answer) and SIGKILL it while those steps are in flight; their
    results."""
    paused = driver.call("episodes", specs=specs, pause=2, think_s=0.2, retry=retry)
    assert paused == len(specs)
    results_call: dict[str, Any] = {}
    import threading

    waiter = threading.Thread(target=lambda: results_call.update(out=driver.call("results", timeout=600)))
    replica = record["replicas"][victim_index]
    group = replica.get("pgid", replica["pid"])
    os.killpg(group, signal.SIGSTOP)  # frozen: the steps sent to it from now on wait there, in flight
    waiter.start()  # resumes every episode
    time.sleep(1.0)  # each victim's session has sent its next step (think_s later) and waits for the answer
    os.killpg(group, signal.SIGKILL)
    waiter.join()
    return results_call["out"]


def _long_tasks(core: Any, count: int, at_least: int = 5) -> list[tuple[int, list[str]]]:
    """The first ``count`` tasks whose expert takes at least ``at_least`` actions (an episode still running when
    the replica dies), with those actions."""
    found = []
    for task in range(core.task_count()):
        actions = list(core.expert(task) or [])
        if len(actions) >= at_least:
            found.append((task, actions[:MAX_ACTIONS]))
            if len(found) == count:
                return found
    raise AssertionError("not enough long expert episodes")


def _kill_specs(url: str, cores: dict[str, Any], named: bool, count: int = 16) -> list[dict]:
    specs = []
    for env_id in ("textcraft", "babyai"):
        for task, actions in _long_tasks(cores[env_id], count // 2):
            base = f"{url}/{env_id}/openenv" + (f"/sessions/kill-{uuid.uuid4().hex}" if named else "")
            specs.append({"base_url": base, "task": task, "actions": actions, "env": env_id})
    return specs


def test_a_killed_replica_loses_no_named_session(
    small_fleet: tuple[dict, Path], driver: OpenEnvDriver, cores: dict[str, Any]
) -> None:
    record, run_dir = small_fleet
    specs = _kill_specs(record["url"], cores, named=True)
    results = _kill_mid_run(driver, record, 0, specs, retry=True)
    on_victim = _victim_sessions(run_dir, record["replicas"][0], specs)
    assert on_victim, "no session had its WebSocket on the killed replica: the test proves nothing"
    for spec, result in zip(specs, results, strict=True):
        assert result["error"] is None, (spec, result)
        assert openenv_trace(result["trace"]) == core_trace(cores[spec["env"]], spec["task"], spec["actions"])
        # each step applied once: the session counts as many steps as the episode had
        assert result["state"]["step_count"] == len(result["trace"]) - 1
    broken = sum(bool(results[i]["connection_errors"]) for i in on_victim)
    print(f"named sessions: {len(on_victim)} of {len(specs)} on the killed replica, {broken} of them with a "
          f"message in flight (re-sent with its request_id), 0 lost")  # fmt: skip


def test_a_killed_replica_ends_its_anonymous_sessions_and_says_so(
    small_fleet: tuple[dict, Path], driver: OpenEnvDriver, cores: dict[str, Any]
) -> None:
    """OpenEnv's own semantics: a session per connection. The episodes of the dead replica's connections are gone
    (the client reconnects to a new, empty session and is told to reset); every other one finishes."""
    record, run_dir = small_fleet
    specs = _kill_specs(record["url"], cores, named=False)
    results = _kill_mid_run(driver, record, 0, specs, retry=False)
    lost = [r for r in results if r["error"] is not None]
    for spec, result in zip(specs, results, strict=True):
        if result["error"] is None:
            assert openenv_trace(result["trace"]) == core_trace(
                cores[spec["env"]], spec["task"], spec["actions"]
            )
        else:
            assert "no_episode" in result["error"] or "ConnectionClosed" in result["error"], result
    assert 0 < len(lost) < len(specs), [r["error"] for r in results]
    print(
        f"anonymous sessions: {len(lost)} of {len(specs)} ended with the killed replica, each with its reason"
    )


def test_a_killed_sciworld_replica_is_replayed_for_its_named_sessions(
    generated_catalog_dir: Path, tmp_path: Path, driver: OpenEnvDriver, cores: dict[str, Any], plans: dict
) -> None:
    run_dir = tmp_path / "run"
    record = start_fleet(generated_catalog_dir, run_dir, "sciworld")
    try:
        specs = [{"base_url": f"{record['url']}/sciworld/openenv/sessions/sw-{uuid.uuid4().hex}", "task": task,
                  "actions": plans["sciworld"][task], "env": "sciworld"} for task in TASKS for _ in range(3)]  # fmt: skip
        paused = driver.call("episodes", specs=specs, pause=2, think_s=0.0, retry=True)
        assert paused == len(specs)
        counts = [_live_episodes(replica["url"]) for replica in record["replicas"]]
        victim = counts.index(max(counts))
        replica = record["replicas"][victim]
        os.killpg(replica.get("pgid", replica["pid"]), signal.SIGKILL)
        results = driver.call("results", timeout=900)
        for spec, result in zip(specs, results, strict=True):
            assert result["error"] is None, (spec, result)
            assert openenv_trace(result["trace"]) == core_trace(
                cores["sciworld"], spec["task"], spec["actions"]
            )
        print(
            f"SciWorld named sessions: {counts[victim]} of {len(specs)} on the killed replica, replayed, 0 lost"
        )
    finally:
        cluster.down(run_dir, quiet=True)
