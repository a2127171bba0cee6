"""WebshopInteraction against the env API in-process: episodes, invalid replies, state lifetime, config."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip(
    "verl", reason="the trainer package needs verl: pip install -c constraints.txt -e services/trainer"
)

from agent_envs.client import ServiceRequestError, ServiceUnavailable
from agent_trainer.config import InteractionSettings
from agent_trainer.envs.webshop import parse_goal, prompts
from agent_trainer.episode import TurnScore
from agent_trainer.interaction import EPISODES, EpisodeRegistry, WebshopInteraction, close_shared_clients

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    async def main() -> T:
        try:
            return await coroutine
        finally:
            await close_shared_clients()

    return asyncio.run(main())


def make(**config: Any) -> WebshopInteraction:
    return WebshopInteraction(
        {"name": "webshop", "env_url": "http://webshop.test", "ready_timeout": 5, **config}
    )


def reply(text: str) -> list[dict[str, str]]:
    """The conversation so far as verl passes it, without the row's first user turn (which the interaction checks
    against the environment's: test_a_row_whose_first_turn_is_another_tasks_is_refused)."""
    return [
        {"role": "system", "content": "s"},
        {"role": "assistant", "content": text},
    ]


def test_expert_episode_earns_one_and_frees_its_state(in_process_env, expert_plans_generated) -> None:
    goal, plan = next(iter(expert_plans_generated.items()))

    async def episode() -> list[tuple[bool, str, float, dict]]:
        interaction = make()
        instance = await interaction.start_interaction("traj-1", name="webshop", goal=goal, goal_set="synthetic",
                                                       split="train")  # fmt: skip
        assert instance == "traj-1" and "traj-1" in EPISODES
        results = []
        for action in plan:
            results.append(
                await interaction.generate_response(instance, reply(f"Thinking...\nAction: {action}"))
            )
        return results

    results = run(episode())
    assert [done for done, *_ in results] == [False] * (len(plan) - 1) + [True]
    done, message, score, metrics = results[-1]
    assert isinstance(score, TurnScore) and score == 1.0 and score.done and score.env_reward == 1.0
    assert score.purchased and score.stepped
    assert message == prompts.EPISODE_DONE_MESSAGE
    assert metrics["steps"] == len(plan) and metrics["invalid_actions"] == 0
    first_message = results[0][1]
    assert first_message.startswith("Page: ") and "Available actions: " in first_message
    assert len(EPISODES) == 0


def test_unparseable_reply_gets_a_corrective_message_counts_as_a_step_and_can_be_penalised(
    in_process_env,
) -> None:
    async def turns() -> tuple[tuple, tuple]:
        interaction = make(invalid_action_penalty=0.25)
        await interaction.start_interaction("t", name="webshop", goal=1500)
        first = await interaction.generate_response("t", reply("I am not sure what to buy."))
        second = await interaction.generate_response("t", reply("Action: search[herbal tea]"))
        return first, second

    (done, message, score, metrics), (done2, message2, score2, metrics2) = run(turns())
    assert not done and message.startswith(prompts.INVALID_REPLY_MESSAGE)
    assert "search[<keywords>]" in message  # the page and its actions are shown again
    assert score == -0.25 and score.invalid and metrics["steps"] == 1 and metrics["action"] is None
    assert not done2 and score2 == 0.0 and not score2.invalid and metrics2["steps"] == 2
    assert metrics2["invalid_actions"] == 1


def test_unavailable_click_is_an_invalid_step_without_penalty(in_process_env) -> None:
    async def turn() -> tuple:
        interaction = make(invalid_action_penalty=0.5)
        await interaction.start_interaction("t", name="webshop", goal=1500)
        return await interaction.generate_response("t", reply("Action: click[buy now]"))

    done, message, score, metrics = run(turn())
    assert not done and "click[buy now] is not available" in message
    assert score == 0.0 and score.invalid and metrics["valid"] is False


def test_refused_state_ends_the_trajectory_with_zero(in_process_env) -> None:
    async def turn() -> tuple:
        interaction = make()
        await interaction.start_interaction("t", name="webshop", goal=1500)
        EPISODES.get("t").state = "forged-token"  # type: ignore[union-attr]
        return await interaction.generate_response("t", reply("Action: search[tea]"))

    done, message, score, metrics = run(turn())
    assert done and score == 0.0 and "env_error" in metrics and "ended the episode" in message
    assert not score.purchased and not score.stepped
    assert len(EPISODES) == 0


def test_refused_state_raises_when_configured(in_process_env) -> None:
    async def turn() -> None:
        interaction = make(on_env_error="raise")
        await interaction.start_interaction("t", name="webshop", goal=1500)
        EPISODES.get("t").state = "forged-token"  # type: ignore[union-attr]
        await interaction.generate_response("t", reply("Action: search[tea]"))

    with pytest.raises(ServiceRequestError):
        run(turn())
    assert len(EPISODES) == 0


def test_goal_outside_the_split_is_refused_at_start(in_process_env) -> None:
    with pytest.raises(ServiceRequestError, match="goal_not_in_split"):
        run(make().start_interaction("t", name="webshop", goal=3, split="train"))
    assert len(EPISODES) == 0


def test_state_is_freed_when_verl_drops_the_interaction(in_process_env) -> None:
    """ToolAgentLoop 0.7.1 never finalizes: a trajectory stopped by a turn limit ends with its loop object."""

    async def start() -> None:
        interaction = make()
        await interaction.start_interaction("a", name="webshop", goal=1500)
        await interaction.start_interaction("b", name="webshop", session_id="webshop_1501")
        assert len(EPISODES) == 2

    run(start())
    gc.collect()
    assert len(EPISODES) == 0


def test_finalize_interaction_frees_one_or_all(in_process_env) -> None:
    async def main() -> tuple[int, int]:
        interaction = make()
        for name in ("a", "b", "c"):
            await interaction.start_interaction(name, name="webshop", goal=1500)
        await interaction.finalize_interaction("a")
        after_one = len(EPISODES)
        await interaction.finalize_interaction()
        return after_one, len(EPISODES)

    assert run(main()) == (2, 0)


def test_expired_episode_terminates_gracefully(in_process_env) -> None:
    async def main() -> tuple:
        interaction = make(state_ttl_s=60)
        await interaction.start_interaction("t", name="webshop", goal=1500)
        assert EPISODES.sweep(60, now=time.monotonic() + 61, force=True) == 1
        return await interaction.generate_response("t", reply("Action: search[tea]"))

    done, _, score, metrics = run(main())
    assert done and score == 0.0 and metrics == {"expired": True}
    assert not score.purchased and not score.stepped


def test_registry_ttl_sweep() -> None:
    registry = EpisodeRegistry(sweep_interval=10)
    from agent_trainer.episode import Episode

    registry.put("old", Episode(state="s", goal=1, goal_set=None, split=None))
    registry.put("new", Episode(state="s", goal=2, goal_set=None, split=None))
    registry._episodes["old"].last_used -= 100
    assert registry.sweep(50, force=True) == 1
    assert registry.ids() == ["new"] and registry.expired == 1 and registry.peak == 2
    assert registry.sweep(50) == 0  # rate-limited: the forced sweep just ran


def test_unreachable_service_fails_fast_with_a_clear_message() -> None:
    interaction = WebshopInteraction({"env_url": "http://127.0.0.1:9", "ready_timeout": 0.3, "retries": 0})
    with pytest.raises(ServiceUnavailable, match="not ready within"):
        run(interaction.start_interaction("t", name="webshop", goal=1))
    assert "t" not in EPISODES


def test_construction_is_cheap_and_shares_one_client_per_loop(in_process_env) -> None:
    from agent_trainer.interaction import shared_client

    async def main() -> bool:
        first, second = make(), make()
        return shared_client(first.settings) is shared_client(second.settings)

    assert run(main())


def test_repository_config_gives_the_client_a_retry_budget_not_an_attempt_cap(in_process_env) -> None:
    """Training must ride out an env outage of minutes: the shared client retries for a budget (900 s)."""
    from omegaconf import OmegaConf

    from agent_trainer.interaction import shared_client

    loaded = OmegaConf.load(REPO / "configs" / "interaction.yaml")
    config = OmegaConf.to_container(loaded, resolve=True)["interaction"][0]["config"]
    config["env_url"] = "http://127.0.0.1:9"
    settings = InteractionSettings.from_config(config)

    async def main():
        return shared_client(settings)

    client = run(main())
    assert client.retries is None
    assert client.retry_budget == settings.retry_budget_s == 900


def test_settings_reject_unknown_keys_and_bad_values() -> None:
    with pytest.raises(ValueError, match="unknown WebshopInteraction setting.*timout"):
        InteractionSettings.from_config({"name": "webshop", "timout": 3})
    with pytest.raises(ValueError, match="on_env_error"):
        InteractionSettings.from_config({"on_env_error": "ignore"})
    settings = InteractionSettings.from_config({"name": "webshop", "env_url": None})
    assert settings.env_url.startswith("http")


def test_parse_goal_accepts_aliases() -> None:
    assert parse_goal({"goal": 12}) == 12
    assert parse_goal({"session_id": "webshop_34"}) == 34
    assert parse_goal({"goal_id": "56"}) == 56
    with pytest.raises(ValueError, match="no goal"):
        parse_goal({"name": "webshop"})
    with pytest.raises(ValueError, match="not a goal index"):
        parse_goal({"goal": "shoes"})


def test_verl_builds_it_from_the_repository_interaction_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """verl 0.7.1's own registry reads configs/interaction.yaml (interaction: name/class_name/config)."""
    from verl.interactions.utils.interaction_registry import initialize_interactions_from_config

    monkeypatch.setenv("AGENTRL_URL", "http://10.0.0.1:1234")
    interactions = initialize_interactions_from_config(str(REPO / "configs" / "interaction.yaml"))
    from agent_envs.envs import registry

    assert list(interactions) == [r.id for r in registry.BUILTIN]  # one entry per environment, generated
    settings = {i.settings for name, i in interactions.items() if name != "sciworld"}
    assert settings == {interactions["webshop"].settings}  # the others take WebShop's settings
    # ... SciWorld all but its timeout (a cold reset or a replay on a fresh JVM takes seconds)
    assert interactions["sciworld"].settings == dataclasses.replace(
        interactions["webshop"].settings, timeout=90.0
    )
    interaction = interactions["webshop"]
    assert isinstance(interaction, WebshopInteraction)
    assert interaction.settings.env_url == "http://10.0.0.1:1234"
    assert interaction.settings.invalid_action_penalty == 0.0


def test_a_row_whose_first_turn_is_another_tasks_is_refused(in_process_env) -> None:
    """WebShop's interaction is the generic one: a row whose first user turn is not what the service shows for its
    goal (rows built for another goal, catalog or version) stops at the first reply instead of training on it."""

    async def main() -> None:
        interaction = make()
        await interaction.start_interaction("w", name="webshop", goal=1500, goal_set="synthetic")
        conversation = reply("Action: search[tea]")
        conversation.insert(1, {"role": "user", "content": "Instruction: a page of another goal"})
        await interaction.generate_response("w", conversation)

    with pytest.raises(ValueError, match="webshop task 1500: the row's first user turn is not what"):
        run(main())
    assert len(EPISODES) == 0
