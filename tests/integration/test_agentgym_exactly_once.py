"""Exactly once on the AgentGym routes, request by request, against real replicas (``api/compat_sessions.py``).

When a replica dies after it stored a request's change but before its answer left, nginx re-sends the request
to another replica with the same ``X-Request-Id`` (its ``$request_id``). These tests send exactly that: every
state-changing request twice with one ``X-Request-Id``, first to one replica and then to the other (or to both
at once), as the balancer would after the first one died, and check that

- the second answer is the first one, byte for byte;
- the episode is the one a single copy of each request makes (TextCraft and BabyAI: what AgentGym's server
  answered in its recordings; WebShop: the native protocol's trace), so nothing was applied twice;
- a retried ``/create`` makes no second session, a retried ``/close`` answers ``true`` again;
- a different request under a used id is a new request (the key is bound to the request's content).

With Redis (2 replicas) and with the single-process memory store (one replica, one worker).
"""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from _support import Replica, start_cluster

from agent_envs.envs.agentgym import remap_id

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "conformance"
ENVS = "webshop,textcraft,babyai"


@pytest.fixture(scope="module")
def redis_cluster(local_cluster, conformance_catalog_dir: Path, tmp_path_factory) -> Any:
    run_dir = tmp_path_factory.mktemp("exactly-once")
    record = start_cluster(local_cluster, conformance_catalog_dir, run_dir, env={"AGENTRL_ENVS": ENVS})
    try:
        yield [replica["url"] for replica in record["replicas"]]
    finally:
        local_cluster.down(run_dir, quiet=True)


@pytest.fixture(scope="module")
def memory_replica(conformance_catalog_dir: Path, tmp_path_factory) -> Any:
    log = tmp_path_factory.mktemp("exactly-once-memory") / "replica.log"
    server = Replica(conformance_catalog_dir, log, env={"AGENTRL_ENVS": ENVS, "AGENTRL_REDIS_URL": ""})
    try:
        yield [server.url, server.url]
    finally:
        server.stop()


@pytest.fixture(params=["redis", "memory"])
def replicas(request: pytest.FixtureRequest) -> list[str]:
    return request.getfixturevalue(
        f"{request.param}_cluster" if request.param == "redis" else "memory_replica"
    )


def twice(urls: list[str], path: str, body: dict[str, Any], at_once: bool = False) -> requests.Response:
    """``body`` posted to ``path`` on both replicas under one X-Request-Id (one after the other, or at once);
    asserts the two answers are one; returns the first."""
    headers = {"X-Request-Id": uuid.uuid4().hex}
    if at_once:
        with ThreadPoolExecutor(2) as pool:
            first, second = pool.map(
                lambda url: requests.post(url + path, json=body, headers=headers, timeout=30), urls
            )
    else:
        first, second = (requests.post(url + path, json=body, headers=headers, timeout=30) for url in urls)
    assert (first.status_code, first.content) == (second.status_code, second.content), (
        first.text,
        second.text,
    )
    return first


def recorded(env_id: str, count: int) -> list[dict[str, Any]]:
    """The first ``count`` recorded solver episodes of AgentGym's server whose actions fit the 2,048 cap."""
    episodes = []
    for line in (FIXTURES / f"agentgym-{env_id}" / "traces.jsonl").read_text().splitlines():
        episode = json.loads(line)
        if episode["policy"] == "solver" and all(len(s["action"]) <= 2048 for s in episode["steps"]):
            episodes.append(episode)
    return episodes[:count]


@pytest.mark.parametrize("env_id", ["textcraft", "babyai"])
@pytest.mark.parametrize("at_once", [False, True], ids=["one-after-the-other", "at-once"])
def test_every_request_twice_is_applied_once(replicas: list[str], env_id: str, at_once: bool) -> None:
    urls = [f"{url}/{env_id}" for url in replicas]
    body = (
        {"minecraft_dir": "agentenv_textcraft/", "commands": None, "goal": None}
        if env_id == "textcraft"
        else None
    )
    for episode in recorded(env_id, 3):
        created = (
            twice(urls, "/create", body, at_once).json()
            if body
            else twice(urls, "/create", {}, at_once).json()
        )
        env_idx, rid = created["id"], episode["create"]["response"]["id"]
        reset = twice(
            urls, "/reset", {"data_idx": episode["reset"]["body"]["data_idx"], "id": env_idx}, at_once
        )
        assert reset.json() == remap_id(episode["reset"]["response"], rid, env_idx)
        for step in episode["steps"]:
            answer = twice(urls, "/step", {"action": step["action"], "id": env_idx}, at_once)
            assert answer.json() == remap_id(step["response"], rid, env_idx), step["action"]
        assert twice(urls, "/close", {"id": env_idx}, at_once).json() is True
        assert requests.post(urls[0] + "/close", json={"id": env_idx}, timeout=30).json() is False


def test_a_retried_create_makes_one_session(replicas: list[str]) -> None:
    urls = [f"{url}/babyai" for url in replicas]
    env_idx = twice(urls, "/create", {}).json()["id"]
    # one session: closing it once frees it; the other replica's copy made none of its own
    assert requests.post(urls[1] + "/close", json={"id": env_idx}, timeout=30).json() is True
    assert requests.post(urls[0] + "/close", json={"id": env_idx}, timeout=30).json() is False


def test_another_request_under_a_used_id_is_a_new_request(replicas: list[str]) -> None:
    urls = [f"{url}/textcraft" for url in replicas]
    env_idx = requests.post(urls[0] + "/create", json={}, timeout=30).json()["id"]
    headers = {"X-Request-Id": "the-same-id-for-both"}
    for action in ("get 1 oak logs", "get 2 oak logs"):
        requests.post(urls[1] + "/step", json={"action": action, "id": env_idx}, headers=headers, timeout=30)
    inventory = requests.post(
        urls[0] + "/step", json={"action": "inventory", "id": env_idx}, timeout=30
    ).json()
    assert inventory["observation"] == "Inventory: [oak logs] (3) "


def test_webshop_root_routes_too(replicas: list[str], expert_plans: dict[int, list[str]]) -> None:
    goal, actions = next(iter(expert_plans.items()))
    env_idx = twice(replicas, "/create", {}).json()
    first = twice(replicas, "/reset", {"env_idx": env_idx, "session_id": goal}).json()
    native = requests.post(f"{replicas[0]}/v1/reset", json={"goal": goal}, timeout=30).json()
    assert first == [native["observation"], None]
    state = native["state"]
    for action in actions:
        answer = twice(replicas, "/step", {"env_idx": env_idx, "action": action}).json()
        native = requests.post(
            f"{replicas[0]}/v1/step", json={"state": state, "action": action}, timeout=30
        ).json()
        state = native["state"]
        assert (answer["state"], answer["reward"], answer["done"]) == (
            native["observation"], native["reward"], native["done"]
        )  # fmt: skip
    assert (answer["reward"], answer["done"]) == (1.0, True)
    assert twice(replicas, "/close", {"env_idx": env_idx}).json() == {"closed": True}


def test_without_a_request_id_every_request_is_applied(replicas: list[str]) -> None:
    """AgentGym's client straight to a replica (no balancer, so no X-Request-Id): each request is a new one."""
    env_idx = requests.post(f"{replicas[0]}/textcraft/create", json={}, timeout=30).json()["id"]
    for _ in range(2):
        requests.post(
            f"{replicas[0]}/textcraft/step", json={"action": "get 1 oak logs", "id": env_idx}, timeout=30
        )
    inventory = requests.post(
        f"{replicas[1]}/textcraft/step", json={"action": "inventory", "id": env_idx}, timeout=30
    )
    assert inventory.json()["observation"] == "Inventory: [oak logs] (2) "


def test_a_replica_with_a_stale_copy_of_the_session_answers_from_the_store(redis_cluster: list[str]) -> None:
    """A replica steps a session from its own copy when it has one (the balancer keeps a session on one
    replica); when another replica changed the session meanwhile (a failover), the copy is stale, and the
    answer must still be the store's: a change from a stale copy fails its compare-and-set, and an answer that
    changes nothing (BabyAI's "has finished") is checked against the store."""
    a, b = (f"{url}/textcraft" for url in redis_cluster)
    env_idx = requests.post(a + "/create", json={}, timeout=30).json()["id"]
    for base in (a, b):  # each replica now has its own copy, a's one step behind
        requests.post(base + "/step", json={"action": "get 1 oak logs", "id": env_idx}, timeout=30)
    inventory = requests.post(a + "/step", json={"action": "inventory", "id": env_idx}, timeout=30).json()
    assert inventory["observation"] == "Inventory: [oak logs] (2) "

    a, b = (f"{url}/babyai" for url in redis_cluster)
    episode = recorded("babyai", 1)[0]
    rid, data_idx = episode["create"]["response"]["id"], episode["reset"]["body"]["data_idx"]
    env_idx = requests.post(a + "/create", timeout=30).json()["id"]
    requests.post(a + "/reset", json={"id": env_idx, "data_idx": data_idx}, timeout=30)
    for step in episode["steps"]:  # played to the end on a: a's copy says the episode is done
        last = requests.post(a + "/step", json={"action": step["action"], "id": env_idx}, timeout=30).json()
        if last.get("done"):
            break
    assert last["done"] is True
    requests.post(b + "/reset", json={"id": env_idx, "data_idx": data_idx}, timeout=30)  # started again on b
    first = requests.post(
        a + "/step", json={"action": episode["steps"][0]["action"], "id": env_idx}, timeout=30
    )
    assert first.json() == remap_id(episode["steps"][0]["response"], rid, env_idx)


def test_webshop_steps_alternating_replicas_follow_the_store(
    redis_cluster: list[str], expert_plans: dict[int, list[str]]
) -> None:
    """WebShop's /step, its replicas taking turns: each one's copy of the session is a step behind every time."""
    goal, actions = next(iter(expert_plans.items()))
    env_idx = requests.post(f"{redis_cluster[0]}/create", timeout=30).json()
    requests.post(f"{redis_cluster[1]}/reset", json={"env_idx": env_idx, "session_id": goal}, timeout=30)
    native = requests.post(f"{redis_cluster[0]}/v1/reset", json={"goal": goal}, timeout=30).json()
    for number, action in enumerate(actions):
        url = redis_cluster[number % 2]
        answer = requests.post(f"{url}/step", json={"env_idx": env_idx, "action": action}, timeout=30).json()
        native = requests.post(
            f"{url}/v1/step", json={"state": native["state"], "action": action}, timeout=30
        ).json()
        assert (answer["state"], answer["reward"], answer["done"]) == (
            native["observation"], native["reward"], native["done"]
        )  # fmt: skip


@pytest.fixture
def bare_redis(tmp_path: Path) -> Any:
    """A redis-server of its own, unpersisted (the store's own behaviour is what is tested)."""
    import subprocess
    import time

    from agent_envs import cluster

    (port,) = cluster.free_ports(1)
    command = [
        cluster.redis_binary(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    deadline = time.monotonic() + 30
    while not cluster.redis_ping("127.0.0.1", port):
        assert time.monotonic() < deadline and process.poll() is None, "redis-server did not start"
        time.sleep(0.05)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(10)


def test_copies_of_sessions_are_left_alone_where_they_do_not_pay(bare_redis: str) -> None:
    """Two worker processes behind one replica address (two stores here): a session's steps alternate between
    them, so each one's copy is a step behind every time. After a few such stale copies a store reads the
    store first (a stale copy costs more than it saves); one process alone keeps using its copies."""
    import asyncio

    from agent_envs.api.compat_sessions import RedisSessionStore, SessionConflict

    async def steps(stores: list[RedisSessionStore], count: int) -> list[bool]:
        env_idx = stores[0].new_id()
        await stores[0].create(env_idx, 0, "test")
        used = []
        for number in range(count):
            store = stores[number % len(stores)]
            state, version = await store.get(env_idx, touch=False, cached=True)
            used.append(version.cached)
            try:
                await store.put(env_idx, state + 1, version)
            except SessionConflict:
                state, version = await store.get(env_idx, touch=False)
                await store.put(env_idx, state + 1, version)
        assert (await stores[0].get(env_idx))[0] == count  # every step applied once
        return used

    def store() -> RedisSessionStore:
        return RedisSessionStore(bare_redis, str, int, max_sessions=100, client_quota=100)

    alternating = asyncio.run(steps([store(), store()], 200))
    alone = asyncio.run(steps([store()], 200))
    assert sum(alternating[100:]) <= 100 / 32 + 2, sum(alternating[100:])  # only the probes
    assert all(alone[1:])


@pytest.mark.parametrize("cached", [True, False])
def test_a_write_the_store_runs_after_its_deadline_is_not_applied(bare_redis: str, cached: bool) -> None:
    """A hung store (SIGSTOP) wakes up after the replica gave up on a step and answered 503: the step it had sent
    must not take effect then (the client was told it was not). The step read the session (from this process's
    copy, or from the store) before the store hung, so its write is what the hung store holds."""
    import asyncio
    import os
    import signal

    from agent_envs.api.compat_sessions import RedisSessionStore, SessionStoreUnavailable

    port = int(bare_redis.rsplit(":", 1)[1].split("/")[0])
    pid = next(int(p) for p in os.listdir("/proc") if p.isdigit() and _listens(int(p), port))

    async def scenario() -> tuple[object, object]:
        store = RedisSessionStore(bare_redis, str, int, max_sessions=10, client_quota=10, deadline_s=0.6)
        env_idx = store.new_id()
        await store.create(env_idx, -1, "test")
        state, version = await store.get(env_idx, touch=False)
        await store.put(
            env_idx, state + 1, version
        )  # the write script is loaded (else the woken store refuses it)
        state, version = await store.get(env_idx, touch=False, cached=cached)
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(SessionStoreUnavailable):
                await store.put(env_idx, state + 1, version)
            await asyncio.sleep(0.2)  # the store wakes after the replica's deadline
        finally:
            os.kill(pid, signal.SIGCONT)
        fresh = RedisSessionStore(bare_redis, str, int, max_sessions=10, client_quota=10)
        after, _ = await fresh.get(env_idx, touch=False)
        await store.put(env_idx, state + 1, version)  # and the store takes the step when it is sent again
        again, _ = await fresh.get(env_idx, touch=False)
        return after, again

    after, again = asyncio.run(scenario())
    assert after == 0, "a step answered 503 session_store_down took effect when the store woke up"
    assert again == 1


def _listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` is the redis-server on ``port`` (its title: ``redis-server 127.0.0.1:PORT``)."""
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"redis-server" in title and f":{port}".encode() in title


def test_a_slow_clock_measurement_does_not_refuse_the_write_that_follows(bare_redis: str) -> None:
    """The write deadline is on the store's clock, its offset measured by a TIME call. A TIME call that is slow
    (a busy host; the store's answer sat in the socket) must not eat the write's own deadline nor leave an offset
    off by half its round trip: the first write after it is applied, and the next write measures again."""
    import asyncio

    from agent_envs.api.compat_sessions import RedisSessionStore

    async def scenario() -> tuple[int, int]:
        store = RedisSessionStore(bare_redis, str, int, max_sessions=10, client_quota=10, deadline_s=1.5)
        real_time, calls = store._redis.time, []

        async def slow_answer() -> object:
            answer = await real_time()  # the store's clock when it answered, then a slow way back
            calls.append(answer)
            if len(calls) == 1:
                await asyncio.sleep(1.2)
            return answer

        store._redis.time = slow_answer  # type: ignore[method-assign]
        env_idx = store.new_id()
        await store.create(env_idx, 0, "test")
        state, version = await store.get(env_idx, touch=False)
        await store.put(env_idx, state + 1, version)
        return (await store.get(env_idx, touch=False))[0], len(calls)

    state, measurements = asyncio.run(scenario())
    assert state == 1
    assert measurements == 2  # the slow measurement was taken again, the precise one kept
