"""SciWorld served by a real replica behind a real nginx: AgentGym's requests replay recorded episodes through the
balancer (each episode on a fresh JVM from the replica's warm pool), and the native protocol plays, steps and
frees an episode's JVM (``/sciworld/v1/close``). JVMs take seconds each: `make test-all` only."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from _support import start_cluster

from webshop_env.client import EnvClient
from webshop_env.envs.agentgym import replay_trace
from webshop_env.envs.sciworld.agentgym import documented_difference

pytestmark = pytest.mark.slow
TRACES = (
    Path(__file__).resolve().parents[1] / "fixtures" / "conformance" / "agentgym-sciworld" / "traces.jsonl"
)
EPISODES = (
    4639,
    4136,
    4446,
)  # past the end of the list; a random episode; an edge episode with every probe route


@pytest.fixture(scope="module")
def sciworld_cluster(local_cluster, conformance_catalog_dir: Path, tmp_path_factory) -> dict:
    run_dir = tmp_path_factory.mktemp("sciworld-cluster")
    record = start_cluster(local_cluster, conformance_catalog_dir, run_dir, env={"WEBSHOP_ENVS": "sciworld"})
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

        failures = {idx: replay_trace(episodes[idx], send, documented_difference)[:2] for idx in EPISODES}
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
