"""The trainer's environment specs (agent_trainer.envs): AgentGym's client-side action format, what each
environment's answers mean (reward, end, success, validity), prompts, the registry and the turn budget."""

from __future__ import annotations

import pickle

import pytest

pytest.importorskip("verl", reason="the trainer package needs verl: make setup")

from omegaconf import OmegaConf

from agent_trainer import envs
from agent_trainer.envs import babyai, sciworld, textcraft, webshop
from agent_trainer.envs.agentgym import ONE_ACTION_ONLY, clean_action, parse_reply
from agent_trainer.envs.webshop import prompts
from agent_trainer.episode import TurnScore
from agent_trainer.reward import episode_summary


# ---- AgentGym's client-side action format (TextCraft, BabyAI) ------------------------------------------------
@pytest.mark.parametrize(
    ("reply", "action"),
    [
        ("Thought: I need logs.\nAction: get 1 oak logs", "get 1 oak logs"),
        ("Thought:\nI need logs.\n\nAction:\nget 1 oak logs\n", "get 1 oak logs"),  # AgentGym's own layout
        ("Action: craft 4 oak_planks using 1 oak logs.", "craft 4 oakplanks using 1 oak logs"),
        ("Action:   turn    left  \nthen more text", "turn left"),
        ("Action: go to red ball 1\tnow", "go to red ball 1now"),  # a tab is deleted, not a space
        ("Action: get 1 minecraft:oak_log", "get 1 minecraftoaklog"),
    ],
)
def test_the_action_is_the_line_after_the_marker_cleaned_as_the_client_cleans_it(
    reply: str, action: str
) -> None:
    parsed = parse_reply(reply)
    assert parsed == envs.Parsed(action=action, well_formed=True)


def test_several_markers_are_answered_by_the_client_and_nothing_is_sent() -> None:
    parsed = parse_reply("Action: get 1 oak logs\nAction: inventory")
    assert parsed.action is None and not parsed.well_formed and parsed.feedback == ONE_ACTION_ONLY


@pytest.mark.parametrize(
    "reply", ["I will get some logs.", "Action:", "Action: ...!!", "action: get 1 oak logs", ""]
)
def test_no_usable_action_sends_the_empty_action_and_is_not_well_formed(reply: str) -> None:
    parsed = parse_reply(reply)
    assert parsed.action == "" and not parsed.well_formed and parsed.feedback is None


def test_clean_action_keeps_only_letters_digits_commas_and_spaces() -> None:
    assert clean_action("  craft 1 stick using 2 bamboo,  ") == "craft 1 stick using 2 bamboo,"
    assert clean_action("pick-up «red» ball #1") == "pickup red ball 1"


# ---- outcomes ----------------------------------------------------------------------------------------------
OK = envs.Parsed(action="x", well_formed=True)
BAD = envs.Parsed(action="", well_formed=False)


@pytest.mark.parametrize(
    ("observation", "reward", "done", "valid", "success"),
    [
        ("Got 1 spruce logs", 0.0, False, True, False),
        ("Inventory: [spruce logs] (1) ", 0.0, False, True, False),
        ("Crafted 1 minecraft:stick", 0.0, False, True, False),
        ("Crafted 4 minecraft:spruce_planks", 1.0, True, True, True),
        ("Could not find spruce planks", 0.0, False, False, False),
        ("Could not execute look", 0.0, False, False, False),
        ("Wrong item format: ", 0.0, False, False, False),
    ],
)
def test_textcraft_outcomes(observation: str, reward: float, done: bool, valid: bool, success: bool) -> None:
    result = {"observation": observation, "reward": reward, "done": done, "info": {}}
    outcome = textcraft.outcome(result, OK)
    assert (outcome.env_reward, outcome.done, outcome.valid, outcome.success) == (
        reward,
        done,
        valid,
        success,
    )
    assert not textcraft.outcome(result, BAD).valid  # an empty or missing action is never a valid round


ACTIONS = '\nAvailable actions: ["turn left", "turn right", "check available actions"]'


@pytest.mark.parametrize(
    ("observation", "reward", "done", "ended", "success", "valid"),
    [
        ("You are not carrying anything." + ACTIONS, 0.0, False, False, False, True),
        ("You are not carrying anything.\n The task is completed." + ACTIONS, 0.91, True, True, True, True),
        # a slow success: AgentGym's wrapper keeps done False (reward <= 0.5); the trainer ends and pays it
        ("You are not carrying anything.\n The task is completed." + ACTIONS, 0.38, False, True, True, True),
        # a level ended in failure: minigrid pays 0
        ("You are not carrying anything.\n The task is completed." + ACTIONS, 0.0, False, True, False, True),
        # after a slow success AgentGym keeps the last reward on later steps: not paid again
        (
            "You can take the following actions: turn left, turn right" + ACTIONS,
            0.38,
            False,
            False,
            False,
            True,
        ),
        (
            "The action is not recognized. Please check valid actions." + ACTIONS,
            0.0,
            False,
            False,
            False,
            False,
        ),
        (
            "There is a barrier in front of you, you can't move forward." + ACTIONS,
            0.0,
            False,
            False,
            False,
            False,
        ),
        (
            "You cannot pickup red ball 1, as there is no path leading to it." + ACTIONS,
            0,
            False,
            False,
            False,
            False,
        ),
    ],
)
def test_babyai_outcomes(
    observation: str, reward: float, done: bool, ended: bool, success: bool, valid: bool
) -> None:
    result = {"observation": observation, "reward": reward, "done": done, "info": {"score": reward}}
    outcome = babyai.outcome(result, OK)
    assert (outcome.done, outcome.success, outcome.valid) == (ended, success, valid)
    assert outcome.env_reward == (reward if ended else 0.0)


def test_babyai_reads_the_services_info_flags() -> None:
    """agent_envs.envs.babyai sends ``info.valid`` and ``info.success`` (minigrid terminated the level this step)."""
    slow = {"observation": "x", "reward": 0.38, "done": False, "info": {"success": True, "valid": True}}
    assert babyai.outcome(slow, OK).success and babyai.outcome(slow, OK).env_reward == 0.38
    failed = {"observation": "x", "reward": 0.0, "done": False, "info": {"success": True, "valid": True}}
    assert babyai.outcome(failed, OK).done and not babyai.outcome(failed, OK).success
    refused = {"observation": "There is a barrier in front of you", "reward": 0.0, "done": False,
               "info": {"success": False, "valid": True}}  # fmt: skip
    assert babyai.outcome(refused, OK).valid  # the service's own word wins over the text
    assert not babyai.outcome({**refused, "info": {"valid": False}}, OK).valid


@pytest.mark.parametrize(
    ("score", "done", "reward", "success"),
    [
        (0, False, 0.0, False),
        (25, False, 0.25, False),
        (75, True, 0.75, False),  # the move limit ended it with partial credit: paid, not a success
        (100, True, 1.0, True),
        (-100, True, 0.0, False),  # a wrong focus fails the task: worth no more than nothing
    ],
)
def test_sciworld_score_maps_to_reward_and_success(
    score: int, done: bool, reward: float, success: bool
) -> None:
    result = {"observation": "You move to the kitchen.", "reward": 0, "done": done, "info": {"score": score}}
    outcome = sciworld.outcome(result, OK)
    assert (outcome.env_reward, outcome.success, outcome.done) == (reward, success, done)


def test_sciworld_parser_and_first_turn_are_its_clients() -> None:
    assert sciworld.parse("Thought: go.\nAction: go to kitchen \n") == envs.Parsed("go to kitchen", True)
    assert sciworld.parse("Action: a\nAction: open door to kitchen") == envs.Parsed(
        "open door to kitchen", True
    )
    assert not sciworld.parse("look around").well_formed
    first = {
        "observation": "This room is called the hallway.",
        "info": {"task_description": "Your task is to boil water."},
    }
    assert sciworld.first_message(first) == "Your task is to boil water.\nThis room is called the hallway."
    refused = {
        "observation": "No known action matches that input.",
        "reward": 0,
        "done": False,
        "info": {"score": 0},
    }
    assert not sciworld.outcome(refused, OK).valid


def test_webshop_spec_is_todays_prompts_and_parser() -> None:
    spec = envs.get("webshop")
    assert spec.system_prompt == prompts.SYSTEM_PROMPT and spec.agent_name == "webshop_agent"
    assert spec.parse("Action: click[Buy Now]") == envs.Parsed("click[Buy Now]", True)
    assert spec.parse("no idea") == envs.Parsed(webshop.UNPARSEABLE_ACTION, False)
    page = {
        "observation": "WebShop [SEP] Search",
        "available_actions": {"has_search_bar": True, "clickables": []},
    }
    outcome = spec.outcome({**page, "reward": 0.0, "done": False, "info": {"valid": True}}, OK)
    assert spec.step_message(page, OK, outcome, 0) == prompts.step_message(
        page["observation"], page["available_actions"], action="x", valid=True
    )
    assert spec.step_message(page, spec.parse("no idea"), outcome, 0).startswith(
        prompts.INVALID_REPLY_MESSAGE
    )
    bought = spec.outcome({"reward": 1.0, "done": True, "info": {"reward_info": {}}}, OK)
    truncated = spec.outcome({"reward": 0.0, "done": True, "info": {"truncated": True}}, OK)
    assert bought.success and bought.finished and not truncated.finished and not truncated.success


# ---- registry, prompts, budgets --------------------------------------------------------------------------------
def test_each_environment_has_its_own_agent_name_data_source_and_prompt() -> None:
    # sokoban: the spec its registration names (no line in SPECS)
    assert envs.ids() == ["webshop", "textcraft", "babyai", "sciworld", "sokoban"]
    specs = [envs.get(i) for i in envs.ids()]
    assert len({s.agent_name for s in specs}) == len({s.system_prompt for s in specs}) == len(specs)
    assert [s.data_source for s in specs] == envs.ids()
    assert (
        envs.by_agent_name("babyai_agent") is envs.get("babyai") and envs.by_agent_name("tool_agent") is None
    )
    for spec in specs[1:]:  # AgentGym's reply format, which the parsers read
        assert "Action: <the action>" in spec.system_prompt
    with pytest.raises(envs.UnknownEnvironment, match="webshop, textcraft"):
        envs.get("alfworld")
    assert envs.parse_ids(" textcraft, babyai ") == ["textcraft", "babyai"]
    with pytest.raises(envs.UnknownEnvironment, match="twice"):
        envs.parse_ids("textcraft,textcraft")


def test_the_textcraft_prompts_example_is_a_real_episode() -> None:
    """The worked example in the system prompt is what the environment answers (task 101)."""
    core = pytest.importorskip("agent_envs.envs.textcraft").make()
    first = core.reset(101)
    assert first.observation in textcraft.SYSTEM_PROMPT
    state = first.state
    for line in textcraft.SYSTEM_PROMPT.split("Reply: ")[1:]:
        action = parse_reply(line.split("\nObservation: ")[0]).action
        step = core.step(state, action)
        assert f"Observation: {step.observation}" in line
        state = step.state
    assert step.done and step.reward == 1.0


def test_task_index_reads_aliases_and_refuses_what_is_not_a_task() -> None:
    task_of = envs.get("textcraft").task_of
    assert (
        task_of({"task": 12}) == task_of({"item_id": "textcraft_12"}) == task_of({"session_id": "12"}) == 12
    )
    with pytest.raises(envs.TaskError, match="no task"):
        task_of({"goal_set": "x"})
    with pytest.raises(envs.TaskError, match="not a task index"):
        task_of({"task": "twelve"})
    assert envs.get("webshop").task_of({"goal": "webshop_7"}) == 7


@pytest.mark.parametrize(
    ("env_id", "config", "expected"),
    [
        ("textcraft", {}, 30),
        ("babyai", {}, 20),
        ("sciworld", {}, 20),
        ("webshop", {}, 24),  # the guides' 25 assistant turns, the last one never played
        ("textcraft", {"environments": {"textcraft": {"max_rounds": 12}}}, 12),  # the run's file wins
        (
            "textcraft",
            {"environments": {"babyai": {"max_rounds": 12}}},
            30,
        ),  # another environment's: not this one's
        ("textcraft", {"environments": {"textcraft": {"turn_tokens": 64}}}, 30),
        ("webshop", {"environments": {"webshop": {"max_rounds": 4}}}, 4),
        # verl's turn limit bounds the 0.7.1 path; it is no episode length of its own
        ("webshop", {"actor_rollout_ref": {"rollout": {"multi_turn": {"max_assistant_turns": 9}}}}, 24),
    ],
)
def test_the_episode_rounds_are_the_specs_unless_the_training_config_overrides_them(
    env_id: str, config: dict, expected: int
) -> None:
    from agent_trainer.turns import episode_rounds

    assert episode_rounds(envs.get(env_id), OmegaConf.create(config)) == expected


def test_rounds_that_are_not_a_positive_integer_are_refused() -> None:
    import dataclasses

    from agent_trainer.turns import episode_rounds

    zero = OmegaConf.create({"environments": {"babyai": {"max_rounds": 0}}})
    with pytest.raises(ValueError, match=r"babyai: max_rounds = 0 \(environments\.babyai\.max_rounds"):
        episode_rounds(envs.get("babyai"), zero)
    for rounds in (None, 0, True):  # a spec must say its episode length: no derived or missing value
        with pytest.raises(ValueError, match="spec: max_rounds"):
            dataclasses.replace(envs.get("textcraft"), max_rounds=rounds)


# ---- the episode's metrics from the loop's turn scores ---------------------------------------------------------
def test_the_last_turn_holds_the_reward_and_success_whatever_ended_the_episode() -> None:
    # SciWorld: 25, 50, then the round budget ends it: paid 0.5 in increments, no success
    turns = [TurnScore(0.25, env_reward=0.25, success=False), TurnScore(0.25, env_reward=0.5, success=False),
             TurnScore(0.0, invalid=True, env_reward=0.5, success=False)]  # fmt: skip
    summary = episode_summary(turns)
    assert summary["score"] == summary["env_reward"] == 0.5 and summary["success"] == 0.0
    assert summary["steps"] == 3 and summary["invalid_rate"] == pytest.approx(1 / 3)
    # BabyAI: a slow success pays less than 1 and still counts as solved
    solved = episode_summary([TurnScore(0.0, success=False), TurnScore(0.38, done=True, env_reward=0.38,
                                                                        purchased=True, success=True)])  # fmt: skip
    assert solved["success"] == 1.0 and solved["env_reward"] == 0.38 and solved["purchased"] == 1.0
    assert pickle.loads(pickle.dumps(turns[-1])).success is False
