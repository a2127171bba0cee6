"""``make up-ray``'s one-node Ray cluster (``agent_envs.ray_serve.local``) with the env as a Ray Serve app, for
real: a native episode and an AgentGym episode (sessions in a Redis every replica reaches) through Serve's
proxy, both with the rewards of the in-process env; the Serve config file that ``--write-config`` writes runs
with Ray's own ``serve run``; ``down`` stops that head and nothing else.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from _agentgym import AgentGymClient

from agent_envs import cluster
from agent_envs.client import EnvClient, WebShopClient
from agent_envs.ray_serve import local

pytestmark = pytest.mark.timeout(600)
SECRET = "ray-serve-local-test-secret-0123456789"


@pytest.fixture
def redis_url(tmp_path: Path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is missing (make redis)")
    port = cluster.free_ports(1)[0]
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while not cluster.redis_ping("127.0.0.1", port):
        assert time.monotonic() < deadline, "redis-server did not start"
        time.sleep(0.1)
    yield f"redis://127.0.0.1:{port}/0"
    process.terminate()
    process.wait(10)


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("AGENTRL_STATE_SECRET", SECRET)
    path = tmp_path / "run"
    yield path
    local.down(path)


def expert(catalog_dir: Path, goal: int) -> tuple[list[str], float]:
    from agent_envs.envs.webshop.catalog.store import open_catalog
    from agent_envs.envs.webshop.core.env import WebShopEnv
    from agent_envs.envs.webshop.core.oracle import expert_actions, run_actions

    env = WebShopEnv(open_catalog(catalog_dir))
    actions = expert_actions(env, goal, "synthetic")
    return actions, run_actions(env, goal, actions, "synthetic")[-1].reward


def test_up_ray_serves_native_and_agentgym_episodes_then_down_stops_its_head(
    run_dir: Path, generated_catalog_dir: Path, redis_url: str, tmp_path: Path
) -> None:
    serve_port = cluster.free_ports(1)[0]
    record = local.up(run_dir, generated_catalog_dir, serve_port, replicas_per_node=2, cpus=2,
                      extra=["--redis-url", redis_url, "--envs", "webshop,textcraft"])  # fmt: skip
    (node,) = record["env"]["nodes"]
    assert node["replicas"] == 2 and node["readyz"] == 200 and node["proxy"] == "HEALTHY"
    url = record["env"]["local_url"]
    assert url == f"http://127.0.0.1:{serve_port}"

    actions, reward = expert(generated_catalog_dir, 3)

    async def native() -> float:
        async with WebShopClient(url) as client:
            step = await client.reset(3, goal_set="synthetic")
            for action in actions:
                step = await client.step(step["state"], action)
            return step["reward"]

    assert asyncio.run(native()) == pytest.approx(reward)

    gym = AgentGymClient(url)  # /create, /reset, /step: the session lives in Redis, any replica serves a step
    gym.reset(3)
    for action in actions:
        _, step_reward, done = gym.step(action)
    assert done and step_reward == pytest.approx(reward)

    # TextCraft through the same Serve app (AGENTRL_ENVS): native under /textcraft/v1, AgentGym's under /textcraft
    async def textcraft() -> dict:
        async with EnvClient(url, "textcraft") as client:
            result = await client.reset(101)
            for action in await client.expert(101):
                result = await client.step(result["state"], action)
            return result

    assert asyncio.run(textcraft())["reward"] == 1.0
    created = requests.post(
        f"{url}/textcraft/create", json={"minecraft_dir": "agentenv_textcraft/"}, timeout=30
    )
    assert created.status_code == 200 and created.json()["observation"].startswith("Crafting commands:")

    # The launcher's step before verl (AGENTRL_ENV=ray): serve-ray against the cluster finds the app serving.
    from agent_trainer.cli import deploy_env_on_cluster

    launcher_env = {**os.environ, "RAY_ADDRESS": record["address"], "WEBSHOP_CATALOG": str(generated_catalog_dir),
                    "AGENTRL_RAY_PORT": str(serve_port), "AGENTRL_RAY_REPLICAS_PER_NODE": "2",
                    "AGENTRL_REDIS_URL": redis_url, "AGENTRL_RAY_WAIT_S": "120"}  # fmt: skip
    assert deploy_env_on_cluster(launcher_env) == 0
    assert (
        deploy_env_on_cluster({**launcher_env, "AGENTRL_RAY_PORT": str(serve_port + 1)}) != 0
    )  # says so, fails

    # A deployed app is never re-deployed by the launcher (--if-missing), whatever the launcher's own settings;
    # serve-ray with the same arguments keeps it too (Ray would give every serve.run a new version: restarts).
    def serve_ray(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "agent_envs.cli", "serve-ray", "--address", record["address"], "--port",
             str(serve_port), "--wait", "120", *args],
            capture_output=True, text=True, env={**os.environ, "AGENTRL_STATE_SECRET": SECRET}, timeout=300,
        )  # fmt: skip

    kept = serve_ray("--if-missing", "--catalog", str(tmp_path / "elsewhere"), "--replicas-per-node", "1")
    assert kept.returncode == 0, kept.stderr[-2000:]
    assert "kept with its own arguments" in kept.stderr
    assert [n["replicas"] for n in json.loads(kept.stdout.splitlines()[-1])["nodes"]] == [2]
    same = serve_ray("--catalog", str(generated_catalog_dir), "--replicas-per-node", "2", "--redis-url", redis_url,
                     "--envs", "webshop,textcraft")  # fmt: skip
    assert same.returncode == 0, same.stderr[-2000:]
    assert "deployed with these arguments already: kept" in same.stderr

    # The config file for `serve deploy`/`serve run`: no secret in it; Ray's own CLI deploys it.
    config = tmp_path / "webshop-serve.yaml"
    env = {**os.environ, "AGENTRL_STATE_SECRET": SECRET}
    written = subprocess.run(
        [sys.executable, "-m", "agent_envs.cli", "serve-ray", "--address", record["address"], "--catalog",
         str(generated_catalog_dir), "--port", str(serve_port), "--app-name", "webshop2",
         "--write-config", str(config)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert written.returncode == 0, written.stderr[-2000:]
    text = config.read_text()
    assert SECRET not in text and "agent_envs.ray_serve.app:build" in text
    text = text.replace("route_prefix: /\n", "route_prefix: /second\n")  # beside the first app
    config.write_text(text)
    from agent_envs.ray_serve import needs_token_mode

    serve_env = {**env, **({"RAY_AUTH_MODE": "token"} if needs_token_mode(env) else {})}
    ran = subprocess.run(
        [str(Path(sys.executable).parent / "serve"), "run", str(config), "--address", record["address"],
         "--non-blocking"],
        capture_output=True, text=True, env=serve_env, timeout=300,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    deadline = time.monotonic() + 120
    while cluster.http_status(f"{url}/second/readyz") != 200:
        assert time.monotonic() < deadline, "the app deployed from the config file never answered"
        time.sleep(1.0)

    head = local.LocalRayHead(Path(record["temp_dir"]), port=record["port"], leader=record["pid"])
    assert head.session_pids()
    local.down(run_dir)
    assert not head.alive() and not head.session_pids()
    assert cluster.http_status(f"{url}/readyz") is None


@pytest.mark.slow
def test_up_ray_serves_every_environment(
    run_dir: Path, generated_catalog_dir: Path, redis_url: str, monkeypatch
) -> None:
    """`make up-ray ENVS=webshop,textcraft,babyai,sciworld`: one Serve app answers an episode of every
    environment through Serve's proxy: WebShop, TextCraft and BabyAI natively (to their ends), SciWorld by
    AgentGym's requests and natively, exactly as recorded (a step landing on the replica without the episode's
    JVM replays it there: the same answer)."""
    from _support import REPO

    from agent_envs.envs.agentgym import replay_trace
    from agent_envs.envs.sciworld import python_index
    from agent_envs.envs.sciworld.agentgym import documented_difference

    monkeypatch.setenv("SCIWORLD_SPARE_JVMS", "1")
    serve_port = cluster.free_ports(1)[0]
    record = local.up(run_dir, generated_catalog_dir, serve_port, replicas_per_node=2, cpus=2,
                      extra=["--redis-url", redis_url, "--envs", "webshop,textcraft,babyai,sciworld"])  # fmt: skip
    url = record["env"]["local_url"]
    actions, reward = expert(generated_catalog_dir, 3)
    traces = REPO / "tests" / "fixtures" / "conformance" / "agentgym-sciworld" / "traces.jsonl"
    episode = next(e for e in map(json.loads, traces.read_text().splitlines()) if e["data_idx"] == 4433)
    steps = [s for s in episode["steps"] if "observation" in s["response"]]

    async def native() -> dict[str, dict]:
        finals = {}
        async with WebShopClient(url) as client:
            step = await client.reset(3, goal_set="synthetic")
            for action in actions:
                step = await client.step(step["state"], action)
            finals["webshop"] = step
        for env_id in ("textcraft", "babyai"):
            async with EnvClient(url, env_id, timeout=60) as client:
                result = await client.reset(3)
                for action in await client.expert(3):
                    result = await client.step(result["state"], action)
                    if result["done"]:
                        break
                finals[env_id] = result
        async with EnvClient(url, "sciworld", timeout=120) as client:
            result = await client.reset(python_index(episode["data_idx"]))
            for step in steps:
                result = await client.step(result["state"], step["action"])
            finals["sciworld"] = result
        return finals

    finals = asyncio.run(native())
    assert finals["webshop"]["reward"] == pytest.approx(reward)
    assert all(finals[e]["done"] and finals[e]["reward"] > 0 for e in ("textcraft", "babyai")), finals
    last = steps[-1]["response"]
    assert (finals["sciworld"]["observation"], finals["sciworld"]["info"]["score"]) == (
        last["observation"], last["score"],
    )  # fmt: skip

    def send(method: str, route: str, fields: dict | None) -> tuple[int, object]:
        if method == "GET":
            response = requests.get(f"{url}/sciworld{route}", params=fields or {}, timeout=120)
        elif fields is None:
            response = requests.post(f"{url}/sciworld{route}", timeout=120)
        else:
            response = requests.post(f"{url}/sciworld{route}", json=fields, timeout=120)
        return response.status_code, response.json()

    assert replay_trace(episode, send, documented_difference) == []


def test_up_ray_without_webshop_needs_no_catalog(run_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """`make up-ray ENVS=textcraft` on a machine without WebShop's catalog: serve-ray passes none and the replicas
    (whose start checks are the served environments' own) serve TextCraft to its end; WebShop is not served. Before,
    every replica refused to start without a prepared catalog."""
    for name in ("WEBSHOP_CATALOG", "CATALOG_DIR"):  # make exports CATALOG_DIR
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no data/catalog here
    serve_port = cluster.free_ports(1)[0]
    record = local.up(run_dir, None, serve_port, cpus=2, extra=["--envs", "textcraft"])
    url = record["env"]["local_url"]

    async def episode() -> dict:
        async with EnvClient(url, "textcraft", timeout=60) as client:
            result = await client.reset(3)
            for action in await client.expert(3):
                result = await client.step(result["state"], action)
                if result["done"]:
                    break
            return result

    final = asyncio.run(episode())
    assert final["done"] and final["reward"] > 0, final
    assert cluster.http_status(f"{url}/webshop/v1/info") != 200
