"""Deviation 11 pinned: what replaying a state token from before a purchase does, and why it cannot hurt a
trainer (docs/deviations.md).

- A step on the token a purchase returned is refused (409 ``episode_finished``): a finished episode stays
  finished.
- Re-sending the step that purchased, with the token from before it, returns the IDENTICAL answer (same
  observation, reward, breakdown and token): exactly what makes a retried step safe after a lost response.
  It is one trajectory's reward computed again, never a second, different reward.
- A different action from an older token is simply another trajectory of the same goal, scored as a fresh
  episode with those actions would be.
- AgentGym sessions hold their state on the server: after the purchase, a further step is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _support import SECRET
from fastapi.testclient import TestClient

from agent_envs.api.app import create_app
from agent_envs.api.settings import Settings


@pytest.fixture(scope="module")
def api(conformance_catalog_dir: Path):
    settings = Settings(catalog=conformance_catalog_dir, state_secret=SECRET, access_log=False)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield client


def test_replaying_the_purchase_is_the_same_answer_and_a_finished_episode_stays_finished(
    api, expert_plans: dict[int, list[str]]
) -> None:
    goal, actions = next(iter(expert_plans.items()))
    page = api.post("/v1/reset", json={"goal": goal}).json()
    for action in actions[:-1]:
        page = api.post("/v1/step", json={"state": page["state"], "action": action}).json()
    before_purchase = page["state"]
    bought = api.post("/v1/step", json={"state": before_purchase, "action": actions[-1]})
    assert bought.status_code == 200 and bought.json()["done"] is True and bought.json()["reward"] == 1.0

    after = api.post("/v1/step", json={"state": bought.json()["state"], "action": "search[anything]"})
    assert after.status_code == 409 and after.json()["error"] == "episode_finished"

    again = api.post("/v1/step", json={"state": before_purchase, "action": actions[-1]})
    assert again.status_code == 200 and again.content == bought.content  # byte for byte: a safe retry

    # another action from the old token: another trajectory of the same goal, scored like a fresh episode
    other = api.post("/v1/step", json={"state": before_purchase, "action": "search[something else]"}).json()
    fresh = api.post("/v1/reset", json={"goal": goal}).json()
    for action in [*actions[:-1], "search[something else]"]:
        fresh = api.post("/v1/step", json={"state": fresh["state"], "action": action}).json()
    assert other == fresh


def test_agentgym_session_cannot_step_after_its_purchase(api, expert_plans: dict[int, list[str]]) -> None:
    goal, actions = next(iter(expert_plans.items()))
    env_idx = api.post("/create").json()
    api.post("/reset", json={"env_idx": env_idx, "session_id": goal})
    for action in actions:
        result = api.post("/step", json={"env_idx": env_idx, "action": action}).json()
    assert result["done"] is True and result["reward"] == 1.0
    replay = api.post("/step", json={"env_idx": env_idx, "action": actions[-1]})
    assert replay.status_code == 409 and replay.json()["error"] == "episode_finished"
