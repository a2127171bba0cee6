"""AgentGym sessions live as long as AgentGym's own: no idle expiry a training run can meet, memory bounded by a
cap instead (``api/compat_sessions.py``).

AgentGym builds its clients once and reuses each one's session for every later episode, so the time between two
episodes of one client (a training step, a checkpoint save, an evaluation round) can be long. Time is advanced
here, not waited for: a session is *aged* in the shared store (its last use moved back, and any expiry the key
has brought forward by the same amount), exactly what that much idle time does to it in Redis.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from _agentgym_envs import TextCraftEnvClient
from _support import metric_value, start_cluster

from agent_envs.api.compat_sessions import CompatSessions

OLD_LIMIT_S = 900  # AGENTRL_COMPAT_IDLE_TTL_S before this change: 15 minutes
CAP = 5


@pytest.fixture(scope="module")
def capped(local_cluster, conformance_catalog_dir: Path, tmp_path_factory) -> Any:
    run_dir = tmp_path_factory.mktemp("session-lifetime")
    record = start_cluster(local_cluster, conformance_catalog_dir, run_dir,
                           env={"AGENTRL_ENVS": "textcraft", "AGENTRL_COMPAT_MAX_SESSIONS": str(CAP)})  # fmt: skip
    try:
        yield record
    finally:
        local_cluster.down(run_dir, quiet=True)


def age(store: redis.Redis, env: str, env_idx: int, seconds: float) -> None:
    """Make the session look ``seconds`` idler to Redis: its last use (the LRU indexes) earlier, and every
    expiry its keys have that much closer (expired when reached)."""
    prefix = f"agentgym:{env}:"
    client = store.hget(f"{prefix}s:{env_idx}", "c")
    keys = [f"{prefix}s:{env_idx}", *([f"{prefix}c:{client.decode()}"] if client else [])]
    for key in keys:
        left = store.pttl(key)
        if left >= 0:  # -1: no expiry; -2: gone
            if left <= seconds * 1000:
                store.delete(key)
            else:
                store.pexpire(key, left - int(seconds * 1000))
    for index in (f"{prefix}all", *keys[1:]):
        score = store.zscore(index, env_idx)
        if score is not None:
            store.zadd(index, {str(env_idx): score - seconds * 1000})


def test_a_client_idle_for_longer_than_the_old_limit_keeps_its_session(capped: dict) -> None:
    store = redis.Redis.from_url(capped["sessions"])
    client = TextCraftEnvClient(f"{capped['url']}/textcraft", timeout=30)
    client.reset(3)
    client.step("Action: get 1 oak logs")
    age(store, "textcraft", client.env_id, OLD_LIMIT_S + 60)  # a 16-minute checkpoint save between episodes
    assert client.step("Action: inventory").state == "Inventory: [oak logs] (1) "
    assert store.pttl(f"agentgym:textcraft:s:{client.env_id}") == -1  # no expiry at all
    age(store, "textcraft", client.env_id, 30 * 24 * 3600)  # and a month
    assert client.reset(4)["observation"].startswith("Crafting commands:")
    assert client.close() is True


def test_a_full_store_evicts_the_session_idle_the_longest_logs_and_counts_it(capped: dict) -> None:
    store = redis.Redis.from_url(capped["sessions"])
    base = f"{capped['url']}/textcraft"
    clients = [TextCraftEnvClient(base, timeout=30) for _ in range(CAP)]
    oldest = clients[2]
    age(store, "textcraft", oldest.env_id, 3600)  # idle the longest
    newcomer = TextCraftEnvClient(base, timeout=30)  # the store is full: one must go
    assert newcomer.reset(1)["observation"].startswith("Crafting commands:")
    # the evicted client gets AgentGym's own answer for an id its server does not know
    gone = requests.post(f"{base}/reset", json={"id": oldest.env_id, "data_idx": 1}, timeout=30)
    assert (gone.status_code, gone.json()) == (200, {"error": f"The id {oldest.env_id} is not valid."})
    for client in (*clients[:2], *clients[3:]):
        assert client.reset(2)["observation"].startswith("Crafting commands:")
    evictions = sum(
        metric_value(requests.get(r["url"] + "/metrics", timeout=30).text, "agentrl_compat_evictions_total",
                     {"reason": "cap"}) or 0
        for r in capped["replicas"]
    )  # fmt: skip
    logged = [
        line for r in capped["replicas"] for line in Path(r["log"]).read_text().splitlines()
        if '"AgentGym session evicted"' in line and f'"env_idx":{oldest.env_id}' in line
    ]  # fmt: skip
    assert evictions == 1 and len(logged) == 1 and '"reason":"cap"' in logged[0], (evictions, logged)
    assert '"idle_s":36' in logged[0]  # an hour, give or take the test's own seconds


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_single_process_store_keeps_idle_sessions_and_evicts_at_the_cap(caplog) -> None:
    """The memory store (one replica, one worker, no Redis), with a settable clock: the same policy."""
    clock, evicted = Clock(), []
    store = CompatSessions(2, clock=clock, on_evict=lambda reason, count: evicted.append((reason, count)))
    first = store.create("first")
    clock.now += 30 * 24 * 3600  # a month idle
    assert store.get(first) == "first" and store.sweep() == 0
    second = store.create("second")
    clock.now += 10
    store.get(first)  # first is now used more recently than second
    with caplog.at_level(logging.WARNING, logger="agent_envs.api"):
        store.create("third")
    assert first in store.ids() and second not in store.ids() and len(store) == 2
    assert evicted == [("cap", 1)]
    assert [r.fields["env_idx"] for r in caplog.records if r.msg == "AgentGym session evicted"] == [second]
