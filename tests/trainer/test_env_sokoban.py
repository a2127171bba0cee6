"""Sokoban's trainer spec (``agent_trainer.envs.sokoban``), reached through the environment's registration as an
installed package's spec is (no line in the trainer's ``SPECS``): its prompt, parser,
outcomes and splits, and episodes played turn by turn (``episode.play_turn``, what both verl routes run) against
the real app in process, whose turn scores are gym-sokoban's step rewards."""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

import pytest

pytest.importorskip(
    "agent_trainer", reason="install the trainer: pip install -c constraints.txt -e services/trainer"
)

from agent_trainer import env_data, envs
from agent_trainer.config import InteractionSettings
from agent_trainer.envs import sokoban
from agent_trainer.envs.spec import Parsed
from agent_trainer.episode import Episode, play_turn
from agent_trainer.reward import episode_summary

HAVE_ROOMS = importlib.util.find_spec("gym_sokoban") is not None
needs_rooms = pytest.mark.skipif(not HAVE_ROOMS, reason="gym-sokoban: pip install -e 'services/env[sokoban]'")
SECRET = "k3N9-pQ2_vX7zL4mR8tB-wYc5"


def test_the_spec_comes_from_the_registration_not_the_trainers_tables() -> None:
    from agent_envs.envs import registry

    assert "sokoban" not in envs.SPECS
    assert registry.registration("sokoban").trainer == "agent_trainer.envs.sokoban:SPEC"
    assert envs.plugins()["sokoban"] is envs.get("sokoban") is sokoban.SPEC
    assert "sokoban" in envs.ids() and envs.by_agent_name("sokoban_agent") is sokoban.SPEC
    assert envs.parse_ids("textcraft,sokoban") == ["textcraft", "sokoban"]


def test_the_splits_are_ranges_of_the_10000_rooms() -> None:
    splits = {split: env_data.split_tasks("sokoban", split) for split in env_data.SPLITS}
    assert splits["test"] == list(range(500)) and splits["val"] == list(range(500, 1000))
    assert splits["train"] == list(range(1000, 10_000))
    assert sokoban.SPEC.task_count == 10_000 and sokoban.split_of(1002) == "train"


@needs_rooms
def test_the_pool_and_the_rounds_fit_the_environment() -> None:
    from agent_envs.envs.sokoban import core

    env = core.make()
    assert env.task_count() == sokoban.TASKS and tuple(core.ACTIONS) == sokoban.ACTIONS
    assert max(len(env.expert(task)) for task in range(0, 10_000, 7)) <= sokoban.MAX_ROUNDS


@needs_rooms
def test_the_prompts_example_is_a_real_episode_of_a_training_room() -> None:
    from agent_envs.envs.sokoban import core

    env = core.make()
    first = env.reset(1002)
    example = sokoban.SYSTEM_PROMPT.split("Example.\n", 1)[1]
    assert example.startswith(sokoban.first_message({"observation": first.observation}) + "\nReply: ")
    state, shown = first.state, []
    for action in env.expert(1002):
        transition = env.step(state, action)
        state = transition.state
        shown.append(f"Action: {action}\nObservation:\n{transition.observation}")
    assert all(part in example for part in shown) and example.endswith(shown[-1])
    assert sokoban.split_of(1002) == "train"


@pytest.mark.parametrize(
    ("reply", "parsed"),
    [
        ("Thought: the box is above.\nAction: Up", Parsed("Up", True)),
        ("Action: left.", Parsed("Left", True)),
        ("Action:\n  RIGHT", Parsed("Right", True)),
        ("Action: move up", Parsed("move up", False)),  # sent: the environment answers it as invalid
        ("Action: <answer>Up</answer>", Parsed("answerUpanswer", False)),  # RAGEN's format is not read
        ("I would go up", Parsed("", False)),
        ("Action: Up\nAction: Down", Parsed("", False)),  # sent as an invalid action (never answered locally)
        ("Action: " + "x" * 500, Parsed("x" * sokoban.MAX_SENT_CHARS, False)),
    ],
)
def test_the_parser_reads_one_of_the_four_words(reply: str, parsed: Parsed) -> None:
    assert sokoban.parse(reply) == parsed


def test_outcomes() -> None:
    ok, bad = Parsed("Up", True), Parsed("jump", False)
    step = {"reward": -0.1, "done": False, "info": {"score": -0.3, "success": False, "valid": True}}
    solved = {"reward": 10.9, "done": True, "info": {"score": 10.6, "success": True, "valid": True}}
    truncated = {"reward": -0.1, "done": True, "info": {"score": -10.0, "success": False, "valid": True}}
    noop = {"reward": -0.1, "done": False, "info": {"score": -0.1, "success": False, "valid": False}}
    assert sokoban.outcome(step, ok) == envs.Outcome(-0.3, False, False, True, False)
    assert sokoban.outcome(solved, ok) == envs.Outcome(10.6, True, True, True, True)
    assert sokoban.outcome(truncated, ok) == envs.Outcome(-10.0, True, False, True, True)
    assert not sokoban.outcome(noop, bad).valid and not sokoban.outcome(step, bad).valid


# ---- episodes through the real app ----------------------------------------------------------------------------------
async def _play(task: int, replies: list[str]) -> list[Any]:
    import httpx

    from agent_envs.api.app import create_app, open_runtimes
    from agent_envs.api.settings import Settings
    from agent_envs.client.envs import EnvClient

    app = create_app(Settings(envs="sokoban", state_secret=SECRET, access_log=False))
    open_runtimes(app)
    async with EnvClient("http://sokoban.test", "sokoban", transport=httpx.ASGITransport(app=app)) as client:
        first = await client.reset(task)
        episode, turns = Episode(state=first["state"], goal=task, goal_set=None, split=None), []
        for reply in replies:
            turns.append(await play_turn(sokoban.SPEC, InteractionSettings(), client, episode, reply))
            if turns[-1].done:
                break
        return turns


@needs_rooms
def test_the_experts_episode_pays_gym_sokobans_rewards_turn_by_turn() -> None:
    """Task 1002 (Up, Up): the turn scores are the step rewards (-0.1, then 10.9 for the push onto the target),
    their sum the episode's return, and the reward function reads a success."""
    turns = asyncio.run(_play(1002, ["Thought: push.\nAction: Up", "Thought: again.\nAction: up"]))
    assert [round(float(t.score), 6) for t in turns] == [-0.1, 10.9] and turns[-1].done
    summary = episode_summary([t.score for t in turns])
    assert (summary["success"], summary["env_reward"], round(summary["score"], 6)) == (1.0, 10.8, 10.8)
    assert summary["purchased"] == 1.0 and summary["invalid_actions"] == 0.0


@needs_rooms
def test_unusable_replies_are_invalid_no_op_steps_and_bumps_are_valid() -> None:
    """A bump into a wall is a valid step that moves nothing; an unusable reply (no action, not one of the words,
    several actions) an invalid one: every one a step that costs -0.1, the episode's reward their sum."""
    turns = asyncio.run(
        _play(1002, ["Action: Down", "no action here", "Action: jump", "Action: Up\nAction: Up"])
    )
    assert [t.outcome.valid for t in turns] == [True, False, False, False]
    assert [t.result["info"]["moved"] for t in turns] == [False] * 4
    assert all(t.result["observation"].startswith("Invalid action") for t in turns[1:])
    assert [round(float(t.score), 6) for t in turns] == [-0.1] * 4
    summary = episode_summary([t.score for t in turns])
    assert (summary["success"], summary["env_reward"], summary["steps"]) == (0.0, -0.4, 4.0)
    assert summary["invalid_actions"] == 3.0
