"""TextCraft, BabyAI and Sokoban served beside WebShop by real replicas behind a real nginx (one serving layer),
and every environment at once as `make up-local ENVS=webshop,textcraft,babyai,sciworld` starts it.

- AgentGym's own requests (the bodies its TextCraft and BabyAI clients send) replay the recorded traces through
  the balancer at ``<balancer>/<env>``, with sessions in the shared store (Redis);
- the native protocol's episodes survive a replica killed mid-run (the state travels in the signed token);
- WebShop answers the same at ``/webshop`` as at the root;
- bad input gets a clear 4xx, never a 5xx.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import httpx
import pytest
from _support import SECRET, start_cluster

from agent_envs.client import EnvClient, ServiceRequestError
from agent_envs.cluster import http_status
from agent_envs.envs import registry
from agent_envs.envs.agentgym import over_the_request_cap, replay_trace

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "conformance"
ENVS = ("textcraft", "babyai")  # with AgentGym's recorded traces
NATIVE_ENVS = (*ENVS, "sokoban")  # Sokoban: the native protocol only (AgentGym has no server for it)


@pytest.fixture(scope="module")
def envs_cluster(local_cluster, conformance_catalog_dir: Path, tmp_path_factory) -> dict:
    run_dir = tmp_path_factory.mktemp("envs-cluster")
    record = start_cluster(local_cluster, conformance_catalog_dir, run_dir,
                           env={"AGENTRL_ENVS": "webshop,textcraft,babyai,sokoban"})  # fmt: skip
    try:
        yield record
    finally:
        local_cluster.down(run_dir, quiet=True)


def _traces(env_id: str, every: int) -> list[dict]:
    lines = (FIXTURES / f"agentgym-{env_id}" / "traces.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines[::every]]


def _http_send(client: httpx.Client, base: str):
    def send(method: str, route: str, fields: dict | None) -> tuple[int, object]:
        if method == "GET":
            response = client.get(base + route, params=fields or {})
        elif fields is None:
            response = client.post(base + route)  # BabyAI's client posts /create with no body
        else:
            response = client.post(base + route, json=fields)
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, response.text

    return send


@pytest.mark.parametrize("env_id", ENVS)
def test_agentgym_requests_replay_the_traces_through_the_balancer(envs_cluster: dict, env_id: str) -> None:
    """Every 4th recorded episode, request for request, through nginx and both replicas (Redis sessions); a
    recorded action over the 2,048-character request cap gets its 422 (docs/deviations.md)."""
    with httpx.Client(timeout=60) as client:
        send = _http_send(client, f"{envs_cluster['url']}/{env_id}")
        failures = {}
        for episode in _traces(env_id, 4):
            differences = replay_trace(episode, send, over_the_request_cap)
            if differences:
                failures[episode["data_idx"]] = differences[:2]
    assert not failures, failures


async def _expert_episode(client: EnvClient, task: int, actions: list[str], pause: float, on_step) -> dict:
    result = await client.reset(task)
    for action in actions:
        await asyncio.sleep(pause)
        result = await client.step(result["state"], action)
        on_step()
        if result["done"]:
            break
    return result


@pytest.mark.parametrize("env_id", NATIVE_ENVS)
def test_replica_killed_mid_run_loses_no_native_episode(
    local_cluster, conformance_catalog_dir: Path, tmp_path: Path, env_id: str
) -> None:
    """SIGKILL one of two replicas while 32 expert episodes run: every one ends as it does in process."""
    env = registry.make(env_id)
    plans = {}
    for task in range(0, env.task_count(), max(1, env.task_count() // 100)):
        actions = env.expert(task)
        if actions and len(plans) < 32:
            plans[task] = list(actions)
    assert len(plans) == 32
    want = {}
    for task, actions in plans.items():
        result = env.reset(task)
        for action in actions:
            result = env.step(result.state, action)
            if result.done:
                break
        want[task] = (result.reward, result.done, result.observation)
    assert sum(done for _, done, _ in want.values()) >= 24, "the expert should solve most of these tasks"

    record = start_cluster(
        local_cluster, conformance_catalog_dir, tmp_path / "run", env={"AGENTRL_ENVS": env_id}
    )
    try:
        victim, total, steps, killed = (
            record["replicas"][0],
            sum(map(len, plans.values())),
            0,
            asyncio.Event(),
        )

        def on_step() -> None:
            nonlocal steps
            steps += 1
            if steps >= total // 3 and not killed.is_set():
                os.killpg(victim["pid"], signal.SIGKILL)
                killed.set()

        async def main() -> list[dict]:
            async with EnvClient(record["url"], env_id, timeout=30, retries=8, backoff=0.05) as client:
                return await asyncio.gather(
                    *(
                        _expert_episode(client, task, actions, 0.02, on_step)
                        for task, actions in plans.items()
                    )
                )

        finals = asyncio.run(main())
        assert killed.is_set() and http_status(victim["url"] + "/healthz") is None
        got = {
            task: (f["reward"], f["done"], f["observation"]) for task, f in zip(plans, finals, strict=True)
        }
        assert got == want
    finally:
        local_cluster.down(tmp_path / "run", quiet=True)


def test_webshop_is_also_served_under_its_prefix(envs_cluster: dict) -> None:
    with httpx.Client(timeout=30) as client:
        root = client.post(f"{envs_cluster['url']}/v1/reset", json={"goal": 3}).json()
        prefixed = client.post(f"{envs_cluster['url']}/webshop/v1/reset", json={"goal": 3}).json()
        assert root["observation"] == prefixed["observation"] and root["observation"]
        step = client.post(f"{envs_cluster['url']}/webshop/v1/step", json={"state": root["state"],
                                                                          "action": "search[shoes]"})  # fmt: skip
        assert step.status_code == 200
        created = client.post(f"{envs_cluster['url']}/webshop/create")
        assert created.status_code == 200 and isinstance(created.json(), int)


BAD = [
    # (env, method, path, json body, status, kind)
    ("textcraft", "POST", "/v1/reset", {"task": 10**6}, 404, "unknown_task"),
    ("textcraft", "POST", "/v1/reset", {"task": -1}, 422, "validation_error"),
    ("textcraft", "POST", "/v1/reset", {"task": "3"}, 422, "validation_error"),
    ("babyai", "POST", "/v1/step", {"state": "hello", "action": "turn left"}, 400, "invalid_token"),
    ("babyai", "POST", "/v1/step", {"state": "v2.e30.AAAA", "action": "turn left"}, 400, "invalid_token"),
    ("babyai", "POST", "/v1/step", {"action": "turn left"}, 422, "validation_error"),
    (
        "textcraft",
        "POST",
        "/reset",
        {"data_idx": 3},
        422,
        "validation_error",
    ),  # AgentGym route without its id
    ("babyai", "POST", "/step", {"id": "x", "action": "turn left"}, 422, "validation_error"),
    ("babyai", "GET", "/nothing-here", None, 404, "not_found"),
    # the request cap of every route (2,048 characters) on the AgentGym routes too
    ("textcraft", "POST", "/step", {"id": 1, "action": "x" * 2049}, 422, "validation_error"),
    ("babyai", "POST", "/step", {"id": 1, "action": "x" * 2049}, 422, "validation_error"),
    ("webshop", "POST", "/step", {"env_idx": 1, "action": "x" * 2049}, 422, "validation_error"),
    ("sokoban", "POST", "/v1/reset", {"task": 10_000}, 404, "unknown_task"),
    ("sokoban", "GET", "/v1/tasks/10000/expert", None, 404, "unknown_task"),
    ("sokoban", "POST", "/v1/step", {"state": "hello", "action": "Up"}, 400, "invalid_token"),
    ("sokoban", "POST", "/v1/step", {"state": "v2.e30.AAAA", "action": "Up" * 1025}, 422, "validation_error"),
    ("sokoban", "POST", "/create", {}, 404, "not_found"),  # no AgentGym routes: none routed, none served
]


@pytest.mark.parametrize(("env_id", "method", "path", "body", "status", "kind"), BAD)
def test_bad_input_gets_a_clear_4xx(envs_cluster: dict, env_id, method, path, body, status, kind) -> None:
    with httpx.Client(timeout=30) as client:
        response = client.request(method, f"{envs_cluster['url']}/{env_id}{path}", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"] == kind


def test_a_token_of_one_environment_is_refused_by_another(envs_cluster: dict) -> None:
    async def main() -> ServiceRequestError:
        async with EnvClient(envs_cluster["url"], "textcraft") as textcraft, \
                EnvClient(envs_cluster["url"], "babyai") as babyai:  # fmt: skip
            state = (await textcraft.reset(5))["state"]
            with pytest.raises(ServiceRequestError) as caught:
                await babyai.step(state, "turn left")
            return caught.value

    error = asyncio.run(main())
    assert error.status == 400 and error.error == "invalid_token"
    assert "another babyai data set" in error.detail or "signature" in error.detail


ALL_ENVS = "webshop,textcraft,babyai,sciworld"


@pytest.mark.slow
def test_every_environment_served_by_one_cluster(
    local_cluster, conformance_catalog_dir: Path, tmp_path: Path
) -> None:
    """`make up-local ENVS=webshop,textcraft,babyai,sciworld` as the Makefile runs it (2 workers per replica):
    SciWorld gets replicas of its own (one worker each: its JVMs live in one process, and the balancer's affinity is
    per replica) behind the sticky upstream, the others share theirs; each environment plays an episode through
    the balancer, SciWorld's by AgentGym's requests and natively, both exactly as recorded."""
    from agent_envs.envs.sciworld import python_index
    from agent_envs.envs.sciworld.agentgym import documented_difference

    run_dir = tmp_path / "run"
    record = local_cluster.up(
        replicas=2, catalog=conformance_catalog_dir, base_port=0, port=0, workers=2, run_dir=run_dir, timeout=120,
        env={"AGENTRL_STATE_SECRET": SECRET, "AGENTRL_ENVS": ALL_ENVS, "SCIWORLD_SPARE_JVMS": "1"}, quiet=True,
    )  # fmt: skip
    try:
        others = "webshop,textcraft,babyai"
        assert [(r["name"], r["envs"]) for r in record["replicas"]] == [
            ("replica-1", others), ("replica-2", others), ("sciworld-1", "sciworld"), ("sciworld-2", "sciworld"),
        ]  # fmt: skip
        conf = (run_dir / "nginx" / "nginx.conf").read_text()
        sticky = conf.split("upstream affinity_replicas {", 1)[1].split("}", 1)[0]
        every = conf.split("upstream env_replicas {", 1)[1].split("}", 1)[0]
        for replica in record["replicas"]:
            address = f"127.0.0.1:{replica['port']} "
            assert (address in sticky, address in every) == (
                (True, False) if replica["envs"] == "sciworld" else (False, True)
            ), replica
        assert "java" not in " ".join(
            local_cluster._cmdline(pid)
            for r in record["replicas"][:2]
            for pid in local_cluster._group_members(r["pid"])
        ), "the replicas of the other environments start no JVM"

        async def native() -> dict[str, dict]:
            finals = {}
            for env_id in ("textcraft", "babyai"):
                async with EnvClient(record["url"], env_id, timeout=60) as client:
                    result = await client.reset(3)
                    for action in await client.expert(3):
                        result = await client.step(result["state"], action)
                        if result["done"]:
                            break
                    finals[env_id] = result
            return finals

        finals = asyncio.run(native())
        assert all(f["done"] and f["reward"] > 0 for f in finals.values()), finals
        with httpx.Client(timeout=120) as client:
            reset = client.post(f"{record['url']}/v1/reset", json={"goal": 3})
            assert reset.status_code == 200 and reset.json()["observation"]
            step = client.post(f"{record['url']}/v1/step", json={"state": reset.json()["state"],
                                                                  "action": "search[shoes]"})  # fmt: skip
            assert step.status_code == 200
            episode = next(e for e in _traces("sciworld", 1) if e["data_idx"] == 4433)  # gold, 2 steps
            send = _http_send(client, f"{record['url']}/sciworld")
            assert replay_trace(episode, send, documented_difference) == []
        steps = [s for s in episode["steps"] if "observation" in s["response"]]

        async def sciworld() -> list[dict]:
            async with EnvClient(record["url"], "sciworld", timeout=120) as client:
                result, answers = await client.reset(python_index(episode["data_idx"])), []
                for step in steps:
                    result = await client.step(result["state"], step["action"])
                    answers.append(result)
                return answers

        got = [(a["observation"], a["info"]["score"], a["done"]) for a in asyncio.run(sciworld())]
        assert got == [
            (s["response"]["observation"], s["response"]["score"], s["response"]["done"]) for s in steps
        ]
    finally:
        local_cluster.down(run_dir, quiet=True)


@pytest.mark.parametrize("env_id", ["textcraft", "babyai", "sciworld"])
@pytest.mark.parametrize(("data_idx", "error"), [(10**30, "data_idx must be at most 9223372036854775807"),
                                                 (-(10**30), "data_idx must be at least -9223372036854775808")])  # fmt: skip
def test_a_data_idx_out_of_range_is_answered_one_way(
    envs_cluster: dict, env_id: str, data_idx: int, error: str
) -> None:
    """Beyond a signed 64-bit integer, every environment answers a reset alike, in AgentGym's own error shape
    (HTTP 200, ``{"error"}``; AgentGym's servers: TextCraft took it modulo, BabyAI's gymnasium refused the seed,
    SciWorld's list index failed). SciWorld in process (its JVMs are test-all's), through the same check."""
    if env_id == "sciworld":
        from agent_envs.envs.agentgym import InProcessAgentGym
        from agent_envs.envs.sciworld import AGENTGYM_ROUTES, JvmPool, SciWorldEnv

        gym = InProcessAgentGym(SciWorldEnv(JvmPool(spares=0)), AGENTGYM_ROUTES)
        sid = gym.call("POST", "/create")[1]["id"]
        assert gym.call("POST", "/reset", {"id": sid, "data_idx": data_idx}) == (200, {"error": error})
        return
    with httpx.Client(timeout=30) as client:
        base = f"{envs_cluster['url']}/{env_id}"
        created = client.post(base + "/create", json={}).json()
        answer = client.post(base + "/reset", json={"id": created["id"], "data_idx": data_idx})
    assert (answer.status_code, answer.json()) == (200, {"error": error})


def test_sciworld_close_of_an_unknown_or_closed_id_answers_false_like_the_others(envs_cluster: dict) -> None:
    from agent_envs.envs.agentgym import InProcessAgentGym
    from agent_envs.envs.sciworld import AGENTGYM_ROUTES, JvmPool, SciWorldEnv

    gym = InProcessAgentGym(SciWorldEnv(JvmPool(spares=0)), AGENTGYM_ROUTES)
    sid = gym.call("POST", "/create")[1]["id"]
    assert gym.call("POST", "/close", {"id": sid}) == (200, True)
    assert gym.call("POST", "/close", {"id": sid}) == (200, False)
    assert gym.call("POST", "/close", {"id": 10**6}) == (200, False)
    with httpx.Client(timeout=30) as client:  # TextCraft and BabyAI over HTTP: the same answers
        for env_id in ("textcraft", "babyai"):
            closed = client.post(f"{envs_cluster['url']}/{env_id}/close", json={"id": 10**6})
            assert (closed.status_code, closed.json()) == (200, False)
