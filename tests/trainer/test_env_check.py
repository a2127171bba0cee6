"""``agent-train env-check`` plays every served environment, through the trainer's own clients (issue 35).

What one node's Ray task does (``env_check._play``), against the real app serving WebShop, TextCraft and BabyAI
in-process (``env_service``: the trainer's clients, routes and signed tokens): expert episodes of each environment
to their end, with the rewards the environments' own cores give the same actions, a task without an expert
(BabyAI) skipped. The environments come from ``--envs`` or ``$AGENTRL_ENVS`` (what ``serve-ray`` serves). The
cluster around it (a Ray task per node, each node's Serve proxy) is exercised by tests/multinode/test_slurm_ray.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agent_trainer import env_check


def expert_reward(env_id: str, task: int, catalog: Path | None = None) -> float:
    """What the environment's own core pays its expert's actions on ``task`` (the trainer's spec of the episode)."""
    from agent_trainer.rehearsal.warm_start import expert_episode, expert_plan, make_core

    core = make_core(env_id, catalog)
    return expert_episode(env_id, task, expert_plan(env_id, task, core=core), core=core)[1]["env_reward"]


def test_a_node_plays_every_served_environment_to_its_end(
    env_service: Any, generated_catalog_dir: Path
) -> None:
    envs = [e for e in ("webshop", "textcraft", "babyai") if e in env_service.state.settings.env_ids()]
    assert "textcraft" in envs
    played = asyncio.run(env_check._play(envs, 2, "synthetic", 5))
    assert sorted(played) == sorted(envs), played
    node = {"node_ip": "n1", "envs": played}
    assert env_check.node_ok(node, envs, 2), played
    for env_id in envs:
        episodes = played[env_id]["episodes"]
        assert len(episodes) == 2, (env_id, played[env_id])
        assert all(e["done"] and e["steps"] >= 1 for e in episodes), (env_id, episodes)
        for episode in episodes:
            assert episode["reward"] == pytest.approx(
                expert_reward(env_id, episode["task"], generated_catalog_dir)
            )
    if "babyai" in envs:  # task 6 has no expert (the bot cannot solve that level from that seed): skipped
        assert [e["task"] for e in played["babyai"]["episodes"]] == [5, 7]
    lines = env_check.summary_lines({"ok": True, "nodes": [node]})
    assert [line.split(":")[1].strip() for line in lines] == envs, lines


def test_an_environment_that_is_not_served_is_reported_and_fails_the_node(env_service: Any) -> None:
    played = asyncio.run(env_check._play(["textcraft", "sciworld"], 1, "synthetic", 0))
    assert len(played["textcraft"]["episodes"]) == 1
    assert "error" in played["sciworld"] and "404" in played["sciworld"]["error"], played["sciworld"]
    assert not env_check.node_ok({"node_ip": "n1", "envs": played}, ["textcraft", "sciworld"], 1)
    assert any(
        "sciworld: " in line
        for line in env_check.summary_lines({"nodes": [{"node_ip": "n1", "envs": played}]})
    )


def test_the_environments_come_from_the_flag_else_what_serve_ray_serves() -> None:
    assert env_check.served_envs({}) == ["webshop"]
    assert env_check.served_envs({"AGENTRL_ENVS": "webshop,textcraft,babyai"}) == [
        "webshop",
        "textcraft",
        "babyai",
    ]
    assert env_check.served_envs({"AGENTRL_ENVS": "webshop"}, "sciworld, textcraft") == [
        "sciworld",
        "textcraft",
    ]
    with pytest.raises(ValueError, match="unknown environment.*minecraft"):
        env_check.served_envs({}, "minecraft")
    report = env_check.run_env_check({"RAY_ADDRESS": "127.0.0.1:9"}, envs="minecraft")
    assert not report["ok"] and "minecraft" in report["error"] and report["nodes"] == []


class StubClient:
    """A client that records what it is asked: WebShop's info names no task pool and its expert answers no
    actions for goal 3 (no way to the product); TextCraft's has 3 tasks."""

    urls = url = "http://stub"

    def __init__(self, env_id: str, calls: list[tuple[str, str, int, dict[str, Any]]]) -> None:
        self.env_id, self.calls = env_id, calls

    async def info(self) -> dict[str, Any]:
        return {} if self.env_id == "webshop" else {"tasks": 3}

    async def expert(self, task: int, **options: Any) -> list[str]:
        self.calls.append(("expert", self.env_id, task, options))
        return [] if (self.env_id, task) == ("webshop", 3) else ["the action"]

    async def reset(self, task: int, **options: Any) -> dict[str, Any]:
        self.calls.append(("reset", self.env_id, task, options))
        return {"state": "s0", "done": False}

    async def step(self, state: str, action: str) -> dict[str, Any]:
        return {"state": "s1", "reward": 1.0, "done": True}


def test_the_goal_set_goes_where_the_environments_reset_takes_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """One route for every environment: the run's goal set goes to the expert and the reset of an environment whose
    spec's reset takes one (WebShop's ``reset_fields``), to no other; a task pool the service names is wrapped
    around, and a task without an expert's actions is skipped."""
    from agent_trainer import interaction

    calls: list[tuple[str, str, int, dict[str, Any]]] = []

    async def nothing(*args: Any) -> None:
        return None

    monkeypatch.setattr(interaction, "shared_client", lambda settings, env_id: StubClient(env_id, calls))
    monkeypatch.setattr(interaction, "ensure_ready", nothing)
    monkeypatch.setattr(interaction, "close_shared_clients", nothing)
    played = asyncio.run(env_check._play(["webshop", "textcraft"], 2, "human", 2))
    assert [e["task"] for e in played["webshop"]["episodes"]] == [2, 4]
    assert [e["task"] for e in played["textcraft"]["episodes"]] == [2, 0]
    human = {"goal_set": "human"}
    assert calls == [("expert", "webshop", 2, human), ("reset", "webshop", 2, human),
                     ("expert", "webshop", 3, human), ("expert", "webshop", 4, human),
                     ("reset", "webshop", 4, human), ("expert", "textcraft", 2, {}), ("reset", "textcraft", 2, {}),
                     ("expert", "textcraft", 0, {}), ("reset", "textcraft", 0, {})]  # fmt: skip
