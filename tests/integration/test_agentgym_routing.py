"""The balancer routes AgentGym's requests by session (``configs/nginx/balancer.conf.template``): every request of
one session goes to one replica, and the sessions of one host spread over all of them, without the client's
help (AgentGym's clients send no header for it). For SciWorld that is where the episode's JVM lives, so its
capacity is the sum of its replicas'; before, its sessions followed the client's address, and one host's went to
one replica. No JVM starts here (no spares, no valid reset): the routing is what is checked.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import pytest
import requests
from _agentgym_envs import CLIENTS
from _support import start_cluster

SESSIONS = 15  # odd, so a round robin would move each session; all on one replica by chance: 2 in 2**15


@pytest.fixture(scope="module")
def routed(local_cluster, conformance_catalog_dir: Path, tmp_path_factory) -> dict:
    run_dir = tmp_path_factory.mktemp("routing")
    record = start_cluster(local_cluster, conformance_catalog_dir, run_dir,
                           env={"AGENTRL_ENVS": "webshop,textcraft,babyai,sciworld", "SCIWORLD_SPARE_JVMS": "0"})  # fmt: skip
    try:
        yield record
    finally:
        local_cluster.down(run_dir, quiet=True)


def _upstreams_by_session(record: dict, env_id: str, ids: set[int]) -> dict[int, set[str]]:
    """session id -> the replicas that answered its GETs (the balancer's access log: ``request`` holds the query)."""
    seen: dict[int, set[str]] = defaultdict(set)
    for line in Path(record["nginx"]["access_log"]).read_text().splitlines():
        entry = json.loads(line)
        target = entry["request"].split(" ")[1] if entry["request"] else ""
        if target.startswith(f"/{env_id}/detail?id=") or target.startswith(f"/{env_id}/observation?id="):
            env_idx = int(target.split("=", 1)[1])
            if env_idx in ids:
                seen[env_idx].add(entry["upstream_addr"])
    return seen


@pytest.mark.parametrize("env_id", ["sciworld", "textcraft", "babyai"])
def test_one_hosts_sessions_spread_and_each_stays_on_its_replica(routed: dict, env_id: str) -> None:
    clients = [CLIENTS[env_id](f"{routed['url']}/{env_id}", timeout=30) for _ in range(SESSIONS)]
    route = "detail" if env_id != "babyai" else "observation"
    for _ in range(3):
        for client in clients:
            client._get(route)  # AgentGym's own GET, ?id=
    seen = _upstreams_by_session(routed, env_id, {c.env_id for c in clients})
    assert set(seen) == {c.env_id for c in clients}
    assert all(len(replicas) == 1 for replicas in seen.values()), seen  # one replica per session
    used = set().union(*seen.values())
    replicas = [r for r in routed["replicas"] if env_id in r["envs"].split(",")]
    assert used == {r["url"].removeprefix("http://") for r in replicas}, (used, replicas)  # and every replica
    for client in clients:
        client.close()


def test_a_posts_session_id_is_read_from_its_json_body(routed: dict) -> None:
    """A POST's id is in its body: the balancer finds it there (as a JSON key, not inside a string)."""
    base = f"{routed['url']}/textcraft"
    env_idx = requests.post(base + "/create", json={}, timeout=30).json()["id"]
    before = len(Path(routed["nginx"]["access_log"]).read_text().splitlines())
    for action in ("inventory", 'get 1 "id": 5, oak logs', '{"id": 7}', "inventory"):
        body = json.dumps({"action": action, "id": env_idx}, separators=(",", ":"))
        requests.post(base + "/step", data=body, headers={"Content-Type": "application/json"}, timeout=30)
        requests.post(base + "/step", json={"id": env_idx, "action": action}, timeout=30)  # other key order
    requests.get(f"{base}/detail", params={"id": env_idx}, timeout=30)
    lines: list[str] = []
    for _ in range(
        50
    ):  # nginx writes a request's line after its answer: the last one may come a moment later
        lines = Path(routed["nginx"]["access_log"]).read_text().splitlines()[before:]
        if len(lines) >= 9:
            break
        time.sleep(0.1)
    upstreams = {json.loads(line)["upstream_addr"] for line in lines}
    assert len(lines) == 9 and len(upstreams) == 1, lines
