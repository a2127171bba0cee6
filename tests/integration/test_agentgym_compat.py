"""AgentGym compatibility against a real replica process, with a client that calls the API exactly the way
``agentenv.envs.webshop.WebshopEnvClient`` does (plain ``requests``; the protocol is in docs/api.md)."""

from __future__ import annotations

import uuid

import pytest
import requests
from _agentgym import AgentGymClient
from _support import COMPAT_CAP, metric_value


def test_agentgym_client_plays_expert_episodes(replica, expert_plans: dict[int, list[str]]) -> None:
    for goal in list(expert_plans)[:3]:
        client = AgentGymClient(replica.url)
        assert isinstance(client.env_id, int)
        first = client.reset(goal)
        assert (
            isinstance(first, list) and first[1] is None and first[0].startswith("WebShop [SEP] Instruction:")
        )
        actions = requests.get(f"{replica.url}/available_actions?env_idx={client.env_id}", timeout=10).json()
        assert actions == {"has_search_bar": True, "clickables": ["search"]}
        instruction = requests.get(
            f"{replica.url}/instruction_text?env_idx={client.env_id}", timeout=10
        ).json()
        assert instruction.startswith("Instruction: ")
        for action in expert_plans[goal]:
            observation, reward, done = client.step(action)
        assert done is True and reward == 1.0 and observation.startswith("Thank you for shopping with us!")
        assert client.close() == {"closed": True}


def test_unknown_env_is_404_json(replica) -> None:
    response = requests.post(f"{replica.url}/step", json={"env_idx": 7, "action": "search[x]"}, timeout=10)
    assert response.status_code == 404 and response.json()["error"] == "unknown_env"
    response = requests.get(f"{replica.url}/observation?env_idx=7", timeout=10)
    assert response.status_code == 404 and response.json()["error"] == "unknown_env"
    assert requests.get(replica.url + "/", timeout=10).json() == "ok"


def test_session_cap_bounds_live_sessions(replica) -> None:
    created = [requests.post(f"{replica.url}/create", timeout=10).json() for _ in range(500)]
    assert len(set(created)) == 500
    live = requests.get(f"{replica.url}/list_envs", timeout=10).json()
    assert len(live) <= COMPAT_CAP
    assert set(created[-COMPAT_CAP:]) <= set(live)  # the newest survive; the oldest idle were evicted
    evicted = requests.get(f"{replica.url}/observation?env_idx={created[0]}", timeout=10)
    assert evicted.status_code == 404 and evicted.json()["error"] == "unknown_env"
    metrics = requests.get(f"{replica.url}/metrics", timeout=10).text
    gauge = metric_value(metrics, "webshop_compat_sessions")
    assert gauge is not None and gauge <= COMPAT_CAP
    assert (metric_value(metrics, "agentrl_compat_evictions_total", {"reason": "cap"}) or 0) >= 450
    assert requests.get(f"{replica.url}/healthz", timeout=10).status_code == 200


def test_compat_through_the_balancer(cluster, expert_plans: dict[int, list[str]]) -> None:
    goal, actions = next(iter(expert_plans.items()))
    client = AgentGymClient(cluster["url"])
    client.reset(goal)
    for action in actions:
        _, reward, done = client.step(action)
    assert done is True and reward == 1.0
    assert client.close() == {"closed": True}


@pytest.mark.parametrize("where", ["replica", "cluster"])  # the memory store; Redis behind the balancer
def test_a_step_retried_with_its_idempotency_key_is_not_applied_twice(
    where: str, request: pytest.FixtureRequest, expert_plans: dict[int, list[str]]
) -> None:
    """Every step is sent twice with one key, as a client does whose answer was lost: the second answer is the
    first one again (the purchase too: reward 1.0, not 409), and the episode is the expert's; a new key after
    the purchase is a new step (409 episode_finished)."""
    server = request.getfixturevalue(where)
    url = server.url if where == "replica" else server["url"]
    goal, actions = next(iter(expert_plans.items()))
    env_idx = requests.post(f"{url}/create", timeout=10).json()
    assert requests.post(f"{url}/reset", json={"env_idx": env_idx, "session_id": goal}, timeout=10).ok
    for action in actions:
        key = {"Idempotency-Key": uuid.uuid4().hex}
        first, again = (
            requests.post(f"{url}/step", json={"env_idx": env_idx, "action": action}, headers=key, timeout=10)
            for _ in range(2)
        )
        assert first.status_code == again.status_code == 200, again.text
        assert again.json() == first.json()
        page = requests.get(f"{url}/observation", params={"env_idx": env_idx}, timeout=10).json()
        assert page == first.json()["state"]
    assert (first.json()["reward"], first.json()["done"]) == (1.0, True)
    after = requests.post(
        f"{url}/step", json={"env_idx": env_idx, "action": actions[-1]},
        headers={"Idempotency-Key": uuid.uuid4().hex}, timeout=10,
    )  # fmt: skip
    assert after.status_code == 409 and after.json()["error"] == "episode_finished"
