"""Sokoban as a spec: the reply format of the other environments (``Action: <the action>``, prompt in our own
words), 20 rounds, and gym-sokoban's rewards summed over the episode (RAGEN's and verl-agent's episode reward).

The environment (``agent_envs.envs.sokoban``) answers every action with the room (RAGEN's symbols) and pays
gym-sokoban's step rewards: -0.1 a step, +1 for a box pushed onto a target, -1 for one pushed off, +10 when every
box is on a target (``done``, ``info.success``); ``info.score`` is what the episode's step rewards sum to so far.
An action it does not recognise is a no-op step (``info.valid`` false); a move into a wall is a valid step that
moves nothing (``info.moved`` false).

This spec reaches the trainer through the environment's registration (``Registration.trainer``), as an installed
environment package's does: no line in ``SPECS``. Its task pool is the environment's 10,000
rooms, split by ranges (rooms are independent draws of the generator, so ranges are unbiased): test 0-499, val
500-999, train 1000-9999.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from .agentgym import parse_reply
from .spec import EnvSpec, Outcome, Parsed, TrainingRecipe, observation_message, task_index

ENV_ID = "sokoban"
TASKS = 10_000  # the environment's task_count() (agent_envs.envs.sokoban.core.TASKS; tested equal)
TEST_TASKS = 500  # tasks 0-499
VAL_TASKS = 500  # tasks 500-999; the rest are train
MAX_ROUNDS = 20  # every expert plan of the 10,000 rooms fits (at most 13 steps; docs/environments/sokoban.md)
ACTIONS = ("Up", "Down", "Left", "Right")
MAX_SENT_CHARS = 100  # an unrecognised action is sent cut to this (the environment answers it as invalid)
_BY_WORD = {name.lower(): name for name in ACTIONS}
GOAL = "Goal: push the box onto the target."

SYSTEM_PROMPT = """\
You are solving a Sokoban puzzle: push the box onto the target.

The room is a grid of symbols, one row per line:
# wall   _ floor   O target   X box   √ box on the target   P you   S you on the target

Each turn, move one cell with one of the actions:
- Up, Down, Left, Right

Walking into a box pushes it one cell further in the same direction, if the cell behind it is floor or a target. \
You cannot pull a box, push it into a wall or push two boxes at once. A box pushed into a corner can never be \
moved out again, so think before you push. Every move costs a little; the puzzle pays well when the box is on \
the target, and the episode ends there.

Reply in this format, with one action per reply:
Thought: <your reasoning, briefly>
Action: <the action>

Example.
Goal: push the box onto the target.
The room:
######
#_#O_#
#____#
#_#X_#
###P_#
######
Reply: Thought: The box is right above me and the target two cells above it: I push the box up.
Action: Up
Observation:
######
#_#O_#
#__X_#
#_#P_#
###__#
######
Reply: Thought: One more push up puts the box on the target.
Action: Up
Observation:
######
#_#√_#
#__P_#
#_#__#
###__#
######"""


def parse(reply: str) -> Parsed:
    """The action after ``Action:`` as AgentGym's clients read it (``agentgym.parse_reply``: the rest of its line,
    punctuation dropped), then one of the four words, case-insensitive, sent as the environment names it.
    Anything else is an unusable reply (``well_formed`` false) and is sent all the same, cut to ``MAX_SENT_CHARS``
    (a reply with several ``Action:`` as the empty action): the environment answers it as an invalid action, a
    no-op step that costs its -0.1. Never ``action=None`` (a round the client answers itself, as AgentGym's
    TextCraft and BabyAI clients do for several actions): such a round's ``Outcome.not_sent()`` pays an episode
    reward of 0, which would refund Sokoban's step penalties so far."""
    parsed = parse_reply(reply)
    if parsed.action is None:  # several Action: markers
        return Parsed(action="", well_formed=False)
    name = _BY_WORD.get(parsed.action.strip().lower())
    if name is None:
        return Parsed(action=parsed.action[:MAX_SENT_CHARS], well_formed=False)
    return Parsed(action=name, well_formed=True)


def first_message(first: Mapping[str, Any]) -> str:
    """The goal (the rows' ``instruction``) and the room at the start, as the environment renders it."""
    return f"{GOAL}\nThe room:\n{first.get('observation', '')}"


def outcome(result: Mapping[str, Any], parsed: Parsed) -> Outcome:
    """The episode's reward so far is the environment's ``info.score`` (its step rewards summed), so the turn
    scores (each the change of that) are gym-sokoban's step rewards and sum to the episode's return."""
    info = result.get("info") or {}
    done = bool(result.get("done"))
    score = info.get("score")
    reward = float(score if score is not None else result.get("reward") or 0.0)
    success = bool(info.get("success"))
    valid = parsed.well_formed and bool(info.get("valid", True))
    return Outcome(env_reward=reward, done=done, success=success, valid=valid, finished=done)


def split_of(task: int) -> str:
    """test: tasks 0-499; val: 500-999; train: 1000-9999."""
    if task < TEST_TASKS:
        return "test"
    return "val" if task < TEST_TASKS + VAL_TASKS else "train"


#: BabyAI's recipe (AgentGym-RL has none for Sokoban; a 6x6 grid world of the same size of episode): its training
#: configs (``agent-train configs --write``: :mod:`.overlays`).
RECIPE = TrainingRecipe(
    source="BabyAI's batch, rounds and lengths (AgentGym-RL has no Sokoban recipe; a 6x6 grid world of the same "
    "size of episode)",
    batch_size=16, rollouts=8, mini_batch_size=8, turn_tokens=200, prompt_tokens=1024, response_tokens=4096,
    test_samples=32, epochs=10, save_freq=25,
    first_turn="system prompt + the room (6 rows of 6 symbols) and its legend",
)  # fmt: skip

SPEC = EnvSpec(
    env_id=ENV_ID,
    title="Sokoban: push the box onto its target in a 6x6 room (Up, Down, Left, Right); 10,000 rooms",
    system_prompt=SYSTEM_PROMPT,
    max_rounds=MAX_ROUNDS,
    parse=parse,
    first_message=first_message,
    step_message=observation_message,
    outcome=outcome,
    reward_rule="gym-sokoban's step rewards summed: -0.1 a step, +1 per box pushed onto a target (-1 off), +10 "
    "when every box is on a target (the episode ends there); an unsolved episode ends with its sum so far",
    success_rule="every box is on a target (the environment's info.success)",
    task_of=functools.partial(task_index, env_id=ENV_ID),
    task_count=TASKS,
    split_of=split_of,
    recipe=RECIPE,
)
