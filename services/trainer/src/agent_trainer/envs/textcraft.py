"""TextCraft as a spec: AgentGym's TextCraft client's format (prompt in our own words, see docs/training-environments.md),
30 rounds as in AgentGym-RL, reward 1 for crafting the goal item.

The environment (``agent_envs.envs.textcraft``) answers every action with a text and pays 1 (``done``) on the step
that crafts the goal; it has no step limit, so the round budget ends an unsolved episode. Its answers to a refused
action start ``Could not ...`` or ``Wrong item format``; an accepted one ``Got``, ``Crafted`` or ``Inventory:``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from .agentgym import parse_reply
from .spec import EnvSpec, Outcome, Parsed, TrainingRecipe, observation_message, task_index

ENV_ID = "textcraft"
TASKS = 544  # the goals, sorted by crafting depth (the task pool: tasks 0 .. 543)
MAX_ROUNDS = 30  # AgentGym-RL's rounds for TextCraft (its ScalingInter-RL schedule: 10, 20, 30)
#: How the environment's answer to an action it carried out begins (anything else was refused).
ACCEPTED = ("Got ", "Crafted ", "Inventory: ")

SYSTEM_PROMPT = """\
You craft items in a text version of Minecraft. Each task lists some crafting commands and names a goal item: \
craft the goal item.

Each turn, answer with exactly one action:
- get <count> <item>: take a basic item (one no command crafts) from the environment, e.g. get 2 oak logs
- craft <item> using <count> <ingredient>, <count> <ingredient>, ...: craft with one of the listed commands, \
written as it is listed, e.g. craft 4 oak planks using 1 oak logs
- inventory: see what you hold

Use only the crafting commands you are given, and get every ingredient (or craft it) before you use it. Where a \
command names a general ingredient such as "planks", you may use any particular kind of it, such as "dark oak \
planks". Items that a command crafts cannot be got: craft them.

Reply in this format, with one action per reply:
Thought: <your reasoning, briefly>
Action: <the action>

Example.
Crafting commands:
craft 4 spruce planks using 1 spruce logs

Goal: craft spruce planks.
Reply: Thought: The planks need 1 spruce logs, which I can get.
Action: get 1 spruce logs
Observation: Got 1 spruce logs
Reply: Thought: Now I can craft the goal.
Action: craft 4 spruce planks using 1 spruce logs
Observation: Crafted 4 minecraft:spruce_planks"""


def first_message(first: Mapping[str, Any]) -> str:
    """The reset text as it is (``Crafting commands: ... Goal: craft X.``), as AgentGym's client shows it."""
    return str(first.get("observation", ""))


def outcome(result: Mapping[str, Any], parsed: Parsed) -> Outcome:
    reward = float(result.get("reward") or 0.0)
    done = bool(result.get("done"))
    accepted = str(result.get("observation", "")).startswith(ACCEPTED)
    return Outcome(env_reward=reward, done=done, success=done and reward >= 1.0,
                   valid=parsed.well_formed and accepted, finished=done)  # fmt: skip


def split_of(task: int) -> str:
    """The split of a goal: test every 8th (68), val ``task % 16 == 4`` (34), train the other 442; as the goals are
    sorted by crafting depth, every depth is in every split."""
    if task % 8 == 0:
        return "test"
    return "val" if task % 16 == 4 else "train"


#: AgentGym-RL's TextCraft recipe: its training configs (``agent-train configs --write``: :mod:`.overlays`).
RECIPE = TrainingRecipe(
    source="AgentGym-RL's TextCraft settings (examples/train/AgentGym-RL/textcraft_train.sh; "
    "textcraft_wmc_erc_train.sh: the same batch, rounds and lengths)",
    batch_size=32, rollouts=8, mini_batch_size=8, ppo_epochs=2, turn_tokens=512, prompt_tokens=1024,
    response_tokens=10240, test_samples=64, epochs=60, save_freq=25, full_gpu_memory_utilization=0.7,
    first_turn="system prompt (grammar, example) + the recipes and goal (AgentGym-RL: 512; our system prompt "
    "sits in the prompt, AgentGym's in its first user turn)",
)  # fmt: skip

SPEC = EnvSpec(
    env_id=ENV_ID,
    title="TextCraft: craft a Minecraft item from the recipes listed (get, craft, inventory); 544 goals",
    system_prompt=SYSTEM_PROMPT,
    max_rounds=MAX_ROUNDS,
    parse=parse_reply,
    first_message=first_message,
    step_message=observation_message,
    outcome=outcome,
    reward_rule="1 when the goal item is crafted (the episode ends there), else 0",
    success_rule="the goal item was crafted (reward 1)",
    task_of=functools.partial(task_index, env_id=ENV_ID),
    task_count=TASKS,
    split_of=split_of,
    recipe=RECIPE,
)
