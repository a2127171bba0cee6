"""Through the real local cluster: 2 replica processes behind a real nginx, driven by the async client."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
import requests
from _support import metric_value, start_cluster

from agent_envs.client import ServiceRequestError, WebShopClient
from agent_envs.cluster import http_status

pytestmark = pytest.mark.cluster


async def play(
    client: WebShopClient, goal: int, actions: list[str], pause: float = 0.0, on_step=None
) -> dict:
    page = await client.reset(goal)
    for action in actions:
        if pause:
            await asyncio.sleep(pause)
        page = await client.step(page["state"], action)
        if on_step is not None:
            on_step()
        if page["done"]:
            break
    return page


def test_expert_episodes_through_nginx(cluster, expert_plans: dict[int, list[str]]) -> None:
    goals = list(expert_plans)[:16]

    async def main() -> list[dict]:
        async with WebShopClient(cluster["url"], timeout=10) as client:
            await client.wait_until_ready(30)
            assert (await client.info())["products"] == 300
            assert await client.expert(goals[0]) == expert_plans[goals[0]]
            return await asyncio.gather(*(play(client, g, expert_plans[g]) for g in goals))

    finals = asyncio.run(main())
    assert [f["reward"] for f in finals] == [1.0] * len(goals)
    assert all(f["done"] and f["info"]["reward_info"] for f in finals)
    access = Path(cluster["nginx"]["access_log"]).read_text()
    for replica in cluster["replicas"]:  # least_conn spread the load over both replicas
        assert f"127.0.0.1:{replica['port']}" in access


def test_step_batch_through_nginx(cluster, expert_plans: dict[int, list[str]]) -> None:
    goals = list(expert_plans)[:8]

    async def main() -> list[dict]:
        async with WebShopClient(cluster["url"], timeout=10) as client:
            states = [(await client.reset(g))["state"] for g in goals]
            while True:
                pending = [(i, s) for i, s in enumerate(states) if s is not None]
                if not pending:
                    return finals
                results = await client.step_batch([(s, expert_plans[goals[i]][steps[i]]) for i, s in pending])
                for (i, _), result in zip(pending, results, strict=True):
                    steps[i] += 1
                    if result["done"]:
                        finals[i] = result
                        states[i] = None
                    else:
                        states[i] = result["state"]

    steps = [0] * len(goals)
    finals: list[dict] = [{}] * len(goals)
    assert [f["reward"] for f in asyncio.run(main())] == [1.0] * len(goals)


def test_replica_killed_mid_run_loses_no_episode(
    local_cluster, conformance_catalog_dir: Path, tmp_path: Path, expert_plans: dict[int, list[str]]
) -> None:
    """SIGKILL one of two replicas while 64 episodes run: nginx and the client's retries hide it."""
    record = start_cluster(local_cluster, conformance_catalog_dir, tmp_path / "run")
    try:
        victim = record["replicas"][0]
        goals = [list(expert_plans)[i % len(expert_plans)] for i in range(64)]
        total = sum(len(expert_plans[g]) for g in goals)
        done_steps = 0
        killed = asyncio.Event()

        def on_step() -> None:
            nonlocal done_steps
            done_steps += 1
            if done_steps >= total // 3 and not killed.is_set():
                os.killpg(victim["pid"], signal.SIGKILL)  # the whole replica, like a container dying
                killed.set()

        async def main() -> list[dict]:
            async with WebShopClient(record["url"], timeout=10, retries=8, backoff=0.05) as client:
                return await asyncio.gather(
                    *(play(client, g, expert_plans[g], pause=0.02, on_step=on_step) for g in goals)
                )

        finals = asyncio.run(main())
        assert killed.is_set()
        assert [f["reward"] for f in finals] == [1.0] * 64
        assert http_status(victim["url"] + "/healthz") is None  # really gone
        assert http_status(record["replicas"][1]["url"] + "/healthz") == 200
        assert http_status(record["url"] + "/healthz") == 200
        access = Path(record["nginx"]["access_log"]).read_text()
        assert f'"upstream_addr":"127.0.0.1:{victim["port"]}, ' in access  # nginx re-sent requests elsewhere
    finally:
        local_cluster.down(tmp_path / "run", quiet=True)


BAD_INPUTS = [
    # (name, method, path, kwargs, status, kind)
    ("malformed json", "POST", "/v1/step", {"data": b"{nope", "headers": {"content-type": "application/json"}}, 400,
     "malformed_json"),
    ("missing fields", "POST", "/v1/step", {"json": {"action": "search[x]"}}, 422, "validation_error"),
    ("wrong type", "POST", "/v1/reset", {"json": {"goal": {"a": 1}}}, 422, "validation_error"),
    ("unknown goal", "POST", "/v1/reset", {"json": {"goal": 1_000_000}}, 404, "unknown_goal"),
    ("negative goal", "POST", "/v1/reset", {"json": {"goal": -3}}, 404, "unknown_goal"),
    ("unknown goal set", "POST", "/v1/reset", {"json": {"goal": 1, "goal_set": "x"}}, 404, "unknown_goal"),
    ("goal outside split", "POST", "/v1/reset", {"json": {"goal": 1, "split": "train"}}, 404, "goal_not_in_split"),
    ("body over app limit", "POST", "/v1/reset", {"json": {"goal": 1, "pad": "x" * 100_000}}, 413, "body_too_large"),
    ("body over nginx limit", "POST", "/v1/reset", {"json": {"goal": 1, "pad": "x" * 2_000_000}}, 413,
     "body_too_large"),
    ("tampered token", "POST", "/v1/step", {"json": {"state": "v1.eJyrVkrOz0nNTVWyUgrOz0lVKE4tykvMzEvPzFNIzs8rSc0rUbJS"
                                                     "MjIwMDAwMlGqBQDBfxA7.AAAA", "action": "search[x]"}}, 400,
     "invalid_token"),
    ("garbage token", "POST", "/v1/step", {"json": {"state": "hello", "action": "search[x]"}}, 400, "invalid_token"),
    ("non-utf8 action", "POST", "/v1/step", {"data": b'{"state": "x", "action": "\xc3\x28"}',
                                             "headers": {"content-type": "application/json"}}, 400, "malformed_json"),
    ("lone surrogate action", "POST", "/v1/step", {"data": b'{"state": "x", "action": "\\ud800"}',
                                                   "headers": {"content-type": "application/json"}}, 422,
     "validation_error"),
    ("batch not a list", "POST", "/v1/step_batch", {"json": {"steps": 5}}, 422, "validation_error"),
    ("unknown compat id", "POST", "/step", {"json": {"env_idx": 123, "action": "search[x]"}}, 404, "unknown_env"),
    ("unknown compat id (query)", "GET", "/observation", {"params": {"env_idx": 123}}, 404, "unknown_env"),
    ("compat id not an int", "GET", "/observation", {"params": {"env_idx": "abc"}}, 422, "validation_error"),
    ("unknown path", "GET", "/v2/step", {}, 404, "not_found"),
    ("wrong method", "DELETE", "/v1/step", {}, 405, "method_not_allowed"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "method", "path", "kwargs", "status", "kind"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input_matrix(cluster, name, method, path, kwargs, status, kind) -> None:
    response = requests.request(method, cluster["url"] + path, timeout=10, **kwargs)
    assert response.status_code == status, (name, response.text[:300])
    body = response.json()
    assert body["error"] == kind and body["detail"], body
    assert requests.get(cluster["url"] + "/healthz", timeout=10).status_code == 200


def test_cluster_still_serves_after_bad_input(cluster) -> None:
    for replica in cluster["replicas"]:
        assert http_status(replica["url"] + "/healthz") == 200
        assert http_status(replica["url"] + "/readyz") == 200
    assert http_status(cluster["url"] + "/nginx-health") == 200


def test_client_raises_request_errors_without_retrying(cluster) -> None:
    async def main() -> ServiceRequestError:
        async with WebShopClient(cluster["url"], timeout=10) as client:
            with pytest.raises(ServiceRequestError) as caught:
                await client.reset(-1)
            return caught.value

    error = asyncio.run(main())
    assert error.status == 404 and error.error == "unknown_goal" and "out of range" in error.detail


def test_metrics_per_replica(cluster) -> None:
    text = requests.get(cluster["replicas"][0]["url"] + "/metrics", timeout=10).text
    assert 'agentrl_http_requests_total{method="POST",route="/v1/step"' in text
    assert "agentrl_http_request_duration_seconds_bucket" in text
    assert (metric_value(text, "agentrl_env_steps_total", {"env": "webshop", "api": "native"}) or 0) > 0, text
