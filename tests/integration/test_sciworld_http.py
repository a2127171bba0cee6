"""SciWorld served by a real replica behind a real nginx: AgentGym's requests replay recorded episodes through the
balancer (each episode on a fresh JVM from the replica's warm pool), and the native protocol plays, steps and
frees an episode's JVM (``/sciworld/v1/close``). The replica holding an episode's JVM killed mid-episode
(SIGKILL, its JVMs with it): the next step, native or AgentGym's, is answered by the other replica, which replays
the episode and answers exactly what the uninterrupted run (the recording) answered. JVMs take seconds each:
`make test-all` only."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from _support import start_cluster

from agent_envs.client import EnvClient
from agent_envs.cluster import http_status
from agent_envs.envs.agentgym import over_the_request_cap, replay_trace
from agent_envs.envs.sciworld import python_index
from agent_envs.envs.sciworld.agentgym import documented_difference

pytestmark = pytest.mark.slow
TRACES = (
    Path(__file__).resolve().parents[1] / "fixtures" / "conformance" / "agentgym-sciworld" / "traces.jsonl"
)
EPISODES = (
    4639,
    4136,
    4446,
)  # past the end of the list; a random episode; an edge episode with every probe route


def over_cap_or_documented(difference: str) -> bool:
    """A difference docs/deviations.md lists: SciWorld's own, or the HTTP request cap's."""
    return documented_difference(difference) or over_the_request_cap(difference)


@pytest.fixture(scope="module")
def sciworld_cluster(local_cluster, conformance_catalog_dir: Path, tmp_path_factory) -> dict:
    run_dir = tmp_path_factory.mktemp("sciworld-cluster")
    record = start_cluster(local_cluster, conformance_catalog_dir, run_dir, env={"AGENTRL_ENVS": "sciworld"})
    try:
        yield record
    finally:
        local_cluster.down(run_dir, quiet=True)


def test_agentgym_requests_replay_recorded_episodes_through_the_balancer(sciworld_cluster: dict) -> None:
    episodes = {e["data_idx"]: e for e in map(json.loads, TRACES.read_text().splitlines())}
    base = f"{sciworld_cluster['url']}/sciworld"
    with httpx.Client(timeout=120) as client:

        def send(method: str, route: str, fields: dict | None) -> tuple[int, object]:
            if method == "GET":
                response = client.get(base + route, params=fields or {})
            elif fields is None:
                response = client.post(base + route)
            else:
                response = client.post(base + route, json=fields)
            try:
                return response.status_code, response.json()
            except ValueError:
                return response.status_code, response.text

        failures = {idx: replay_trace(episodes[idx], send, over_cap_or_documented)[:2] for idx in EPISODES}
    assert not any(failures.values()), failures


def test_native_episode_steps_and_close_frees_its_jvm(sciworld_cluster: dict) -> None:
    async def main() -> tuple[dict, dict, bool]:
        async with EnvClient(sciworld_cluster["url"], "sciworld", timeout=120) as client:
            first = await client.reset(4136)
            plan = await client.expert(4136)
            result = first
            for action in plan[:3]:
                result = await client.step(result["state"], action)
            return first, result, await client.close(result["state"])

    first, last, closed = asyncio.run(main())
    assert first["observation"] and "task_description" in first["info"]
    assert last["done"] is False and closed is True


# ---- replica loss ------------------------------------------------------------------------------------------------
KILL_EPISODE = 3306  # gold, 11 steps (find-non-living-thing)
KILL_AFTER = 4  # steps before the replica holding the episode is killed


def _episode(data_idx: int) -> dict[str, Any]:
    return next(e for e in map(json.loads, TRACES.read_text().splitlines()) if e["data_idx"] == data_idx)


def _holder(record: dict, uri: str) -> dict:
    """The replica that answered the last successful request for ``uri`` (nginx's access log, written at once)."""
    for line in reversed(Path(record["nginx"]["access_log"]).read_text().splitlines()):
        entry = json.loads(line)
        if entry["uri"] == uri and entry["status"] == 200:
            address = entry["upstream_addr"].split(",")[-1].strip()
            return next(r for r in record["replicas"] if r["url"] == f"http://{address}")
    raise AssertionError(f"no answered {uri} in the access log")


def _kill(replica: dict) -> None:
    """SIGKILL the replica's process group: uvicorn and the JVMs it started (py4j's, in its group)."""
    os.killpg(replica["pid"], signal.SIGKILL)


@pytest.fixture
def two_replicas(local_cluster, conformance_catalog_dir: Path, tmp_path: Path):
    """A cluster of its own (one replica gets killed): 2 SciWorld replicas, one spare JVM each."""
    record = start_cluster(local_cluster, conformance_catalog_dir, tmp_path / "run",
                           env={"AGENTRL_ENVS": "sciworld", "SCIWORLD_SPARE_JVMS": "1"})  # fmt: skip
    try:
        yield record
    finally:
        local_cluster.down(tmp_path / "run", quiet=True)


def test_native_episode_continues_by_replay_when_its_replica_is_killed(two_replicas: dict) -> None:
    """Kill the replica holding the episode's JVM after 4 steps: the remaining steps, answered by the other replica
    (replaying the token's actions in a fresh JVM), are the recording's, observation for observation."""
    episode = _episode(KILL_EPISODE)
    steps = [s for s in episode["steps"] if "observation" in s["response"]]  # not the one after the end
    killed: list[dict] = []

    async def main() -> list[dict]:
        async with EnvClient(two_replicas["url"], "sciworld", timeout=120, retries=8, backoff=0.2) as client:
            result = await client.reset(python_index(KILL_EPISODE))
            answers = []
            for n, step in enumerate(steps):
                if n == KILL_AFTER:
                    victim = _holder(two_replicas, "/sciworld/v1/step")
                    _kill(victim)
                    killed.append(victim)
                result = await client.step(result["state"], step["action"])
                answers.append(result)
            return answers

    answers = asyncio.run(main())
    assert killed and http_status(killed[0]["url"] + "/healthz") is None
    got = [(a["observation"], a["info"]["score"], a["done"]) for a in answers]
    want = [(s["response"]["observation"], s["response"]["score"], s["response"]["done"]) for s in steps]
    assert got == want
    survivor = _holder(two_replicas, "/sciworld/v1/step")
    assert survivor is not killed[0], "the steps after the kill were answered by the other replica"


def test_agentgym_session_continues_by_replay_when_its_replica_is_killed(two_replicas: dict) -> None:
    """AgentGym's requests (session in Redis, JVM on one replica): kill the replica holding the JVM after 4 steps.
    The request sent at that moment may meet a connection nginx still held to the dead replica: nginx re-sends it
    to the other replica (exactly once: ``compat_sessions``), which replays the episode, so it and every later
    request are answered exactly as recorded (no lost step, no doubled one), with no retry by the client."""
    episode = _episode(KILL_EPISODE)
    base = f"{two_replicas['url']}/sciworld"
    steps_sent = 0
    killed: list[dict] = []
    refusals: list[tuple[int, object, str | None]] = []
    with httpx.Client(timeout=120) as client:

        def send(method: str, route: str, fields: dict | None) -> tuple[int, object]:
            nonlocal steps_sent
            if route == "/step":
                if steps_sent == KILL_AFTER:
                    victim = _holder(two_replicas, "/sciworld/step")
                    _kill(victim)
                    killed.append(victim)
                steps_sent += 1
            for _ in range(5):  # a client that honours Retry-After (tests/_agentgym.py does, at most 5 s)
                if method == "GET":
                    response = client.get(base + route, params=fields or {})
                else:
                    response = client.post(base + route, json=fields)
                if response.status_code != 503 or "Retry-After" not in response.headers:
                    break
                refusals.append((response.status_code, response.json(), response.headers["Retry-After"]))
                time.sleep(min(5.0, float(response.headers["Retry-After"])))
            return response.status_code, response.json()

        differences = replay_trace(episode, send, over_cap_or_documented)
    assert killed and steps_sent == len(episode["steps"])
    assert differences == []
    assert _holder(two_replicas, "/sciworld/step") is not killed[0]
    assert refusals == []


def test_a_replicas_episode_lost_reaches_the_client_as_it_is(tmp_path: Path) -> None:
    """The balancer's side of ``episode_lost`` (a replay that cannot match, 503 + Retry-After naming the episode):
    the real nginx config in front of two stand-in replicas that answer it. The client gets that answer as it is,
    at once; nginx neither re-sends it to the other replica (which would replay and fail again) nor takes the
    replica out of the upstream (which would move every other episode's steps to replays)."""
    import subprocess
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from agent_envs import cluster

    hits: list[tuple[int, str]] = []
    lost = {"error": "episode_lost", "detail": "episode 0123abcd could not be rebuilt: start a new episode"}

    class Replica(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            hits.append((self.server.server_address[1], self.path))
            lose = self.path == "/sciworld/v1/step"
            body = json.dumps(lost if lose else {"observation": "ok"}).encode()
            self.send_response(503 if lose else 200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if lose:
                self.send_header("Retry-After", "1")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    servers = [ThreadingHTTPServer(("127.0.0.1", 0), Replica) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    port = cluster.free_ports(1)[0]
    upstreams = "        zone env_upstreams 256k;\n" + "\n".join(
        f"        server 127.0.0.1:{s.server_address[1]} max_fails=1 fail_timeout=10s;" for s in servers
    )
    conf = tmp_path / "nginx.conf"
    conf.write_text(cluster.render_nginx_conf({
        "AGENTRL_UPSTREAMS": upstreams, "AGENTRL_LISTEN_PORT": f"127.0.0.1:{port}",
        "AGENTRL_NGINX_RUNTIME_DIR": str(tmp_path), "AGENTRL_NGINX_ACCESS_LOG": str(tmp_path / "access.log"),
        "AGENTRL_NGINX_ERROR_LOG": str(tmp_path / "error.log"),
    }))  # fmt: skip
    nginx = subprocess.Popen([cluster.nginx_binary(), "-p", str(tmp_path), "-c", str(conf)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            for _ in range(100):
                if http_status(f"http://127.0.0.1:{port}/nginx-health") == 200:
                    break
                time.sleep(0.05)
            headers = {"X-Episode": "0123abcd"}
            first = client.post("/sciworld/v1/step", json={"state": "s", "action": "a"}, headers=headers)
            assert first.status_code == 503 and first.json() == lost and first.headers["Retry-After"] == "1"
            assert len(hits) == 1, f"re-sent to the other replica: {hits}"
            again = client.post("/sciworld/v1/step", json={"state": "s", "action": "a"}, headers=headers)
            assert again.status_code == 503 and hits[1][0] == hits[0][0], "the replica was taken out"
            other = client.post("/sciworld/v1/reset", json={"task": 1}, headers=headers)
            assert other.status_code == 200 and hits[2][0] == hits[0][0]
    finally:
        os.killpg(nginx.pid, signal.SIGTERM)
        nginx.wait(10)
        for server in servers:
            server.shutdown()
