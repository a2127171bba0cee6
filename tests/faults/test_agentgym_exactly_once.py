"""AgentGym's own clients lose nothing when a replica dies under them, and never see a step applied twice.

AgentGym's clients (``tests/_agentgym_envs.py``: TextCraft's, BabyAI's and SciWorld's, request for request; and
WebShop's, ``tests/_agentgym.py``) send no idempotency key, never retry, and ``assert`` HTTP 200. They play
AgentGym's recorded episodes through the balancer, many at once, each client reused for episode after episode
as AgentGym's ``BaseTask`` reuses its clients, while one replica's whole process group is SIGKILLed mid-run:

- every episode answers, step by step, what AgentGym's own server answered in the recording (WebShop: what the
  native protocol answers): nothing lost, nothing applied twice (a ``get`` or a ``move forward`` applied twice
  would change every later observation);
- the kill did hit requests in flight (the balancer's error log says so), and the balancer re-sent them to the
  other replica, which answered them once (``configs/nginx/balancer.conf.template``, ``api/compat_sessions.py``).

Without the balancer (one replica, the client pointed at it): the request in flight fails with a connection
error, which AgentGym's client raises; a replica started again serves the session on (it is in Redis).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from _agentgym import AgentGymClient
from _agentgym_envs import CLIENTS, AgentGymEnvClient, last_action_line
from _faults import SECRET, figure, native_trace, signal_replica, start

from agent_envs import cluster
from agent_envs.envs.agentgym import remap_id

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "conformance"
SCORE = {"textcraft": "reward", "babyai": "score", "sciworld": "score"}  # what the client hands on as reward
THREADS = 8  # clients per environment at once


def recorded(
    env_id: str, policies: tuple[str, ...] = ("solver", "random"), most_steps: int = 100
) -> list[dict[str, Any]]:
    """Recorded episodes the client can replay as they were, up to their end (the first ``done``): every answer an
    observation (no error), every action within the request cap and one the client's own action filter leaves
    as it is."""
    episodes = []
    for line in (FIXTURES / f"agentgym-{env_id}" / "traces.jsonl").read_text().splitlines():
        episode = json.loads(line)
        steps = []
        for step in episode["steps"]:
            steps.append(step)
            if isinstance(step["response"], dict) and step["response"].get("done"):
                break
        answers = [episode["reset"]["response"], *(step["response"] for step in steps)]
        if (
            episode.get("policy") in policies
            and 0 < len(steps) <= most_steps
            and all(isinstance(a, dict) and "error" not in a and a.get("observation") for a in answers)
            and all(len(s["action"]) <= 2048 for s in steps)
            and (
                env_id == "sciworld"
                or all(last_action_line(f"Action: {s['action']}") == s["action"] for s in steps)
            )  # fmt: skip
        ):
            episodes.append({**episode, "steps": steps})
    return episodes


def play(
    client: AgentGymEnvClient, env_id: str, episode: dict[str, Any], on_step: Callable[[], None]
) -> list[str]:
    """One recorded episode on ``client``; the differences from the recording (none: it replayed exactly)."""
    differences = []
    rid = episode["create"]["response"]["id"]
    first = client.reset(episode["reset"]["body"]["data_idx"])
    if first != remap_id(episode["reset"]["response"], rid, client.env_id):
        differences.append(f"reset {episode['data_idx']}: {str(first)[:200]}")
    for number, step in enumerate(episode["steps"]):
        got = client.step(f"Thought:\nreplaying\n\nAction:\n{step['action']}")
        on_step()
        want = remap_id(step["response"], rid, client.env_id)
        if tuple(got) != (want["observation"], want[SCORE[env_id]], want["done"]):
            differences.append(f"{env_id} {episode['data_idx']} step {number}: got {str(tuple(got))[:200]}")
    return differences


def run_clients(
    url: str, episodes: dict[str, list[dict[str, Any]]], kill: Callable[[], bool | None], kill_after: int,
    extra: Callable[[Callable[[], None]], tuple[int, list[str]]] | None = None, threads: int = THREADS,
) -> tuple[dict[str, int], list[str], list[str]]:  # fmt: skip
    """``threads`` AgentGym clients per environment, each playing its share of the episodes back to back;
    ``kill()`` once ``kill_after`` steps are done, and after every step from then on while it answers ``False``
    (not yet: what it waits for has not come). (episodes played per env, differences, lost: the exceptions)."""
    steps, killed, lock = 0, threading.Event(), threading.Lock()

    def on_step() -> None:
        nonlocal steps
        with lock:
            steps += 1
            due = steps >= kill_after and not killed.is_set()
            if due:
                killed.set()
        if due and kill() is False:
            killed.clear()  # the next step tries again

    def worker(env_id: str, share: list[dict[str, Any]]) -> tuple[int, list[str]]:
        client = CLIENTS[env_id](f"{url}/{env_id}", data_len=len(share), timeout=60)
        differences = [d for episode in share for d in play(client, env_id, episode, on_step)]
        assert client.close() is True
        return len(share), differences

    played = dict.fromkeys(episodes, 0)
    differences, lost = [], []
    with ThreadPoolExecutor(threads * len(episodes) + 4) as pool:
        futures = {
            pool.submit(worker, env_id, share[index::threads]): env_id
            for env_id, share in episodes.items()
            for index in range(threads)
        }
        if extra is not None:
            futures[pool.submit(extra, on_step)] = "webshop"
        for future, env_id in futures.items():
            try:
                count, found = future.result()
            except Exception as error:  # AssertionError (a status that is not 200), a connection error...
                lost.append(f"{env_id}: {type(error).__name__}: {error}"[:300])
            else:
                played[env_id] = played.get(env_id, 0) + count
                differences += found
    assert killed.is_set(), "the kill never came: too few steps"
    return played, differences, lost


@pytest.fixture(scope="module")
def kill_cluster(conformance_catalog_dir, tmp_path_factory):
    record = start(
        conformance_catalog_dir, tmp_path_factory.mktemp("exactly-once"), workers=1,
        env={"AGENTRL_ENVS": "webshop,textcraft,babyai"},
    )  # fmt: skip
    try:
        yield record
    finally:
        cluster.down(record["run_dir"], quiet=True)


def in_flight_failures(record: dict[str, Any]) -> list[str]:
    """The balancer's error-log lines of AgentGym requests whose replica died mid-request (not a refused
    connect: the replica had the request)."""
    text = Path(record["nginx"]["log"]).read_text(errors="replace")
    reasons = ("prematurely closed", "reset by peer", "Connection reset")
    return [
        line for line in text.splitlines()
        if any(r in line for r in reasons) and any(f'"POST /{e}' in line for e in ("textcraft/", "babyai/", "step"))
    ]  # fmt: skip


def test_a_replica_killed_mid_run_loses_no_agentgym_episode(kill_cluster, expert_plans) -> None:
    url = kill_cluster["url"]
    episodes = {"textcraft": recorded("textcraft"), "babyai": recorded("babyai")}
    goals = list(expert_plans)[:8]
    native = {goal: native_trace(url, goal, expert_plans[goal]) for goal in goals}
    total = sum(len(e["steps"]) for share in episodes.values() for e in share)

    def webshop(on_step: Callable[[], None]) -> tuple[int, list[str]]:
        """WebShop's AgentGym client (``tests/_agentgym.py``, no retry budget: AgentGym's own behaviour)."""
        client, differences = AgentGymClient(url, timeout=60), []
        for goal in goals:
            trace = [(client.reset(goal)[0], 0.0, False)]
            for action in expert_plans[goal]:
                trace.append(client.step(action))
                on_step()
            if trace != native[goal]:
                differences.append(f"webshop goal {goal}: {trace[-1]}")
        assert client.close() == {"closed": True}
        return len(goals), differences

    started = time.monotonic()
    played, differences, lost = run_clients(
        url, episodes, lambda: signal_replica(kill_cluster, 0, signal.SIGKILL), total // 3, webshop
    )
    seconds = time.monotonic() - started
    hit = in_flight_failures(kill_cluster)
    figure(
        f"AgentGym's clients, {THREADS} per environment, replica SIGKILLed (process group) a third of the way "
        f"through {total} recorded steps: {played} episodes played, {len(lost)} clients lost, "
        f"{len(differences)} answers unlike the recording; {len(hit)} requests were in flight on the killed "
        f"replica ({seconds:.0f} s)"
    )
    assert not lost, lost
    assert not differences, differences[:5]
    assert hit, "no request was in flight on the killed replica: the test did not test the re-send"
    assert played == {**{env_id: len(share) for env_id, share in episodes.items()}, "webshop": len(goals)}


def test_without_a_balancer_the_request_in_flight_fails_and_the_session_lives_on(
    conformance_catalog_dir, tmp_path
) -> None:
    """One replica, no balancer between it and AgentGym's client: SIGKILL mid-run. The request in flight (or
    the next one) gets no HTTP answer at all: ``requests`` raises ``ConnectionError`` from AgentGym's client (its
    episode loop ends there). The session is in Redis, so a replica started again on the same port serves it on,
    from the state of the last answered step."""
    record = start(conformance_catalog_dir, tmp_path / "run", replicas=1, workers=1,
                   env={"AGENTRL_ENVS": "textcraft"})  # fmt: skip
    replica = record["replicas"][0]
    try:
        client = CLIENTS["textcraft"](f"{replica['url']}/textcraft", timeout=30)
        client.reset(7)
        client.step("Action: get 1 oak logs")  # the kill comes mid-run, after an answered step on any machine
        answered, failure = 1, None
        killer = threading.Timer(0.5, lambda: os.killpg(replica["pgid"], signal.SIGKILL))
        killer.start()
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:
                client.step("Action: get 1 oak logs")
                answered += 1
        except requests.ConnectionError as error:
            failure = error
        killer.join()
        assert failure is not None and answered > 0
        again = _serve_again(replica, record["sessions"], tmp_path / "again.log")
        try:
            inventory = client.step("Action: inventory")
        finally:
            again.terminate()
            again.wait(30)
        figure(
            f"No balancer, one replica SIGKILLed under AgentGym's TextCraft client: the request in flight raised "
            f"requests.ConnectionError after {answered} answered steps; a replica started again served the "
            f"session on: {inventory.state!r}"
        )
        # every answered "get" was applied exactly once; the one in flight at the kill may or may not have been
        assert inventory.state in (
            f"Inventory: [oak logs] ({answered}) ",
            f"Inventory: [oak logs] ({answered + 1}) ",
        ), inventory
    finally:
        cluster.down(record["run_dir"], quiet=True)


def _serve_again(replica: dict[str, Any], redis_url: str, log: Path) -> subprocess.Popen:
    """``agent-envs serve`` on the dead replica's port, with the cluster's session store."""
    env = {**os.environ, "AGENTRL_STATE_SECRET": SECRET, "AGENTRL_REDIS_URL": redis_url,
           "AGENTRL_ENVS": "textcraft", "AGENTRL_WATCHDOG_INTERVAL_S": "0"}  # fmt: skip
    command = [sys.executable, "-m", "agent_envs.cli", "serve", "--host", "127.0.0.1", "--port",
               str(replica["port"]), "--workers", "1"]  # fmt: skip
    with open(log, "ab") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    deadline = time.monotonic() + 60
    while cluster.http_status(replica["url"] + "/readyz") != 200:
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.1)
    return process


@pytest.mark.parametrize("clients", [4])
def test_a_sciworld_replica_killed_mid_run_loses_no_agentgym_episode(
    conformance_catalog_dir, tmp_path, clients: int
) -> None:
    """SciWorld's AgentGym client, from this one host, ``clients`` at once on recorded gold episodes, with two
    SciWorld replicas: when the replica holding the most episodes between two steps has its process group (uvicorn and its
    JVMs) SIGKILLed, the other replays them on fresh JVMs and every answer is still the recording's."""
    record = start(conformance_catalog_dir, tmp_path / "run", workers=1,
                   env={"AGENTRL_ENVS": "sciworld", "SCIWORLD_SPARE_JVMS": "1"})  # fmt: skip
    try:
        episodes = recorded("sciworld", ("gold",), most_steps=15)[: 2 * clients]
        total = sum(len(e["steps"]) for e in episodes)
        held: dict[str, int] = {}  # per replica, at the kill: JVMs holding an episode (idle or busy)
        waiting: dict[str, int] = {}  # of which idle: an episode between two steps
        killed: list[dict[str, Any]] = []

        def kill() -> bool:
            """Kill the replica holding the most episodes between two steps (an idle JVM: its next step must
            replay), not yet when none does: a busy JVM may be a reset, which the other replica would just redo
            (on a loaded machine slow JVM starts can keep every session of one replica in its first reset)."""
            for replica in record["replicas"]:  # where the episodes live right now
                stats = requests.get(replica["url"] + "/sciworld/v1/info", timeout=30).json()["simulators"]
                held[replica["name"]] = stats["idle"] + stats["busy"]
                waiting[replica["name"]] = stats["idle"]
            victim = max(range(len(record["replicas"])), key=lambda i: waiting[record["replicas"][i]["name"]])
            if not waiting[record["replicas"][victim]["name"]]:
                return False
            killed.append(record["replicas"][victim])
            signal_replica(record, victim, signal.SIGKILL)
            return True

        played, differences, lost = run_clients(
            record["url"], {"sciworld": episodes}, kill, total // 3, threads=clients
        )
        (survivor,) = (r for r in record["replicas"] if r is not killed[0])
        survivor = requests.get(survivor["url"] + "/sciworld/v1/info", timeout=30).json()
        figure(
            f"SciWorld, AgentGym's client x{clients} from one host, 2 replicas: episodes held per replica when one "
            f"was SIGKILLed {held} (between two steps: {waiting}); {played['sciworld']} recorded gold episodes "
            f"({total} steps) played, "
            f"{len(lost)} clients lost, {len(differences)} answers unlike the recording; the survivor replayed "
            f"{survivor['simulators'].get('replays', 0)} episodes"
        )
        assert not lost, lost
        assert not differences, differences[:5]
        # the victim held episodes, which the survivor replayed (that one host's sessions spread over both
        # replicas is test_agentgym_routing's, with enough sessions for chance not to put them all on one)
        assert held[killed[0]["name"]] > 0 and survivor["simulators"].get("replays", 0) > 0, (held, survivor)
    finally:
        cluster.down(record["run_dir"], quiet=True)
