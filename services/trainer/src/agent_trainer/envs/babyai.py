"""BabyAI as a spec: AgentGym's BabyAI client's format (prompt in our own words, see docs/training-environments.md),
20 rounds as in AgentGym-RL, reward = minigrid's success reward.

The environment (``agent_envs.envs.babyai``) reproduces AgentGym's server, quirks included: minigrid pays
``1 - 0.9 * steps / max_steps`` on the step that reaches the goal (0 when a level ends in failure), the wrapper's
``done`` is forced back to False when that reward is 0.5 or less, and the wrapper's ``score`` adds the last reward
again at every later step (so AgentGym-RL, which trains on the last ``score``, can pay a slow success more than 1).
The trainer does better and keeps it simple:

- an episode ends on the step where minigrid ends the level (``The task is completed.`` in the answer, or the
  environment's ``done``), slow successes and failures included;
- its reward is that step's ``reward``, in (0, 1] for a success and 0 for a failure; an unfinished episode earns 0;
- success is "minigrid ended the level with a positive reward".
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from .agentgym import parse_reply
from .spec import EnvSpec, Outcome, Parsed, TrainingRecipe, observation_message, task_index

ENV_ID = "babyai"
LEVELS = 40  # a task is level ``task % LEVELS`` with seed ``task // LEVELS``
SEEDS = 50  # the task pool: tasks 0 .. LEVELS * SEEDS - 1
MAX_ROUNDS = 20  # AgentGym-RL's rounds for BabyAI (its ScalingInter-RL schedule: 6, 13, 20)
COMPLETED = "The task is completed."
#: How the environment's answer to an action it refused begins (AgentGym's texts).
REFUSED = ("The action is not recognized", "There is a barrier in front of you", "You cannot ")

SYSTEM_PROMPT = """\
You are an agent in a grid world of rooms (BabyAI). You are given a goal, such as "go to the red ball" or \
"open a yellow door", and each turn a description of what you see and the actions available now. Reach the goal \
in as few actions as you can.

The actions (objects and doors are named and numbered as the description and the list of available actions \
name them, e.g. "red ball 1"):
- turn left, turn right, move forward
- go to <object> <n>: walk up to a visible object
- pickup <object> <n>: pick up a key, a ball or a box (you carry one thing at a time)
- drop: put down what you carry, in front of you
- go through <door> <n>: walk through an open door
- toggle and go through <door> <n>: open a closed door and walk through it (a locked door needs a key of its \
color in hand)
- toggle: open or close the door right in front of you
- go to goal
- check available actions: list the actions possible now

Use only actions listed as available. Reply in this format, with one action per reply:
Thought: <your reasoning, briefly>
Action: <the action>"""


def first_message(first: Mapping[str, Any]) -> str:
    """The reset text as it is (``Your goal: ...``, what is seen, ``Available actions: [...]``)."""
    return str(first.get("observation", ""))


def level_ended(result: Mapping[str, Any]) -> bool:
    """minigrid ended the level on this step (success or failure), whatever the wrapper's ``done`` says: the
    environment's ``done``, its ``info.success`` (the service sets it when minigrid terminated the level on this
    step, which a failure does too) or the wrapper's "The task is completed." in the answer."""
    info = result.get("info") or {}
    return (
        bool(result.get("done"))
        or bool(info.get("success"))
        or bool(info.get("terminated"))
        or COMPLETED in str(result.get("observation", ""))
    )


def outcome(result: Mapping[str, Any], parsed: Parsed) -> Outcome:
    info = result.get("info") or {}
    ended = level_ended(result)
    reward = (
        float(result.get("reward") or 0.0) if ended else 0.0
    )  # a kept reward on a later step pays nothing
    if "valid" in info:
        accepted = bool(info["valid"])
    else:
        accepted = not str(result.get("observation", "")).startswith(REFUSED)
    return Outcome(env_reward=reward, done=ended, success=ended and reward > 0.0,
                   valid=parsed.well_formed and accepted, finished=ended)  # fmt: skip


def split_of(task: int) -> str:
    """The split of a task by its seed: test seeds 0-4 (200 tasks, every level 5 times), val seed 5 (every level
    once), train seeds 6-49."""
    seed = task // LEVELS
    return "test" if seed < 5 else "val" if seed == 5 else "train"


#: AgentGym-RL's BabyAI recipe: its training configs (``agent-train configs --write``: :mod:`.overlays`).
RECIPE = TrainingRecipe(
    source="AgentGym-RL's BabyAI settings (examples/train/AgentGym-RL/babyai_train.sh)",
    batch_size=16, rollouts=8, mini_batch_size=8, turn_tokens=200, prompt_tokens=1024, response_tokens=4096,
    test_samples=32, epochs=10, save_freq=25,
    first_turn="system prompt + goal, view and available actions (AgentGym-RL's)",
)  # fmt: skip

SPEC = EnvSpec(
    env_id=ENV_ID,
    title="BabyAI: reach a goal in a grid world of rooms (go to, pick up, open, put next to); 40 levels",
    system_prompt=SYSTEM_PROMPT,
    max_rounds=MAX_ROUNDS,
    parse=parse_reply,
    first_message=first_message,
    step_message=observation_message,
    outcome=outcome,
    reward_rule="minigrid's reward on the step that ends the level: 1 - 0.9 * steps / max_steps (in (0, 1]) on "
    "success, 0 on failure; 0 if the rounds run out first (never AgentGym's running score)",
    success_rule="the level ended with a positive reward",
    task_of=functools.partial(task_index, env_id=ENV_ID),
    task_count=LEVELS * SEEDS,
    split_of=split_of,
    category_label="level",
    recipe=RECIPE,
)
