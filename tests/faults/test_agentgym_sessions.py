"""AgentGym's client protocol through the balancer, with sessions in Redis shared by 2 replicas x 2 workers:

- every episode equals the same episode through the native protocol (observations, rewards, done);
- SIGKILL of the replica that created 32 sessions: all 32 continue on the other replica, to the expert's
  reward;
- one client cannot evict another's sessions: it is held to its own quota (LRU within the client).
"""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from _agentgym import AgentGymClient
from _faults import figure, native_trace, signal_replica, start

from agent_envs import cluster

SESSIONS = 32


@pytest.fixture(scope="module")
def shared_cluster(conformance_catalog_dir, tmp_path_factory):
    record = start(
        conformance_catalog_dir,
        tmp_path_factory.mktemp("agentgym"),
        env={"AGENTRL_COMPAT_CLIENT_MAX_SESSIONS": "40"},
    )
    try:
        yield record
    finally:
        cluster.down(record["run_dir"], quiet=True)


def agentgym_trace(url: str, goal: int, actions: list[str]) -> list[tuple[str, float, bool]]:
    client = AgentGymClient(url)
    observation, extra = client.reset(goal)
    assert extra is None
    trace = [(observation, 0.0, False)]
    for action in actions:
        state, reward, done = client.step(action)
        trace.append((state, reward, done))
        if done:
            break
    assert client.close() == {"closed": True}
    return trace


def test_agentgym_protocol_equals_native_through_the_balancer(shared_cluster, expert_plans) -> None:
    url = shared_cluster["url"]
    goals = list(expert_plans)[:24]
    # the expert's episode with an invalid click and an extra search in front: no-ops and searches too
    plans = {g: ["click[no such button]", "search[red]", *expert_plans[g]] for g in goals}
    with ThreadPoolExecutor(12) as pool:  # concurrent sessions land on every worker of every replica
        compat = list(pool.map(lambda g: agentgym_trace(url, g, plans[g]), goals))
    native = [native_trace(url, g, plans[g]) for g in goals]
    equal = sum(c == n for c, n in zip(compat, native, strict=True))
    upstreams = _upstreams_of(shared_cluster, ("/create", "/step"))
    figure(
        f"AgentGym client protocol through the balancer, 2 replicas x 2 workers: {equal}/{len(goals)} episodes "
        f"equal to the native protocol ({sum(len(t) for t in compat)} observations compared); compat requests "
        f"served by {len(upstreams)} replicas"
    )
    assert equal == len(goals)
    assert all(trace[-1][1:] == (1.0, True) for trace in compat)
    assert len(upstreams) == 2


def test_sigkill_of_the_creating_replica_loses_no_session(shared_cluster, expert_plans) -> None:
    record = shared_cluster
    victim = record["replicas"][0]
    goals = list(expert_plans)[:SESSIONS]
    clients = {g: AgentGymClient(victim["url"]) for g in goals}  # created (and half played) on the victim
    for goal, client in clients.items():
        client.reset(goal)
        for action in expert_plans[goal][: len(expert_plans[goal]) // 2]:
            client.step(action)
    signal_replica(record, 0, signal.SIGKILL)
    finished = 0
    for goal, client in clients.items():
        client.env_server_base = record["url"]  # the balancer: only the other replica is left
        reward, done = 0.0, False
        for action in expert_plans[goal][len(expert_plans[goal]) // 2 :]:
            _, reward, done = client.step(action)
        finished += reward == 1.0 and done
    figure(
        f"SIGKILL of the replica that created {SESSIONS} AgentGym sessions (mid-episode): {finished}/{SESSIONS} "
        "continued on the other replica to the expert's reward 1.0"
    )
    assert finished == SESSIONS


def test_one_client_cannot_evict_another(shared_cluster) -> None:
    """Client quota 40 (set above): a flood of /create from one client address evicts only its own oldest."""
    url = shared_cluster["url"]
    replica = shared_cluster["replicas"][-1]["url"]  # alive in every test order
    victim = AgentGymClient(url)
    victim.reset(1)
    flood = [
        requests.post(f"{replica}/create", headers={"X-Forwarded-For": "10.9.9.9"}, timeout=30).json()
        for _ in range(100)
    ]
    assert victim.observe().startswith("WebShop [SEP]")  # the other client's session survived the flood
    oldest = requests.get(f"{replica}/observation", params={"env_idx": flood[0]}, timeout=30)
    newest = requests.get(f"{replica}/observation", params={"env_idx": flood[-1]}, timeout=30)
    assert oldest.status_code == 404 and oldest.json()["error"] == "unknown_env"
    assert newest.status_code == 200
    live = set(requests.get(f"{replica}/list_envs", timeout=30).json())
    kept = len(live & set(flood))
    figure(
        f"AgentGym session quota: {len(flood)} creates from one client address (quota 40) kept {kept} of its "
        f"own sessions (evicted {len(flood) - kept}); the other client's session survived"
    )
    assert kept == 40 and victim.env_id in live


def _upstreams_of(record, paths: tuple[str, ...]) -> set[str]:
    import json
    from pathlib import Path

    seen = set()
    for line in Path(record["nginx"]["access_log"]).read_text().splitlines():
        entry = json.loads(line)
        if entry["uri"] in paths and entry["upstream_addr"]:
            seen.add(entry["upstream_addr"])
    return seen
