"""Admission for SciWorld's episodes: the fleet's JVMs (SCIWORLD_REPLICAS x SCIWORLD_MAX_LIVE_JVMS) shared out over
verl's agent-loop workers, the episodes beyond them waiting for a slot instead of evicting each other's simulators."""

from __future__ import annotations

import asyncio

import pytest
import yaml

from agent_trainer import envs, episode
from agent_trainer.config import config_dir


@pytest.fixture(autouse=True)
def fresh_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(episode, "_SLOTS", {})


def _most_at_once(spec: envs.EnvSpec, config: dict, episodes: int) -> int:
    live, most = 0, 0

    async def one() -> None:
        nonlocal live, most
        async with episode.episode_slot(spec, config):
            live += 1
            most = max(most, live)
            await asyncio.sleep(0.01)
            live -= 1

    async def main() -> None:
        await asyncio.gather(*(one() for _ in range(episodes)))

    asyncio.run(main())
    return most


def test_a_worker_keeps_at_most_its_share_of_the_fleets_simulators_live(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """64 SciWorld episodes of a test step over 4 workers with 16 JVMs in the fleet: 4 live per worker at once."""
    monkeypatch.setenv(episode.EPISODE_SLOTS_ENV, "16")
    config = {"actor_rollout_ref": {"rollout": {"agent": {"num_workers": 4}}}}
    assert _most_at_once(envs.get("sciworld"), config, 16) == 4
    assert _most_at_once(envs.get("textcraft"), config, 16) == 16  # no simulator: no limit
    monkeypatch.delenv(episode.EPISODE_SLOTS_ENV)
    monkeypatch.setattr(episode, "_SLOTS", {})
    assert _most_at_once(envs.get("sciworld"), config, 16) == 16  # not set (no fleet to fit): no limit


def test_slots_per_worker_never_round_to_nothing() -> None:
    assert [episode.slots_per_worker(t, w) for t, w in ((16, 4), (4, 8), (0, 2), (17, 4))] == [4, 1, 1, 4]


def test_sciworlds_client_waits_longer_than_the_balancer() -> None:
    """A cold reset or a replay on a fresh JVM takes seconds: the client's attempt (both routes) outlasts nginx's 60 s
    SciWorld read timeout, so the balancer's answer comes first."""
    loops = {entry["name"]: entry for entry in yaml.safe_load((config_dir() / "agent_loop.yaml").read_text())}
    interactions = yaml.safe_load((config_dir() / "interaction.yaml").read_text())["interaction"]
    (sciworld,) = [entry["config"] for entry in interactions if entry["name"] == "sciworld"]
    assert loops["sciworld_agent"]["timeout"] > 60 and sciworld["timeout"] > 60
