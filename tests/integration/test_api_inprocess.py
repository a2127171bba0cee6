"""The HTTP API in-process (FastAPI TestClient) over the conformance catalog: shapes, tokens, errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _support import SECRET, json_of, metric_value
from fastapi.testclient import TestClient

from agent_envs.api.app import create_app
from agent_envs.api.settings import Settings, SettingsError
from agent_envs.envs.webshop.core.env import EpisodeState
from agent_envs.envs.webshop.http import token_codec


def make_client(catalog: Path, **overrides) -> TestClient:
    settings = Settings(catalog=catalog, state_secret=SECRET, access_log=False, **overrides)
    return TestClient(create_app(settings), raise_server_exceptions=False)


@pytest.fixture(scope="module")
def api(conformance_catalog_dir: Path) -> Iterator[TestClient]:
    with make_client(conformance_catalog_dir) as client:
        yield client


def play(api: TestClient, goal: int, actions: list[str]) -> dict:
    page = json_of(api.post("/v1/reset", json={"goal": goal}))
    for action in actions:
        response = api.post("/v1/step", json={"state": page["state"], "action": action})
        assert response.status_code == 200, response.text
        page = response.json()
        if page["done"]:
            break
    return page


def assert_error(response, status: int, kind: str) -> dict:
    body = json_of(response)
    assert response.status_code == status, body
    assert set(body) == {"error", "detail"} and body["error"] == kind, body
    assert body["detail"]
    return body


# ---- native protocol -------------------------------------------------------------------------------------
def test_reset_shape(api: TestClient) -> None:
    body = json_of(api.post("/v1/reset", json={"goal": 3}))
    assert set(body) == {"observation", "instruction", "available_actions", "state", "info"}
    assert body["observation"].startswith("WebShop [SEP] Instruction: [SEP] ")
    assert body["instruction"] in body["observation"]
    assert body["available_actions"] == {"has_search_bar": True, "clickables": ["search"]}
    assert body["state"].startswith("v2.")
    assert body["info"]["steps"] == 0


def test_expert_episode_reaches_reward_one(api: TestClient, expert_plans: dict[int, list[str]]) -> None:
    for goal in list(expert_plans)[:5]:
        served = json_of(api.get(f"/v1/goals/{goal}/expert"))
        assert served == {"goal": goal, "goal_set": "synthetic", "actions": expert_plans[goal]}
        final = play(api, goal, served["actions"])
        assert final["done"] is True and final["reward"] == 1.0
        assert final["info"]["valid"] is True and final["info"]["truncated"] is False
        assert final["info"]["reward_info"]["r_type"] == 1.0
        assert final["info"]["steps"] == len(served["actions"])


def test_step_is_idempotent(api: TestClient) -> None:
    state = json_of(api.post("/v1/reset", json={"goal": 5}))["state"]
    first = api.post("/v1/step", json={"state": state, "action": "search[long lasting sofa]"}).json()
    again = api.post("/v1/step", json={"state": state, "action": "search[long lasting sofa]"}).json()
    assert first == again
    assert first["info"] == {"valid": True, "steps": 1, "truncated": False}


def test_invalid_action_is_a_noop_step(api: TestClient) -> None:
    page = json_of(api.post("/v1/reset", json={"goal": 5}))
    step = json_of(api.post("/v1/step", json={"state": page["state"], "action": "click[nothing here]"}))
    assert step["observation"] == page["observation"] and step["reward"] == 0.0 and step["done"] is False
    assert step["info"] == {"valid": False, "steps": 1, "truncated": False}


def test_step_after_purchase_is_409(api: TestClient, expert_plans: dict[int, list[str]]) -> None:
    goal, actions = next(iter(expert_plans.items()))
    final = play(api, goal, actions)
    assert_error(
        api.post("/v1/step", json={"state": final["state"], "action": "search[x]"}), 409, "episode_finished"
    )


def test_step_batch(api: TestClient, expert_plans: dict[int, list[str]]) -> None:
    goals = list(expert_plans)[:3]
    states = [json_of(api.post("/v1/reset", json={"goal": g}))["state"] for g in goals]
    items = [{"state": s, "action": expert_plans[g][0]} for g, s in zip(goals, states, strict=True)]
    items.append({"state": "v1.garbage.garbage", "action": "search[x]"})
    results = json_of(api.post("/v1/step_batch", json={"steps": items}))["results"]
    assert len(results) == 4
    for result, item in zip(results[:3], items, strict=False):
        single = json_of(api.post("/v1/step", json=item))
        assert result == single
    assert results[3]["error"] == "invalid_token" and results[3]["status"] == 400


def test_step_batch_too_large(conformance_catalog_dir: Path) -> None:
    with make_client(conformance_catalog_dir, max_batch=2) as api:
        state = api.post("/v1/reset", json={"goal": 1}).json()["state"]
        body = {"steps": [{"state": state, "action": "search[a]"}] * 3}
        assert_error(api.post("/v1/step_batch", json=body), 422, "batch_too_large")


def test_truncation_at_max_steps(conformance_catalog_dir: Path) -> None:
    with make_client(conformance_catalog_dir, max_steps=3) as api:
        page = api.post("/v1/reset", json={"goal": 1}).json()
        for number in range(1, 4):
            page = json_of(api.post("/v1/step", json={"state": page["state"], "action": "search[sofa]"}))
            assert page["done"] is (number == 3)
            assert page["info"]["truncated"] is (number == 3)
        assert page["reward"] == 0.0
        body = assert_error(api.post("/v1/step", json={"state": page["state"], "action": "search[x]"}), 409,
                            "episode_finished")  # fmt: skip
        assert "step limit of 3" in body["detail"]


def test_goals_and_splits(api: TestClient) -> None:
    summary = json_of(api.get("/v1/goals"))
    synthetic = summary["goal_sets"]["synthetic"]
    assert summary["default_goal_set"] == "synthetic"
    assert synthetic["count"] == 1153
    assert synthetic["splits"]["test"] == {"start": 0, "stop": 500, "count": 500}
    assert synthetic["splits"]["eval"] == {"start": 500, "stop": 1153, "count": 653}
    only = json_of(api.get("/v1/goals", params={"goal_set": "human", "split": "test"}))
    assert only["goal_sets"] == {
        "human": {"count": 100, "splits": {"test": {"start": 0, "stop": 100, "count": 100}}}
    }
    assert json_of(api.post("/v1/reset", json={"goal": 600, "split": "eval"}))["info"]["goal"] == 600
    body = assert_error(api.post("/v1/reset", json={"goal": 3, "split": "eval"}), 404, "goal_not_in_split")
    assert "500..1152" in body["detail"]
    assert_error(api.get("/v1/goals", params={"split": "validation"}), 422, "validation_error")
    assert_error(api.get("/v1/goals", params={"goal_set": "nope"}), 404, "unknown_goal")


def test_human_goal_set(api: TestClient) -> None:
    body = json_of(api.post("/v1/reset", json={"goal": 7, "goal_set": "human"}))
    assert body["info"]["goal_set"] == "human"
    assert_error(api.post("/v1/reset", json={"goal": 100, "goal_set": "human"}), 404, "unknown_goal")


def test_info_and_ops(api: TestClient, conformance_catalog) -> None:
    info = json_of(api.get("/v1/info"))
    assert info["fingerprint"] == conformance_catalog.fingerprint
    assert info["products"] == 300 and info["goal_sets"] == {"synthetic": 1153, "human": 100}
    assert api.get("/healthz").json() == {"status": "ok"}
    assert api.get("/readyz").json()["fingerprint"] == conformance_catalog.fingerprint
    assert "/v1/step" in api.get("/openapi.json").json()["paths"]
    metrics = api.get("/metrics").text
    assert "agentrl_http_requests_total" in metrics and "webshop_compat_sessions" in metrics


def test_not_ready_without_catalog(conformance_catalog_dir: Path) -> None:
    client = make_client(conformance_catalog_dir)  # no `with`: the lifespan (catalog opening) never runs
    assert client.get("/healthz").status_code == 200
    assert_error(client.get("/readyz"), 503, "not_ready")
    assert_error(client.post("/v1/reset", json={"goal": 1}), 503, "not_ready")


def test_missing_catalog_fails_at_startup(tmp_path: Path) -> None:
    from agent_envs.envs.webshop.catalog.store import CatalogError

    with pytest.raises(CatalogError, match="not a prepared catalog"), make_client(tmp_path):
        pass


def test_secret_policy(conformance_catalog_dir: Path) -> None:
    with pytest.raises(SettingsError, match="AGENTRL_STATE_SECRET is not set"):
        create_app(Settings(catalog=conformance_catalog_dir))
    with pytest.raises(SettingsError, match="too short"):
        create_app(Settings(catalog=conformance_catalog_dir, state_secret="short"))
    for weak in (" " * 16, "a" * 64, "abcdefghabcdefgh", "0123012301230123012301230123"):
        with pytest.raises(SettingsError, match="too predictable.*secrets.token_urlsafe"):
            create_app(Settings(catalog=conformance_catalog_dir, state_secret=weak))
    ephemeral = Settings(catalog=conformance_catalog_dir, allow_ephemeral_secret=True, access_log=False)
    with TestClient(create_app(ephemeral)) as api:
        state = api.post("/v1/reset", json={"goal": 1}).json()["state"]
        assert api.post("/v1/step", json={"state": state, "action": "search[a]"}).status_code == 200


# ---- tokens ----------------------------------------------------------------------------------------------
def _reset_state(api: TestClient) -> str:
    return api.post("/v1/reset", json={"goal": 2}).json()["state"]


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda t: t[:-2] + ("AA" if not t.endswith("AA") else "BB"), id="mac"),
        pytest.param(
            lambda t: t.split(".")[0] + "." + t.split(".")[1][:-3] + "xyz." + t.split(".")[2], id="payload"
        ),
        pytest.param(lambda t: "v9" + t[2:], id="version"),
        pytest.param(lambda t: t.replace(".", "", 1), id="parts"),
        pytest.param(lambda t: "", id="empty"),
        pytest.param(lambda t: "garbage", id="garbage"),
        pytest.param(lambda t: "v1.!!!.###", id="not-base64"),
        pytest.param(lambda t: "v1.é.é", id="non-ascii"),
        pytest.param(lambda t: t + "." + t, id="doubled"),
    ],
)
def test_bad_tokens_are_400(api: TestClient, mutate) -> None:
    bad = mutate(_reset_state(api))
    assert_error(api.post("/v1/step", json={"state": bad, "action": "search[a]"}), 400, "invalid_token")


def test_token_from_another_secret(api: TestClient, conformance_catalog) -> None:
    foreign = token_codec(b"another-secret-of-some-length", conformance_catalog.fingerprint)
    token = foreign.encode(EpisodeState(goal_set="synthetic", goal=1))
    body = assert_error(
        api.post("/v1/step", json={"state": token, "action": "search[a]"}), 400, "invalid_token"
    )
    assert "AGENTRL_STATE_SECRET" in body["detail"]


def test_token_from_another_catalog(api: TestClient) -> None:
    foreign = token_codec(SECRET.encode(), "0123456789abcdef")
    token = foreign.encode(EpisodeState(goal_set="synthetic", goal=1))
    body = assert_error(
        api.post("/v1/step", json={"state": token, "action": "search[a]"}), 400, "invalid_token"
    )
    assert "another catalog" in body["detail"]


def test_signed_but_impossible_state(api: TestClient, conformance_catalog) -> None:
    codec = token_codec(SECRET.encode(), conformance_catalog.fingerprint)
    token = codec.encode(EpisodeState(goal_set="synthetic", goal=99999))
    assert_error(api.post("/v1/step", json={"state": token, "action": "search[a]"}), 404, "unknown_goal")


# ---- bad input -------------------------------------------------------------------------------------------
def test_bad_input_is_4xx_json(api: TestClient) -> None:
    json_headers = {"content-type": "application/json"}
    assert_error(api.post("/v1/step", content=b"{not json", headers=json_headers), 400, "malformed_json")
    assert_error(api.post("/v1/step", content=b'{"state": "x", "action": "\xff"}', headers=json_headers), 400,
                 "malformed_json")  # fmt: skip
    assert_error(api.post("/v1/step", content=b'{"state": "x", "action": "\\udc80"}', headers=json_headers), 422,
                 "validation_error")  # fmt: skip
    assert_error(api.post("/v1/step", json={"state": "x"}), 422, "validation_error")
    assert_error(api.post("/v1/step", json=[1, 2]), 422, "validation_error")
    assert_error(api.post("/v1/step", content=b"", headers=json_headers), 422, "validation_error")
    assert_error(api.post("/v1/reset", json={"goal": "three"}), 422, "validation_error")
    assert_error(api.post("/v1/reset", json={"goal": True}), 422, "validation_error")
    assert_error(api.post("/v1/step", json={"state": "x", "action": "search[" + "a" * 3000 + "]"}), 422,
                 "validation_error")  # fmt: skip
    assert_error(api.post("/v1/reset", json={"goal": -1}), 404, "unknown_goal")
    assert_error(api.post("/v1/reset", json={"goal": 10**30}), 404, "unknown_goal")
    assert_error(api.post("/v1/reset", json={"goal": 1, "goal_set": "nope"}), 404, "unknown_goal")
    assert_error(api.get("/v1/goals/-5/expert"), 404, "unknown_goal")
    assert_error(api.post("/v1/reset", json={"goal": 1, "pad": "x" * 70_000}), 413, "body_too_large")
    assert_error(api.get("/nope"), 404, "not_found")
    assert_error(api.get("/v1/step"), 405, "method_not_allowed")
    assert api.get("/healthz").status_code == 200


def test_chunked_body_over_limit_is_413(api: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(20):
            yield b" " * 4096

    response = api.post("/v1/reset", content=chunks(), headers={"content-type": "application/json"})
    assert_error(response, 413, "body_too_large")
    small = api.post(
        "/v1/reset", content=iter([b'{"goal":', b" 4}"]), headers={"content-type": "application/json"}
    )
    assert small.status_code == 200, small.text


def test_errors_are_counted(api: TestClient) -> None:
    api.post("/v1/reset", json={"goal": -1})
    text = api.get("/metrics").text
    assert 'agentrl_errors_total{kind="unknown_goal"}' in text


def test_the_metrics_old_names_count_what_the_new_ones_do_for_a_release(api: TestClient) -> None:
    """The serving layer's metrics are named for every environment (``agentrl_*``); the names they had while WebShop
    was the one environment (``webshop_http_requests_total``, ...) are exported with the same values for one
    release, so a dashboard keeps working while it moves."""
    from agent_envs.api.metrics import OLD_NAMES

    state = json_of(api.post("/v1/reset", json={"goal": 3}))["state"]
    json_of(api.post("/v1/step", json={"state": state, "action": "search[red shoes]"}))
    api.post("/v1/reset", json={"goal": -1})
    text = api.get("/metrics").text

    def series(name: str) -> dict[str, str]:
        """The metric's samples by suffix and labels (not their ``_created`` times, which differ by microseconds)."""
        return {line.split(" ")[0].removeprefix(name): line.split(" ")[1] for line in text.splitlines()
                if line.startswith((name + "{", name + "_")) and not line.startswith(name + "_created")}  # fmt: skip

    for new, old in OLD_NAMES.items():
        if new == "agentrl_env_steps_total":  # WebShop's steps had a name of their own, the others' this one
            continue
        assert series(new) == series(old), (new, old)
    assert series("agentrl_http_requests_total"), text
    # (the app is the module's: earlier tests stepped too)
    steps = metric_value(text, "agentrl_env_steps_total", {"env": "webshop", "api": "native"})
    assert (
        steps and steps >= 1.0 and metric_value(text, "webshop_env_steps_total", {"api": "native"}) == steps
    )


# ---- AgentGym endpoints in-process (the real-client test runs against a replica process) ----------------
def test_compat_round_trip(api: TestClient, expert_plans: dict[int, list[str]]) -> None:
    goal, actions = next(iter(expert_plans.items()))
    env_idx = api.post("/create").json()
    assert isinstance(env_idx, int) and env_idx in api.get("/list_envs").json()
    observation, extra = api.post("/reset", json={"env_idx": env_idx, "session_id": goal}).json()
    assert extra is None and observation.startswith("WebShop [SEP] Instruction:")
    assert api.get("/observation", params={"env_idx": env_idx}).json() == observation
    instruction = api.get("/instruction_text", params={"env_idx": env_idx}).json()
    assert instruction.startswith("Instruction: ") and instruction[len("Instruction: ") :] in observation
    for action in actions:
        result = api.post("/step", json={"env_idx": env_idx, "action": action}).json()
        assert set(result) == {"state", "reward", "done", "info"} and result["info"] is None
    assert result["done"] is True and result["reward"] == 1.0
    assert_error(api.post("/step", json={"env_idx": env_idx, "action": "search[x]"}), 409, "episode_finished")
    assert api.post("/close", json={"env_idx": env_idx}).json() == {"closed": True}
    assert api.post("/close", json={"env_idx": env_idx}).json() == {"closed": False}
    # strict types, as the schema says: no booleans, strings or floats for ids; env_idx in the POST body
    for bad in ({"env_idx": False, "action": "x"}, {"env_idx": "1", "action": "x"}, {"env_idx": 1.5, "action": "x"},
                {"env_idx": None, "action": "x"}, {"action": "x"}):  # fmt: skip
        assert_error(api.post("/step", json=bad), 422, "validation_error")
    assert_error(api.post("/reset", json={"env_idx": env_idx, "session_id": True}), 422, "validation_error")
    assert_error(api.get("/observation", params={"env_idx": "true"}), 422, "validation_error")
    assert_error(api.get("/observation", params={"env_idx": env_idx}), 404, "unknown_env")
    assert_error(api.post("/reset", json={"session_id": 1}), 422, "validation_error")
    other = api.post("/create").json()
    assert_error(api.post("/reset", json={"env_idx": other, "session_id": 10**6}), 404, "unknown_goal")
    assert_error(api.post("/reset", json={"env_idx": other, "session_id": -1}), 404, "unknown_goal")
    observation, _ = api.post("/reset", json={"env_idx": other}).json()  # a random goal
    assert observation.startswith("WebShop [SEP]")
    assert api.get("/").json() == "ok"
